"""The vendored tree and its recorded state: move it between series positions, refresh patches, verify."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from forktool import backup as bk
from forktool import output, txn, vendor
from forktool.apply import Applied, apply_patch, apply_series
from forktool.errors import ApplyError, ConfigError, DirtyTreeError, ForktoolError, UsageError, VerifyError
from forktool.impact import impact_label
from forktool.markers import hooks_in_patch
from forktool.project import Project
from forktool.series import (
    Patch,
    SeriesEntry,
    diff_file,
    make_header,
    parse_patch,
    read_series,
    set_trailers,
    with_files,
)
from forktool.tree import (
    REGULAR,
    SYMLINK,
    Entry,
    Manifest,
    atomic_write,
    diff_manifests,
    digest,
    resolve_inside,
    scan,
    sha256_bytes,
)

STATE_VERSION = 1


@dataclass
class State:
    pristine_digest: str = ""
    applied: list[dict] = field(default_factory=list)  # {id, name, sha256, drift}
    files: dict[str, Entry | None] = field(default_factory=dict)  # touched paths after the applied patches

    def to_json(self) -> dict:
        return {"version": STATE_VERSION, "pristine_digest": self.pristine_digest, "applied": self.applied,
                "files": {p: (e.to_json() if e else None) for p, e in sorted(self.files.items())}}

    @classmethod
    def from_json(cls, raw: dict) -> State:
        return cls(raw.get("pristine_digest", ""), list(raw.get("applied", [])),
                   {p: (Entry(v[0], v[1]) if v else None) for p, v in raw.get("files", {}).items()})

    @property
    def top(self) -> str | None:
        return self.applied[-1]["id"] if self.applied else None


def load_patches(project: Project, entries: list[SeriesEntry]) -> list[Patch]:
    out = []
    for e in entries:
        p = project.patches_dir / e.name
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"patches/series names {e.name}, which does not exist", where=f"patches/series:{e.line}",
                              hint="add the file or remove the line") from None
        out.append(parse_patch(data, e.name))
    return out


def series_digest(patches: list[Patch]) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(f"{p.name} {p.sha256}\n".encode())
    return h.hexdigest()


class Workspace:
    """One project's vendored tree, pristine manifest and state, opened under the project lock."""

    def __init__(self, project: Project):
        self.project = project
        self.tree = project.tree
        self.state_dir = project.state_dir
        self.entries = read_series(project.series_file)
        self.patches = load_patches(project, self.entries)
        self.pristine, self.pristine_digest = vendor.read_pristine(project)
        self.store = vendor.objects(project)
        self.state = self._load_state()

    # ------------------------------------------------------------ state

    def _load_state(self) -> State:
        p = self.state_dir / "state.json"
        if not p.is_file():
            return State(self.pristine_digest)
        try:
            st = State.from_json(json.loads(p.read_text()))
        except (json.JSONDecodeError, KeyError, TypeError, IndexError) as e:
            raise ForktoolError(f"{p} is unreadable: {e}", where=str(p),
                                hint="restore the newest backup (`forktool backup restore NAME`)") from e
        if st.pristine_digest != self.pristine_digest and self.tree.exists():
            raise ForktoolError("the vendored tree was made from another upstream than vendor.lock pins",
                                where=str(self.tree), hint="run `forktool unapply` on the old pin, or remove "
                                "vendor/llamafile and run `forktool apply` to start from the new pin")
        return st

    def patch(self, pid: str) -> Patch:
        for p in self.patches:
            if p.id == pid:
                return p
        raise UsageError(f"no patch {pid} in patches/series", where="patches/series",
                         hint="ids are the four digits of the patch name; `forktool status` lists them")

    def index(self, pid: str) -> int:
        return self.patches.index(self.patch(pid))

    def expected(self) -> Manifest:
        """What the tree should hold according to the recorded state."""
        m = dict(self.pristine)
        for p, e in self.state.files.items():
            if e is None:
                m.pop(p, None)
            else:
                m[p] = e
        return m

    def base_bytes(self, rel: str) -> bytes | None:
        return vendor.pristine_bytes(self.project, self.pristine, rel)

    def disk_bytes(self, rel: str) -> bytes | None:
        p = resolve_inside(self.tree, rel, "vendored tree")
        if p.is_symlink():
            return os.readlink(p).encode()
        try:
            return p.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def local_changes(self, current: Manifest | None = None) -> list[tuple[str, str]]:
        return diff_manifests(self.expected(), scan(self.tree) if current is None else current)

    def applied_stale(self) -> list[str]:
        """Applied patch ids whose file changed (or left the series) since they were applied."""
        now = {p.id: p.sha256 for p in self.patches}
        return [a["id"] for a in self.state.applied if now.get(a["id"]) != a["sha256"]]

    # ------------------------------------------------------------ moving the tree

    def compute(self, patches: list[Patch]) -> Applied:
        return apply_series(patches, self.base_bytes)

    def goto(self, target: list[Patch], *, force: bool, label: str) -> dict:
        """Make the tree hold pristine + target, all or nothing, writing only files whose bytes change."""
        fresh = not self.tree.exists()
        if fresh:
            with output.step("materialising the pristine tree"):
                vendor.materialise(self.project, self.pristine)
            self.state = State(self.pristine_digest)
            self._write_state()
        current = scan(self.tree)
        dirty = self.local_changes(current)
        if dirty and not force:
            raise DirtyTreeError(
                f"the vendored tree has {len(dirty)} change(s) that no patch explains",
                where=str(self.tree), details=[f"{s}: {p}" for s, p in dirty[:50]],
                hint="keep them with `forktool new SLUG` + `forktool refresh ID`, or pass --force to back them "
                     "up and overwrite them")
        with output.step(f"applying {len(target)} patch(es) in memory"):
            result = self.compute(target)
        paths = set(result.files) | set(self.state.files) | {p for _, p in dirty}
        writes: list[txn.Write] = []
        new_files: dict[str, Entry | None] = {}
        for rel in sorted(paths):
            want = result.files[rel] if rel in result.files else self.base_bytes(rel)
            mode = self.pristine[rel].mode if rel in self.pristine else REGULAR
            if rel in result.files:
                new_files[rel] = Entry(sha256_bytes(want), mode) if want is not None else None
            have = current.get(rel)
            want_entry = Entry(sha256_bytes(want), mode) if want is not None else None
            if have != want_entry:
                writes.append(txn.Write(rel, want, mode))
        applied = [{"id": p.id, "name": p.name, "sha256": p.sha256, "diff_sha256": p.diff_sha256,
                    "drift": [d.to_json() for d in result.drift.get(p.id, [])]} for p in target]
        new_state = State(self.pristine_digest, applied, new_files)
        backup_name = None
        if writes or new_state.to_json() != self.state.to_json():
            if writes and not fresh:
                b = bk.create(self.project.backups_dir, self.tree, label, f"before {label}", current,
                              self.pristine, self.state.to_json())
                backup_name = b.name
            txn.commit(self.tree, self.state_dir, writes, new_state.to_json())
            self.state = new_state
        return {"written": [w.path for w in writes], "backup": backup_name, "forced": [p for _, p in dirty],
                "drift": [d.to_json() for p in target for d in result.drift.get(p.id, [])]}

    def _write_state(self) -> None:
        atomic_write(self.state_dir / "state.json", json.dumps(self.state.to_json(), indent=1, sort_keys=True).encode())

    def restore(self, name: str) -> dict:
        path = bk.find(self.project.backups_dir, name)
        manifest, contents, saved_state = bk.load_for_restore(path, self.store.get)
        current = scan(self.tree)
        writes = []
        for rel in sorted(set(manifest) | set(current)):
            if manifest.get(rel) != current.get(rel):
                e = manifest.get(rel)
                writes.append(txn.Write(rel, contents.get(rel), e.mode if e else REGULAR))
        b = None
        if writes:
            b = bk.create(self.project.backups_dir, self.tree, f"restore-{name[16:] or name}",
                          f"before restoring {name}", current, self.pristine, self.state.to_json())
        state = State.from_json(saved_state) if saved_state else State(self.pristine_digest)
        txn.commit(self.tree, self.state_dir, writes, state.to_json())
        self.state = state
        return {"written": [w.path for w in writes], "backup": b.name if b else None, "restored": name}

    # ------------------------------------------------------------ patches from the tree

    def export(self, patch: Patch, before: Applied, after_read) -> Patch:
        """The patch regenerated from tree contents, keeping its message; paths = its own + extra."""
        files = []
        for rel in patch.paths:
            old = before.files[rel] if rel in before.files else self.base_bytes(rel)
            new = after_read(rel)
            mode = self.pristine[rel].mode if rel in self.pristine else REGULAR
            fd = diff_file(rel, old, new, mode, mode)
            if fd is not None:
                files.append(fd)
        return with_files(patch, files)

    def refresh(self, pid: str) -> dict:
        if self.state.top != pid:
            raise UsageError(f"patch {pid} is not the top applied patch (top: {self.state.top or 'none'})",
                             where=str(self.tree), hint=f"run `forktool apply --upto {pid}` first, edit, then refresh")
        idx = self.index(pid)
        patch = self.patches[idx]
        stale = self.applied_stale()
        if pid in stale and self.state.applied[-1].get("diff_sha256") == patch.diff_sha256:
            stale.remove(pid)  # only its message was edited: refresh keeps the new message
        if stale:
            raise ForktoolError(f"applied patch(es) {', '.join(stale)} changed on disk since they were applied",
                                where="patches/", hint="run `forktool apply --upto ID` to re-apply them first")
        before = self.compute(self.patches[:idx])
        current = scan(self.tree)
        changed = {p for _, p in self.local_changes(current)}
        for rel in sorted(changed):
            e = current.get(rel)
            if e is not None and e.mode == SYMLINK:
                raise ForktoolError(f"{rel} is a symlink; patches carry regular files only", where=rel)
        rels = sorted(set(patch.paths) | changed)
        files_diff = []
        for rel in rels:
            old = before.files[rel] if rel in before.files else self.base_bytes(rel)
            new = self.disk_bytes(rel)
            old_mode = self.pristine[rel].mode if rel in self.pristine else REGULAR
            new_mode = current[rel].mode if rel in current else old_mode
            fd = diff_file(rel, old, new, old_mode if old is not None else None,
                           new_mode if new is not None else None)
            if fd is not None:
                files_diff.append(fd)
        diff_only = with_files(patch, files_diff)
        trailers = {"Opencoti-Hooks": ", ".join(hooks_in_patch(diff_only)),
                    "Build-Impact": impact_label(self.project, diff_only.paths) if diff_only.paths else ""}
        refreshed = with_files(replace(diff_only, header=set_trailers(patch.header, trailers)), files_diff)
        old_bytes = patch.raw
        new_bytes = refreshed.raw
        if new_bytes != old_bytes:
            atomic_write(self.project.patches_dir / patch.name, new_bytes)
        self.patches[idx] = parse_patch(new_bytes, patch.name)
        # the tree already holds the refreshed result: record it as applied
        files = {rel: current.get(rel) for rel in set(self.state.files) | set(rels)}
        self.state.applied[-1] = {"id": pid, "name": patch.name, "sha256": self.patches[idx].sha256,
                                  "diff_sha256": self.patches[idx].diff_sha256, "drift": []}
        self.state.files = files
        self._write_state()
        self.record_patched()
        return {"patch": patch.name, "changed": new_bytes != old_bytes, "files": refreshed.paths,
                "hooks": trailers["Opencoti-Hooks"], "build_impact": trailers["Build-Impact"]}

    def new(self, slug: str, title: str, author: str, want: str | None = None) -> dict:
        if not re.match(r"^[a-z0-9][a-z0-9._-]*$", slug):
            raise UsageError(f"bad slug {slug!r}", hint="use lowercase letters, digits, '-', '.', '_'")
        top = self.state.top
        pos = self.index(top) + 1 if top else 0
        ids = {int(p.id) for p in self.patches}
        lo = int(top) if top else 0
        hi = int(self.patches[pos].id) if pos < len(self.patches) else 10000
        # the series, not the number, gives the order: with no room between the neighbours, take the
        # next number after the highest one
        free = [n for n in range(lo + 1, hi) if n not in ids] or [max(ids) + 1]
        if free[0] > 9999:
            raise ForktoolError("no free patch id left", where="patches/series", hint="renumber the series")
        pid = f"{free[0]:04d}"
        if want is not None:
            if not re.match(r"^\d{4}$", want) or want in {p.id for p in self.patches}:
                raise UsageError(f"--id {want} is not a free four-digit id", where="patches/series",
                                 hint=f"the next free one after the top is {pid}")
            pid = want
        name = f"{pid}-{slug}.patch"
        header = make_header(title or slug, author=author,
                             date=time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime()))
        data = header + b"---\n"
        atomic_write(self.project.patches_dir / name, data)
        lines = self.project.series_file.read_text().splitlines(keepends=True)
        insert_after = self.entries[pos - 1].line if pos else 0
        # keep comments where they are: insert right after the line of the current top
        if pos == 0:
            first = next((e.line for e in self.entries), len(lines) + 1)
            insert_at = first - 1
        else:
            insert_at = insert_after
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines.insert(insert_at, name + "\n")
        atomic_write(self.project.series_file, "".join(lines).encode())
        patch = parse_patch(data, name)
        self.state.applied.append({"id": pid, "name": name, "sha256": patch.sha256,
                                   "diff_sha256": patch.diff_sha256, "drift": []})
        self._write_state()
        return {"patch": name, "id": pid, "after": top}

    # ------------------------------------------------------------ verify

    def verify(self) -> dict:
        problems: list[str] = []
        problems += [f"pristine: {p}" for p in vendor.verify_pristine_cache(self.project)]
        current = scan(self.tree)
        for s, p in self.local_changes(current):
            problems.append(f"tree: {s} {p} (no patch explains it)")
        for pid in self.applied_stale():
            problems.append(f"patch {pid}: file changed since it was applied; run `forktool apply`")
        applied_ids = [a["id"] for a in self.state.applied]
        prefix_ids = [p.id for p in self.patches[:len(applied_ids)]]
        if applied_ids != prefix_ids:
            problems.append(f"applied patches {applied_ids} are not a prefix of the series")
        n = len(applied_ids)
        exported = 0
        try:
            # the top patch is exported from the tree on disk, the ones below it from the computed series
            for _, patch, again in self._reexports(n, top_from_disk=True):
                exported += 1
                if again.raw == patch.raw:
                    continue
                problems.append(f"patch {patch.id}: exporting it from the tree does not reproduce patches/{patch.name} "
                                f"byte for byte (run `forktool refresh {patch.id}` to see the canonical form)")
        except ApplyError as e:
            problems.append(f"{e.where}: does not apply: {e.what}")
        tree_digest = digest(current)
        lock = vendor.load_lock(self.project)
        rec = lock.get("patched", {})
        full = n == len(self.patches) and n > 0
        sd = series_digest(self.patches)
        if full:
            if rec.get("series_digest") != sd:
                problems.append("vendor.lock records no patched digest for this series; "
                                "run `forktool apply` to record it")
            elif rec.get("tree_digest") != tree_digest:
                problems.append(f"patched tree digest {tree_digest[:12]} differs from vendor.lock "
                                f"({rec.get('tree_digest', '')[:12]})")
        result = {"ok": not problems, "problems": problems, "applied": applied_ids, "exported": exported,
                  "tree_digest": tree_digest, "series_digest": sd, "full_series": full}
        if problems:
            raise VerifyError(f"verify found {len(problems)} difference(s)", where=str(self.project.root),
                              details=problems, hint="fix each item, then run `forktool verify` again")
        return result

    def reanchor(self, end: int) -> list[str]:
        """Canonical re-exports of patches[:end] on the base they now apply to, in memory.

        After a lower patch changes, a later one may apply only at an offset, or its index lines name
        blobs that no longer exist: its content is the same, its canonical bytes are not. This rewrites
        the in-memory patches (message kept, diff re-exported) and returns the ids that changed; the
        caller moves the tree first and writes the files after, so a failed apply writes nothing.
        """
        changed = []
        for k, patch, again in list(self._reexports(end)):
            if again.raw != patch.raw:
                self.patches[k] = parse_patch(again.raw, patch.name)
                changed.append(patch.id)
        return changed

    def _reexports(self, end: int, top_from_disk: bool = False) -> Iterator[tuple[int, Patch, Patch]]:
        """(index, patch, the patch exported again) for patches[:end], applied one by one from pristine."""
        acc = Applied()
        for k, patch in enumerate(self.patches[:end]):
            before = Applied(dict(acc.files))
            apply_patch(patch, self.base_bytes, acc)
            if top_from_disk and k == end - 1:
                read = self.disk_bytes
            else:
                def read(rel: str, a: Applied = acc) -> bytes | None:
                    return a.files[rel] if rel in a.files else self.base_bytes(rel)
            yield k, patch, self.export(patch, before, read)

    def write_patches(self, ids: list[str]) -> None:
        for p in self.patches:
            if p.id in ids:
                atomic_write(self.project.patches_dir / p.name, p.raw)

    def record_patched(self) -> bool:
        """Write the full series' tree digest to vendor.lock when the series changed; True when written."""
        if len(self.state.applied) != len(self.patches) or not self.patches:
            return False
        lock = vendor.load_lock(self.project)
        sd = series_digest(self.patches)
        if lock.get("patched", {}).get("series_digest") == sd:
            return False
        lock["patched"] = {"series_digest": sd, "tree_digest": digest(scan(self.tree)),
                           "top": self.patches[-1].id}
        vendor.write_lock(self.project, lock)
        return True


@contextmanager
def open_workspace(project: Project) -> Iterator[Workspace]:
    with txn.locked(project.state_dir):
        note = txn.recover(project.tree, project.state_dir)
        if note:
            output.warn(note)
        _refuse_during_sync(project)
        yield Workspace(project)


def _refuse_during_sync(project: Project) -> None:
    """The tree belongs to a stopped `forktool sync` until it is continued or aborted."""
    path = project.state_dir / "sync" / "state.json"
    if not path.is_file():
        return
    try:
        st = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        st = {"stage": "unreadable", "to_spec": "?"}
    backups = st.get("backups") or {}
    here = (project.backups_dir / str(backups.get("tree", ""))).is_dir() if backups else False
    if st.get("stage") in ("starting", "stopped", "finishing", "unreadable") and here:
        raise ForktoolError(f"a sync to {st.get('to_spec')} is in progress ({st.get('stage')}); the vendored tree "
                            "belongs to it", where=str(path), hint="run `forktool sync --continue`, `--skip` or "
                            "`--abort` first (`forktool status` shows where it stands)")
