"""One project's snapshot under the lock (series, patches, pristine, state, tree manifest) and moving the tree."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from forktool import backup as bk
from forktool import cache, schema, txn, vendor
from forktool.apply import Applied, Drift, apply_series
from forktool.cache import Cache, Memo, caches_root, code_stamp, key_of
from forktool.errors import DirtyTreeError, ForktoolError, UsageError
from forktool.index import scan_indexed
from forktool.project import Project
from forktool.series import (
    Patch,
    SeriesEntry,
    from_plain,
    parse_patch,
    read_series,
    series_digest_of,
    to_plain,
)
from forktool.state import State, load_state, save_state
from forktool.store import ObjectStore
from forktool.tree import (
    REGULAR,
    Entry,
    Manifest,
    atomic_write,
    check_root,
    diff_manifests,
    digest,
    resolve_inside,
    scan,
    sha256_bytes,
)

Progress = Callable[[str], None]


def load_patches(project: Project, entries: list[SeriesEntry], use_cache: bool = True) -> list[Patch]:
    """The series' patches, read and parsed; a patch parsed before (the same name and bytes, the same parser)
    comes from its memo."""
    memo = Memo(caches_root(project.state_dir, use_cache), "patch")
    out = []
    for e in entries:
        p = project.patches_dir / e.name
        data = schema.read_regular(p, f"patches/{e.name} (patches/series:{e.line})", schema.PATCH_LIMIT,
                                   project.root, "add the file or remove the line from patches/series",
                                   where=f"patches/series:{e.line}")
        key = key_of("patch", _parser_stamp(), e.name, sha256_bytes(data))
        plain = memo.get(key)
        try:
            if plain is not None:
                out.append(from_plain(plain, data))
                continue
        except (TypeError, ValueError):
            pass
        patch = parse_patch(data, e.name)
        memo.put(key, to_plain(patch))
        out.append(patch)
    return out


def _parser_stamp() -> list[object]:
    from forktool import series

    return code_stamp(series)


series_digest = series_digest_of  # the series digest's one home is forktool.series


class Workspace:
    """One project's snapshot, read once under the project lock: series, patches, pristine manifest, state, and
    (on first use) the tree manifest from the stat index. Only goto/restore move the tree, through the journal."""

    def __init__(self, project: Project, *, use_cache: bool = True, progress: Progress | None = None):
        self.project = project
        self.tree = project.tree
        self.state_dir = project.state_dir
        self.use_cache = use_cache
        self.progress: Progress = progress or (lambda _m: None)
        # a command that opens the project stands on all of it, even the parts it would not read: a pin that does not
        # parse and a tree root that is not a directory are refused here, before anything is written
        project.vendor  # noqa: B018 -- read and schema-checked here, remembered on the project
        check_root(project.tree)
        self.entries = read_series(project.series_file)
        self.patches = load_patches(project, self.entries, use_cache)
        self.pristine, self.pristine_digest = vendor.read_pristine(project, use_cache)
        self.store = vendor.objects(project)
        self.state = load_state(self.state_dir, self.pristine_digest, self.tree)
        schema.check_state_covers(self.state_dir / "state.json", self.state.applied, self.state.files,
                                  {q.id: q for q in self.patches})
        self._current: Manifest | None = None

    # ------------------------------------------------------------ the snapshot

    def current(self) -> Manifest:
        """The tree's manifest now (read once; the stat index spares re-hashing files whose stat is unchanged)."""
        if self._current is None:
            if self.use_cache:
                self._current, _hashed = scan_indexed(self.tree, self.state_dir / "index")
            else:
                self._current = scan(self.tree)
        return self._current

    def tree_moved(self) -> None:
        """Forget the tree manifest after a write to the tree."""
        self._current = None

    def _write_state(self) -> None:
        save_state(self.state_dir, self.state)

    def patch(self, pid: str) -> Patch:
        for p in self.patches:
            if p.id == pid:
                return p
        raise UsageError(f"no patch {pid} in patches/series", where="patches/series",
                         hint="ids are the four digits of the patch name; `forktool status` lists them")

    def index(self, pid: str) -> int:
        for i, p in enumerate(self.patches):
            if p.id == pid:
                return i
        self.patch(pid)  # raises: no such patch
        raise AssertionError(pid)

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

    def local_changes(self) -> list[tuple[str, str]]:
        return diff_manifests(self.expected(), self.current())

    def refuse_unexplained(self, *, stale_hint: str | None = None, dirty_hint: str | None = None,
                           keep: tuple[str, ...] = (), dirty: list[tuple[str, str]] | None = None) -> None:
        """The one "changes no patch explains" check: refuse (DirtyTreeError, exit 1) when an applied patch changed
        on disk since it was applied (checked when stale_hint is given; ids in keep are let through) or the tree
        holds changes no patch explains (checked when dirty_hint is given; `dirty`: local_changes() when the caller
        has it already). The hints say what to do next."""
        if stale_hint is not None:
            stale = [pid for pid in self.applied_stale() if pid not in keep]
            if stale:
                raise DirtyTreeError(f"applied patch(es) {', '.join(stale)} changed on disk since they were applied",
                                     where="patches/", hint=stale_hint)
        if dirty_hint is not None:
            require_tree(self.tree, "", "`forktool apply` writes pristine + the series there")
            dirty = self.local_changes() if dirty is None else dirty
            if dirty:
                raise DirtyTreeError(f"the vendored tree has {len(dirty)} change(s) that no patch explains",
                                     where=str(self.tree), details=[f"{s}: {p}" for s, p in dirty[:50]],
                                     hint=self.no_record_note() + dirty_hint)

    def no_record_note(self) -> str:
        """What to say first where the tree differs from the record because there is no record: without
        .opencoti/state.json every file a patch changed counts as an edit."""
        if not self.tree.exists() or (self.state_dir / "state.json").exists():
            return ""
        return ("there is no .opencoti/state.json, the record of what is applied, so every file a patch changed "
                "counts as an edit; if the tree holds the series, `forktool apply --force` backs it up and applies "
                "the series again. Otherwise: ")

    def applied_stale(self) -> list[str]:
        """Applied patch ids whose file changed (or left the series) since they were applied."""
        now = {p.id: p.sha256 for p in self.patches}
        return [a["id"] for a in self.state.applied if now.get(a["id"]) != a["sha256"]]

    # ------------------------------------------------------------ moving the tree

    def compute(self, patches: list[Patch]) -> Applied:
        """pristine + patches in memory; remembered (see _remembered) so that applying the same series on the same
        pristine again reads its results instead of applying every hunk again."""
        if not patches:
            return Applied()
        root = caches_root(self.state_dir, self.use_cache)
        if root is None:
            return apply_series(patches, self.base_bytes)
        results = Cache(root, "series-result")
        key = key_of("series-result", _applier_stamp(), self.pristine_digest, [(p.name, p.sha256) for p in patches])
        hit = _remembered(results.get(key), patches, ObjectStore(root / "objects"))
        if hit is not None:
            return hit
        out = apply_series(patches, self.base_bytes)
        _remember(results, key, out, ObjectStore(root / "objects"))
        return out

    def goto(self, target: list[Patch], *, force: bool, label: str) -> dict:
        """Make the tree hold pristine + target, all or nothing, writing only files whose bytes change."""
        fresh = not self.tree.exists()
        if fresh:
            self.progress("materialising the pristine tree")
            vendor.materialise(self.project, self.pristine)
            self.state = State(self.pristine_digest)
            self._write_state()
            self.tree_moved()
        current = self.current()
        dirty = self.local_changes()
        if not force:
            self.refuse_unexplained(dirty_hint="keep them with `forktool new SLUG` + `forktool refresh ID`, or pass "
                                               "--force to back them up and overwrite them", dirty=dirty)
        recorded = [(a["id"], a["sha256"]) for a in self.state.applied]
        if not dirty and not fresh and recorded == [(p.id, p.sha256) for p in target]:
            # the tree holds exactly what the state records for these very patches on this pristine
            return {"written": [], "backup": None, "materialised": False, "forced": [], "forced_changes": [],
                    "drift": [d for a in self.state.applied for d in a.get("drift", [])]}
        self.progress(f"applying {len(target)} patch(es) in memory")
        result = self.compute(target)
        paths = set(result.files) | set(self.state.files) | {p for _, p in dirty}
        writes: list[txn.Write] = []
        new_files: dict[str, Entry | None] = {}
        for rel in sorted(paths):
            mode = self.pristine[rel].mode if rel in self.pristine else REGULAR
            if rel in result.files:
                want = result.files[rel]
                sha = result.digests.get(rel) or (sha256_bytes(want) if want is not None else None)
                want_entry = Entry(sha, mode) if sha is not None else None
                new_files[rel] = want_entry
            else:  # back to pristine: its entry is known, and its bytes are read (and checked) only to be written
                want, want_entry = None, self.pristine.get(rel)
            if current.get(rel) != want_entry:
                if rel not in result.files:
                    want = self.base_bytes(rel)  # checked against the pristine entry's sha256 as it is read
                writes.append(txn.Write(rel, want, mode, want_entry.sha256 if want_entry is not None else None))
        applied = [{"id": p.id, "name": p.name, "sha256": p.sha256, "diff_sha256": p.diff_sha256,
                    "drift": [d.to_json() for d in result.drift.get(p.id, [])]} for p in target]
        new_state = State(self.pristine_digest, applied, new_files)
        backup_name = None
        if writes or new_state.to_json() != self.state.to_json():
            txn.check_plan(self.tree, writes)  # before the backup: a refused plan leaves nothing behind
            if writes and not fresh:
                b = bk.create(self.project.backups_dir, self.tree, label, f"before {label}", current,
                              self.pristine, self.state.to_json())
                backup_name = b.name
            txn.commit(self.tree, self.state_dir, writes, new_state.to_json(), backup_name)
            self.state = new_state
            if writes:
                self.tree_moved()
        return {"written": [w.path for w in writes], "backup": backup_name, "materialised": fresh,
                "forced": [p for _, p in dirty],
                "forced_changes": [{"path": p, "change": kind} for kind, p in dirty],
                "drift": [d.to_json() for p in target for d in result.drift.get(p.id, [])]}

    def restore(self, name: str) -> dict:
        path = bk.find(self.project.backups_dir, name)
        manifest, contents, saved_state = bk.load_for_restore(path, self.store.get, "state")
        current = self.current()
        writes = []
        for rel in sorted(set(manifest) | set(current)):
            if manifest.get(rel) != current.get(rel):
                e = manifest.get(rel)
                writes.append(txn.Write(rel, contents.get(rel), e.mode if e else REGULAR))
        txn.check_plan(self.tree, writes)
        b = None
        if writes:
            b = bk.create(self.project.backups_dir, self.tree, f"restore-{name[16:] or name}",
                          f"before restoring {name}", current, self.pristine, self.state.to_json())
        state = State.from_json(saved_state) if saved_state else State(self.pristine_digest)
        txn.commit(self.tree, self.state_dir, writes, state.to_json(), b.name if b else None)
        self.state = state
        self.tree_moved()
        return {"written": [w.path for w in writes], "backup": b.name if b else None, "restored": name}

    def restore_sync(self, name: str) -> dict:
        """Return the project to a sync's backup: the pin, lock, patches, series, registry and state it recorded,
        and the tree from its paired tree backup (the one it names, else the same name), all in one journal; a patch
        file it did not record goes. What is replaced is backed up first (both halves), so this is undone the same way."""
        root = self.project.root
        sync_dir = bk.sync_backups_dir(self.project)
        path = bk.find(sync_dir, name)
        proj_m, proj_c, meta = bk.load_for_restore(path, self.store.get)
        # its paired tree backup: named in it (made a moment apart, the two names can differ), else the same name
        named = meta.get("tree")
        pair = named if isinstance(named, str) else name
        tree_path = bk.find(self.project.backups_dir, pair) if pair != name else self.project.backups_dir / name
        if not tree_path.is_dir() or tree_path.is_symlink():
            raise ForktoolError(f"sync backup {name} has no tree backup {pair} beside it",
                                where=str(tree_path), hint="nothing was changed; restore the project files by hand "
                                "from it, or pick another one (`forktool backup list`)")
        tree_m, tree_c, saved_state = bk.load_for_restore(tree_path, self.store.get, "state")
        current = self.current()
        writes: list[txn.Write] = []
        prefix = self.tree.relative_to(root).as_posix() + "/"
        for rel in sorted(set(tree_m) | set(current)):
            if tree_m.get(rel) != current.get(rel):
                e = tree_m.get(rel)
                writes.append(txn.Write(prefix + rel, tree_c.get(rel), e.mode if e else REGULAR))
        now: Manifest = {}
        patches = sorted(f"patches/{p.name}" for p in self.project.patches_dir.iterdir()
                         if p.is_file() and not p.is_symlink())
        for rel in sorted(set(proj_m) | set(patches)):
            p = resolve_inside(root, rel, "sync backup")
            if p.is_file() and not p.is_symlink():
                now[rel] = Entry(sha256_bytes(schema.read_regular(p, rel, schema.STATE_LIMIT, root)), REGULAR)
            if proj_m.get(rel) != now.get(rel):
                writes.append(txn.Write(rel, proj_c.get(rel), REGULAR))
        state_rel = ".opencoti/state.json"
        if state_rel not in proj_m and saved_state:  # a backup made before the first apply: the tree's says it
            writes.append(txn.Write(state_rel, json.dumps(saved_state, indent=1, sort_keys=True).encode(), REGULAR))
        txn.check_plan(root, writes)
        saved: dict = {"tree": None, "project": None}
        if writes:
            stamp = f"restore-{name[16:] or name}"
            why = f"before restoring sync/{name}"
            saved["tree"] = bk.create(self.project.backups_dir, self.tree, stamp, why, current, self.pristine,
                                      self.state.to_json()).name
            saved["project"] = bk.create(sync_dir, root, stamp, why, now, {}, {"kind": "restore-sync",
                                                                             "restoring": name,
                                                                             "tree": saved["tree"]}).name
        txn.commit(root, self.project.project_journal_dir, writes, {"restored": f"sync/{name}"})
        self.state = State.from_json(saved_state) if saved_state else State(self.pristine_digest)
        self.tree_moved()
        return {"written": [w.path for w in writes], "backup": saved["tree"],
                "sync_backup": saved["project"], "restored": f"sync/{name}"}

    def record_patched(self) -> bool:
        """Write the full series' tree digest to vendor.lock when the series changed; True when written."""
        data = self.patched_lock()
        if data is None:
            return False
        atomic_write(self.project.vendor_lock, data)
        return True

    def patched_lock(self) -> bytes | None:
        """vendor.lock's bytes with the full series' tree digest, when the tree holds the whole series and the lock
        records another series (else None: nothing to write)."""
        if len(self.state.applied) != len(self.patches) or not self.patches:
            return None
        lock = vendor.load_lock(self.project)
        sd = series_digest(self.patches)
        if lock.get("patched", {}).get("series_digest") == sd:
            return None
        lock["patched"] = {"series_digest": sd, "tree_digest": digest(self.current()),
                           "top": self.patches[-1].id}
        return vendor.lock_bytes(lock)


