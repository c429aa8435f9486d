"""Authoring patches from the tree: export, refresh, new (which edits patches/series), re-anchor."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from forktool.apply import Applied, apply_patch
from forktool.errors import ApplyError, ForktoolError, UsageError
from forktool.markers import hooks_in_patch
from forktool.project import Project
from forktool.series import Patch, diff_file, make_header, parse_patch, set_trailers, with_files
from forktool.tree import REGULAR, SYMLINK, Manifest, atomic_write
from forktool.workspace import Workspace, require_tree

Reader = Callable[[str], bytes | None]


def export(ws: Workspace, patch: Patch, before: Applied, after_read: Reader, paths: list[str] | None = None) -> Patch:
    """The patch regenerated from tree contents, keeping its message; paths = its own unless given."""
    files = []
    for rel in patch.paths if paths is None else paths:
        old = before.files[rel] if rel in before.files else ws.base_bytes(rel)
        new = after_read(rel)
        mode = ws.pristine[rel].mode if rel in ws.pristine else REGULAR
        fd = diff_file(rel, old, new, mode, mode)
        if fd is not None:
            files.append(fd)
    return with_files(patch, files)


def with_derived_trailers(project: Project, patch: Patch, files_diff: list) -> tuple[Patch, dict[str, str]]:
    """`patch` (its message kept) carrying files_diff, with the Opencoti-Hooks and Build-Impact trailers those
    files give; also the trailers."""
    from forktool.impact import impact_label  # the build config, read only when a patch is rewritten

    diff_only = with_files(patch, files_diff)
    trailers = {"Opencoti-Hooks": ", ".join(hooks_in_patch(diff_only)),
                "Build-Impact": impact_label(project, diff_only.paths) if diff_only.paths else ""}
    header = set_trailers(patch.header, trailers, f"patches/{patch.name}")
    return with_files(Patch(patch.id, patch.name, header, files_diff), files_diff), trailers


def _check_refreshable(ws: Workspace, pid: str) -> tuple[int, Patch]:
    """The patch to refresh: applied, and no applied patch changed on disk since (a message-only edit of `pid`
    itself is kept)."""
    applied = [a["id"] for a in ws.state.applied]
    ws.patch(pid)  # one the series does not name: said so, with the ids it does name
    # read as an empty tree, it made the patch a deletion of every upstream file and emptied its registry entry
    require_tree(ws.tree, f", so there is nothing to refresh patch {pid} from",
                 f"`forktool apply --upto {pid}` makes the tree with the series up to it; edit there, then refresh")
    if pid not in applied:
        raise UsageError(f"patch {pid} is not applied (top: {ws.state.top or 'none'})", where=str(ws.tree),
                         hint=ws.no_record_note() + f"run `forktool apply --upto {pid}` first, edit, then refresh")
    idx = ws.index(pid)
    patch = ws.patches[idx]
    # only its message edited: refresh keeps the new message
    message_only = ws.state.applied[applied.index(pid)].get("diff_sha256") == patch.diff_sha256
    ws.refuse_unexplained(stale_hint=f"run `forktool apply --upto {ws.state.top}` to re-apply them first",
                          keep=(pid,) if message_only else ())
    return idx, patch


def _local_edits(ws: Workspace, current: Manifest) -> set[str]:
    changed = {p for _, p in ws.local_changes()}
    for rel in sorted(changed):
        e = current.get(rel)
        if e is not None and e.mode == SYMLINK:
            raise ForktoolError(f"{rel} is a symlink; patches carry regular files only", where=rel,
                                hint="replace the link with a regular file, or undo that change "
                                     "(`forktool status` lists the local changes)")
    return changed


def refresh(ws: Workspace, pid: str) -> dict:
    idx, patch = _check_refreshable(ws, pid)
    if ws.state.top != pid:
        return refresh_below_top(ws, idx, patch)
    before = ws.compute(ws.patches[:idx])
    current = ws.current()
    changed = _local_edits(ws, current)
    rels = sorted(set(patch.paths) | changed)
    files_diff = []
    diffed: dict[str, tuple[bytes | None, bytes | None, str | None, str | None]] = {}
    for rel in rels:
        old = before.files[rel] if rel in before.files else ws.base_bytes(rel)
        new = ws.disk_bytes(rel)
        old_mode = ws.pristine[rel].mode if rel in ws.pristine else REGULAR
        new_mode = current[rel].mode if rel in current else old_mode
        args = (old, new, old_mode if old is not None else None, new_mode if new is not None else None)
        fd = diff_file(rel, *args)
        if fd is not None:
            files_diff.append(fd)
            diffed[rel] = args
    refreshed, trailers = with_derived_trailers(ws.project, patch, files_diff)
    old_bytes = patch.raw
    new_bytes = refreshed.raw
    ws.patches[idx] = parse_patch(new_bytes, patch.name)
    _remember_reexport(ws, ws.patches[idx], before, diffed, files_diff)
    # the tree already holds the refreshed result: record it as applied
    files = {rel: current.get(rel) for rel in set(ws.state.files) | set(rels)}
    ws.state.applied[-1] = {"id": pid, "name": patch.name, "sha256": ws.patches[idx].sha256,
                            "diff_sha256": ws.patches[idx].diff_sha256, "drift": []}
    ws.state.files = files
    _commit_refresh(ws, [ws.patches[idx]] if new_bytes != old_bytes else [], pid)
    return {"patch": patch.name, "changed": new_bytes != old_bytes, "files": refreshed.paths,
            "hooks": trailers["Opencoti-Hooks"], "build_impact": trailers["Build-Impact"], "reanchored": [],
            "registry": keep_registry(ws, [pid])}


def refresh_below_top(ws: Workspace, idx: int, patch: Patch) -> dict:
    """Refresh an applied patch below the top while the tree holds the whole applied series.

    The tree's edit since the last move (the tree against the applied series) is placed on the contents right
    after `patch`, `patch` is rewritten from the result, and the patches above it are applied again on top of the
    rewritten one (re-anchored when they now apply at an offset). That must give back the tree byte for byte:
    otherwise, or when the edit touches lines a patch above owns, nothing is written and the error says which.
    """
    n = len(ws.state.applied)
    current = ws.current()
    changed = _local_edits(ws, current)
    expected = ws.expected()
    full = ws.compute(ws.patches[:n])

    def read(acc: Applied) -> Reader:
        return lambda rel: acc.files[rel] if rel in acc.files else ws.base_bytes(rel)

    hint = (f"move the tree down to it (`forktool apply --upto {patch.id}`), edit there, `forktool refresh "
            f"{patch.id}`, then `forktool apply --reanchor`")
    edit_files = []
    for rel in sorted(changed):
        old, new = read(full)(rel), ws.disk_bytes(rel)
        old_mode = expected[rel].mode if rel in expected else None
        new_mode = current[rel].mode if rel in current else None
        if old is not None and new is not None and old_mode != new_mode:
            raise ForktoolError(f"{rel} changed its mode ({old_mode} -> {new_mode}): below the top only content "
                                "edits are placed", where=rel, hint=hint)
        fd = diff_file(rel, old, new, old_mode, new_mode)
        if fd is not None:
            edit_files.append(fd)
    edit = with_files(Patch("edit", "the tree's edit", b"", []), edit_files)
    above = ws.patches[idx + 1:n]
    before = ws.compute(ws.patches[:idx])
    at = Applied(dict(before.files))
    apply_patch(patch, ws.base_bytes, at)
    try:
        apply_patch(edit, ws.base_bytes, at)
    except ApplyError as e:
        raise ForktoolError(f"the edit does not fit under the patches above {patch.id} "
                            f"({', '.join(p.id for p in above)}): it touches lines they change",
                            where=e.where.replace("patch the tree's edit, ", ""), details=e.details, hint=hint) from e
    rels = sorted(set(patch.paths) | changed)
    refreshed, trailers = with_derived_trailers(ws.project, patch, export(ws, patch, before, read(at), rels).files)
    new_patches = list(ws.patches)
    new_patches[idx] = parse_patch(refreshed.raw, patch.name)
    acc = Applied(dict(before.files))
    apply_patch(new_patches[idx], ws.base_bytes, acc)
    reanchored = []
    for k in range(idx + 1, n):
        prev = Applied(dict(acc.files))
        try:
            apply_patch(new_patches[k], ws.base_bytes, acc)
        except ApplyError as e:
            raise ForktoolError(f"patch {new_patches[k].id} no longer applies on top of the refreshed {patch.id}",
                                where=e.where, details=e.details, hint=hint) from e
        again = export(ws, new_patches[k], prev, read(acc))
        if again.raw != new_patches[k].raw:
            new_patches[k] = parse_patch(again.raw, new_patches[k].name)
            reanchored.append(new_patches[k].id)
    for rel in sorted(set(full.files) | set(acc.files) | changed):
        if read(acc)(rel) != ws.disk_bytes(rel):
            raise ForktoolError(f"the refreshed {patch.id} and the patches above it do not give back {rel} as the "
                                "tree holds it", where=rel, hint=hint)
    ws.patches[:] = new_patches
    written = []
    for k in range(idx, n):
        p = ws.patches[k]
        if (k == idx and p.raw != patch.raw) or p.id in reanchored:
            written.append(p)
        ws.state.applied[k] = {"id": p.id, "name": p.name, "sha256": p.sha256, "diff_sha256": p.diff_sha256,
                               "drift": []}
    ws.state.files = {rel: current.get(rel) for rel in set(ws.state.files) | set(rels)}
    _commit_refresh(ws, written, patch.id)
    return {"patch": patch.name, "changed": refreshed.raw != patch.raw, "files": refreshed.paths,
            "hooks": trailers["Opencoti-Hooks"], "build_impact": trailers["Build-Impact"], "reanchored": reanchored,
            "registry": keep_registry(ws, [patch.id, *reanchored])}


def _commit_refresh(ws: Workspace, written: list[Patch], pid: str) -> None:
    """Write the rewritten patches, the state that records them as applied and vendor.lock's record of the series
    in one update of the project's own files (its journal, txn.commit on the project root): a refresh cut short at
    any point is finished by the next command (open_workspace rolls the journal forward) or was never begun, so
    the patches on disk never disagree with the state that says they are applied. The registry's derived keys
    are brought up to date after it (keep_registry); a refresh run again brings them up to date too."""
    from forktool import txn
    from forktool.state import STATE_FILE, state_bytes

    root = ws.project.root

    def rel(path: Path) -> str:
        return path.relative_to(root).as_posix()

    writes = [txn.Write(rel(ws.project.patches_dir / p.name), p.raw, REGULAR) for p in written]
    writes.append(txn.Write(rel(ws.state_dir / STATE_FILE), state_bytes(ws.state), REGULAR))
    lock = ws.patched_lock()
    if lock is not None:
        writes.append(txn.Write(rel(ws.project.vendor_lock), lock, REGULAR))
    txn.commit(root, ws.project.project_journal_dir, writes, {"refreshed": pid})


def keep_registry(ws: Workspace, ids: list[str] | None) -> str:
    """Bring the registry's derived keys up to date for the patches `ids` (None: the whole series): files, build
    impact, hook lists, and the sites and advisory lines of the hooks in the files they touch, read from the
    whole series applied in memory. When the series does not apply whole, sites are left as they are, and what
    it says adds that they were not brought up to date (never a bare "unchanged" over sites it could not find)."""
    from forktool import regfile
    from forktool.cache import Cache, caches_root

    chosen = [p for p in ws.patches if ids is None or p.id in ids]
    rels = {f for p in chosen for f in p.paths}
    unchecked = ""
    try:
        final = ws.compute(ws.patches).files
    except ApplyError as e:
        final, rels = {}, set()
        unchecked = (f"; hook sites not checked, left as they were: the series does not apply whole "
                     f"({e.where + ': ' if e.where else ''}{e.what})")
    cache = Cache(caches_root(ws.state_dir, ws.use_cache), "scopes")
    said = regfile.keep(ws.project, ws.patches, final, ids, rels, cache)
    return said + unchecked if said in ("updated", "unchanged") else said


def _remember_reexport(ws: Workspace, patch: Patch, before: Applied, diffed: dict, files_diff: list) -> None:
    """Record in the re-export cache that `patch` re-exports byte for byte from these exact contents, when what
    refresh just did is the very computation verify's re-export would do.

    verify exports the top patch with diff_file(rel, before, disk, mode, mode) over the patch's files, mode being
    the pristine file's (regular for a new one); refresh called diff_file with the same bytes and, when the file
    exists on both sides with that mode, the same modes. The entry is keyed as verify keys it (patch bytes, paths,
    pre-image digests, and post-image digests of the bytes refresh read, not of the stat index), so a file edited
    afterwards, even keeping its size and mtime, gives verify another key and a fresh export.
    """
    from forktool.cache import Cache, caches_root, key_of
    from forktool.tree import sha256_bytes

    root = caches_root(ws.state_dir, ws.use_cache)
    if root is None or patch.paths != [fd.path for fd in files_diff]:
        return
    pre: list[str | None] = []
    post: list[str] = []
    modes: list[str | None] = []
    for rel in patch.paths:
        old, new, old_mode, new_mode = diffed[rel]
        mode = ws.pristine[rel].mode if rel in ws.pristine else REGULAR
        if old is None or new is None or old_mode != mode or new_mode != mode:
            return  # a new or deleted file, or a mode that differs: verify computes it
        if rel in before.files:
            pre.append(sha256_bytes(old))
        else:
            e = ws.pristine.get(rel)
            pre.append(e.sha256 if e else None)
        post.append(sha256_bytes(new))
        modes.append(ws.pristine[rel].mode if rel in ws.pristine else None)
    if with_files(patch, files_diff).raw != patch.raw:
        return
    Cache(root, "reexport").put(key_of("reexport", patch.sha256, patch.paths, pre, post, modes), True)


def new(ws: Workspace, slug: str, title: str, author: str, want: str | None = None) -> dict:
    if not re.match(r"^[a-z0-9][a-z0-9._-]*$", slug):
        raise UsageError(f"bad slug {slug!r}", where="SLUG",
                         hint="use lowercase letters, digits, '-', '.', '_', starting with a letter or digit "
                              "(e.g. `forktool new kv-window`)")
    top = ws.state.top
    pos = ws.index(top) + 1 if top else 0
    ids = {int(p.id) for p in ws.patches}
    lo = int(top) if top else 0
    hi = int(ws.patches[pos].id) if pos < len(ws.patches) else 10000
    # the series, not the number, gives the order: with no room between the neighbours, take the
    # next number after the highest one
    free = [n for n in range(lo + 1, hi) if n not in ids] or [max(ids) + 1]
    if free[0] > 9999:
        raise ForktoolError("no free patch id left", where="patches/series", hint="renumber the series")
    pid = f"{free[0]:04d}"
    if want is not None:
        if not re.match(r"^\d{4}$", want) or want in {p.id for p in ws.patches}:
            raise UsageError(f"--id {want} is not a free four-digit id", where="patches/series",
                             hint=f"the next free one after the top is {pid}")
        pid = want
    name = f"{pid}-{slug}.patch"
    header = make_header(title or slug, author=author,
                         date=time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime()))
    data = header + b"---\n"
    patch = parse_patch(data, name)
    from forktool import regfile, txn
    from forktool.state import STATE_FILE, State, state_bytes

    patches = [*ws.patches[:pos], patch, *ws.patches[pos:]]
    state = State(ws.state.pristine_digest, [*ws.state.applied, {
        "id": pid, "name": name, "sha256": patch.sha256, "diff_sha256": patch.diff_sha256, "drift": []}],
        ws.state.files)
    said, registry = regfile.keep_planned(ws.project, patches, {}, [pid], ())
    # the patch, the series naming it, the state recording it as applied and its registry entry: one update of
    # the project's own files, so a `new` cut short (a full disk, a kill) never leaves a patch that a second `new`
    # would duplicate
    root = ws.project.root
    files = [(ws.project.patches_dir / name, data), (ws.project.series_file, _insert_in_series(ws, pos, name)),
             (ws.state_dir / STATE_FILE, state_bytes(state)), *registry]
    txn.commit(root, ws.project.project_journal_dir,
               [txn.Write(path.relative_to(root).as_posix(), b, REGULAR) for path, b in files], {"new": pid})
    ws.state = state
    ws.patches[:] = patches
    return {"patch": name, "id": pid, "after": top, "registry": said}


def _insert_in_series(ws: Workspace, pos: int, name: str) -> bytes:
    """patches/series with name added after the entry at pos - 1, keeping comments where they are."""
    lines = ws.project.series_file.read_text().splitlines(keepends=True)
    if pos == 0:
        first = next((e.line for e in ws.entries), len(lines) + 1)
        insert_at = first - 1
    else:
        insert_at = ws.entries[pos - 1].line
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.insert(insert_at, name + "\n")
    return "".join(lines).encode()


def reanchor(ws: Workspace, end: int) -> list[str]:
    """Canonical re-exports of patches[:end] on the base they now apply to, in memory.

    After a lower patch changes, a later one may apply only at an offset, or its index lines name
    blobs that no longer exist: its content is the same, its canonical bytes are not. This rewrites
    the in-memory patches (message kept, diff re-exported) and returns the ids that changed; the
    caller moves the tree first and writes the files after, so a failed apply writes nothing.
    """
    changed = []
    for k, patch, before, read in steps(ws, end):  # lazily: each reader sees its own step
        again = export(ws, patch, before, read)
        if again.raw != patch.raw:
            ws.patches[k] = parse_patch(again.raw, patch.name)
            changed.append(patch.id)
    return changed


def steps(ws: Workspace, end: int, top_from_disk: bool = False,
          acc: Applied | None = None) -> Iterator[tuple[int, Patch, Applied, Reader]]:
    """(index, patch, contents before it, reader of contents after it) for patches[:end], applied one by one
    from pristine into acc. With top_from_disk the last one's "after" is the tree on disk."""
    acc = acc if acc is not None else Applied()
    for k, patch in enumerate(ws.patches[:end]):
        before = Applied(dict(acc.files))
        apply_patch(patch, ws.base_bytes, acc)
        if top_from_disk and k == end - 1:
            read: Reader = ws.disk_bytes
        else:
            def read(rel: str, a: Applied = acc) -> bytes | None:
                return a.files[rel] if rel in a.files else ws.base_bytes(rel)
        yield k, patch, before, read


def write_patches(ws: Workspace, ids: list[str]) -> None:
    for p in ws.patches:
        if p.id in ids:
            atomic_write(ws.project.patches_dir / p.name, p.raw)