def _applier_stamp() -> list[object]:
    """The applier's and the parser's code: a changed forktool never reuses a series result."""
    from forktool import apply, series

    return code_stamp(apply, series)


def _remember(results: Cache, key: str, out: Applied, objects: ObjectStore) -> None:
    """Keep the files of a series result in the cache's object store (by sha256) and their digests under key.

    Written without fsync, as every cache: a lost or torn object fails its sha256 when read, and the series is
    applied again."""
    files: dict[str, str | None] = {}
    try:
        for rel, data in out.files.items():
            if data is None:
                files[rel] = None
                continue
            sha = sha256_bytes(data)
            if not objects.has(sha):
                atomic_write(objects.path(sha), data, durable=False)
            files[rel] = sha
    except OSError:
        return  # a cache that cannot be written only costs speed
    results.put(key, {"files": files, "drift": {pid: [d.to_json() for d in ds] for pid, ds in out.drift.items()}})


def _remembered(value: object, patches: list[Patch], objects: ObjectStore) -> Applied | None:
    """The Applied a remembered value stands for, or None when it is not exactly one: every path the patches
    touch and no other, each object present and matching its sha256, every drift well formed."""
    if not isinstance(value, dict) or set(value) != {"files", "drift"}:
        return None
    files, drift = value["files"], value["drift"]
    if not isinstance(files, dict) or set(files) != {f.path for p in patches for f in p.files}:
        return None
    if not isinstance(drift, dict) or set(drift) != {p.id for p in patches}:
        return None
    out = Applied()
    try:
        for pid, ds in drift.items():
            out.drift[pid] = [Drift(d["patch"], d["file"], d["hunk"], d["offset"]) for d in ds
                              if type(d["hunk"]) is int and type(d["offset"]) is int and d["patch"] == pid
                              and isinstance(d["file"], str) and len(d) == 4]
            if len(out.drift[pid]) != len(ds):
                return None
        for rel, sha in files.items():
            out.files[rel] = None if sha is None else objects.get(sha)  # read back and checked against its sha256
            if sha is not None:
                out.digests[rel] = sha
    except (ForktoolError, TypeError, KeyError, ValueError):
        return None
    return out


def require_tree(tree: Path, so: str, hint: str) -> None:
    """Refuse a command that needs the vendored tree when it is absent (read as an empty tree, it would take every
    upstream file for removed); so: what that means for the command (", so there is nothing to build")."""
    if not tree.exists():
        raise ForktoolError(f"the vendored tree is absent{so}", where=str(tree), hint=hint)


@contextmanager
def open_workspace(project: Project, *, use_cache: bool = True, progress: Progress | None = None,
                   warn: Progress | None = None) -> Iterator[Workspace]:
    """Take the project lock once, finish an interrupted transaction, and read the snapshot (use_cache=False:
    nothing remembered is read, not even a schema pass or a YAML parse)."""
    with cache.remembering(None) if not use_cache else nullcontext(), txn.locked(project.state_dir):
        note = txn.recover(project.tree, project.state_dir, "state")
        if note and warn is not None:
            warn(note)
        # the project-rooted journal of `sync --accept` and of restoring a sync's backup
        note = txn.recover(project.root, project.project_journal_dir)
        if note and warn is not None:
            warn(note)
        _refuse_during_sync(project)
        yield Workspace(project, use_cache=use_cache, progress=progress)


def _refuse_during_sync(project: Project) -> None:
    """The tree belongs to a stopped `forktool sync` until it is continued or aborted."""
    path = project.sync_dir / "state.json"
    st = schema.load_sync_state(path, project.state_dir)
    if st is None:
        return
    backups = st["backups"]
    here = (project.backups_dir / backups["tree"]).is_dir() if backups else False
    if st["stage"] in ("starting", "stopped", "finishing") and here:
        raise ForktoolError(f"a sync to {st['to_spec']} is in progress ({st['stage']}); the vendored tree "
                            "belongs to it", where=str(path), hint="run `forktool sync --continue`, `--skip` or "
                            "`--abort` first (`forktool status` shows where it stands)")
