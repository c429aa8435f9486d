"""Vendor backups: a manifest of the whole tree plus only the files that differ from pristine."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path
from typing import NamedTuple

from forktool import schema
from forktool.errors import ForktoolError, UnsafePathError, UsageError
from forktool.project import Project
from forktool.store import ObjectStore
from forktool.tree import (
    Manifest,
    digest,
    make_temp_dir,
    manifest_from_json,
    manifest_to_json,
    remove_dead_work_dirs,
    remove_tree,
    resolve_inside,
    sha256_bytes,
    write_many,
)

SLUG_OK = "abcdefghijklmnopqrstuvwxyz0123456789-"
SYNC_PREFIX = "sync/"  # how a sync's backup is named on the command line: sync/NAME


class Backup(NamedTuple):
    name: str
    path: Path
    created: str
    reason: str
    files: int
    stored: int
    tree_digest: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "path": str(self.path), "created": self.created, "reason": self.reason,
                "files": self.files, "stored": self.stored, "tree_digest": self.tree_digest}


def slugify(text: str) -> str:
    s = "".join(c if c in SLUG_OK else "-" for c in text.lower())
    return "-".join(p for p in s.split("-") if p)[:60] or "backup"


def create(backups_dir: Path, tree: Path, slug: str, reason: str, current: Manifest, pristine: Manifest,
           state: dict) -> Backup:
    """Back up the tree as `current` describes it, storing only files that differ from pristine."""
    _check_dir(backups_dir)
    backups_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = f"{stamp}-{slugify(slug)}"
    name, n = base, 2
    while (backups_dir / name).exists():
        name, n = f"{base}-{n}", n + 1
    # the work directory's name carries this process's id: one that a kill (SIGTERM, SIGHUP, SIGKILL) left behind
    # is removed by the next backup made here, once its process is gone
    remove_dead_work_dirs(backups_dir, _WORK_RE)
    tmp = make_temp_dir(backups_dir, f"{WORK_PREFIX}{os.getpid()}-")
    try:
        stored = []
        blobs: dict[str, bytes] = {}
        for rel, e in sorted(current.items()):
            if pristine.get(rel) == e:
                continue
            p = resolve_inside(tree, rel, "backup")
            data = os.readlink(p).encode() if p.is_symlink() else schema.read_regular(p, rel, schema.STATE_LIMIT)
            if sha256_bytes(data) != e.sha256:
                raise ForktoolError(f"{rel} changed while it was being backed up", where=str(p),
                                    hint="stop whatever is writing to the vendored tree and retry")
            blobs[e.sha256] = data
            stored.append(rel)
        meta: dict = {"name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reason": reason,
                "tree_digest": digest(current), "files": manifest_to_json(current), "stored": stored,
                "state": state}
        meta["checksum"] = _checksum(meta)
        # one line: indent makes json use its pure-Python encoder, 0.01 s for a thousand-file manifest; the
        # objects and the manifest are made durable together (one wait for the disk) before the rename below
        manifest = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
        objects = ObjectStore(tmp / "objects")
        earlier = _earlier(backups_dir)
        todo = [(objects.path(sha), data) for sha, data in blobs.items()
                if not _link_same(earlier, sha, data, objects.path(sha))]
        write_many([*todo, (tmp / "manifest.json", manifest)])
        tmp.rename(backups_dir / name)
    except BaseException:
        try:
            remove_tree(tmp)
        except OSError:
            pass
        raise
    return Backup(name, backups_dir / name, meta["created"], reason, len(current), len(stored), meta["tree_digest"])


WORK_PREFIX = ".tmp-"  # a backup being made: .tmp-PID-RANDOM, renamed to its name once whole
_WORK_RE = re.compile(rf"^{re.escape(WORK_PREFIX)}(\d+)-[0-9a-f]{{12}}$")


# how many of the newest backups create() looks in for an object it can link instead of writing again
EARLIER = 4


def _earlier(backups_dir: Path) -> list[ObjectStore]:
    """The object stores of the newest finished backups (names sort by their UTC time stamp)."""
    try:
        names = sorted((n for n in os.listdir(backups_dir) if not n.startswith(".")), reverse=True)
    except OSError:
        return []
    return [ObjectStore(backups_dir / n / "objects") for n in names[:EARLIER]]


def _link_same(earlier: list[ObjectStore], sha: str, data: bytes, dest: Path) -> bool:
    """Hard-link dest to an earlier backup's object holding exactly `data`; True when linked.

    That object was written and fsynced before its own backup was renamed into place, so the link is as
    durable as a new copy would be, without writing and fsyncing the bytes again (unapply backs up the same
    patched files at every round trip). Its bytes are compared, not trusted by name: a damaged object is
    never linked. Restore checks every object against its sha256 as before."""
    for store in earlier:
        src = store.path(sha)
        try:
            st = os.lstat(src)
            if not stat.S_ISREG(st.st_mode) or st.st_size != len(data) or src.read_bytes() != data:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(src, dest)
            return True
        except OSError:
            continue
    return False


def _checksum(meta: dict) -> str:
    """sha256 of the manifest without its checksum: any edit to it (state, reason, names) is detected."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return sha256_bytes(json.dumps(body, sort_keys=True).encode())


def _check_dir(backups_dir: Path) -> None:
    if backups_dir.is_symlink() or (os.path.lexists(backups_dir) and not backups_dir.is_dir()):
        raise UnsafePathError(f"{backups_dir} is a symlink or not a directory; forktool keeps backups only in a "
                              "real directory", where=str(backups_dir),
                              hint=f"move it away (`mv {backups_dir} {backups_dir}.moved`) and run again")


def _load(path: Path) -> dict:
    """A backup's manifest.json checked against its schema and its own checksum."""
    _check_dir(path.parent)  # every backup directory, the tree's and a sync's alike, follows the same rules
    if path.is_symlink():
        raise UnsafePathError(f"backup {path.name} is a symlink", where=str(path),
                              hint="forktool reads backups only from real directories under .opencoti/vendor-backups")
    hint = "the backup is damaged; pick another one (`forktool backup list`)"
    try:
        m = schema.load_json(path / "manifest.json", "backup", root=path.parent, limit=schema.STATE_LIMIT, hint=hint)
    except ForktoolError as e:
        raise ForktoolError(f"backup {path.name}: manifest.json is unusable: {e.what}", where=e.where or str(path),
                            hint=hint) from None
    return m


def list_backups(backups_dir: Path) -> list[Backup]:
    out: list[Backup] = []
    _check_dir(backups_dir)
    if not backups_dir.is_dir():
        return out
    for p in sorted(backups_dir.iterdir()):
        if p.name.startswith(".") or p.is_symlink() or not p.is_dir():
            continue
        try:
            m = _load(p)
        except ForktoolError:
            out.append(Backup(p.name, p, "?", "damaged: unusable manifest", 0, 0, ""))
            continue
        out.append(Backup(p.name, p, m["created"], m["reason"], len(m["files"]), len(m["stored"]), m["tree_digest"]))
    return out


def find(backups_dir: Path, name: str) -> Path:
    if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > 255:
        raise UsageError(f"{name!r} is not a backup name", where="backup NAME",
                         hint="`forktool backup list` shows the names")
    _check_dir(backups_dir)
    p = backups_dir / name
    if p.is_symlink():
        raise UnsafePathError(f"backup {name} is a symlink", where=str(p),
                              hint="forktool reads backups only from real directories under .opencoti/vendor-backups")
    if not p.is_dir():
        names = [b.name for b in list_backups(backups_dir)]
        raise ForktoolError(f"no backup named {name!r}", where=str(backups_dir),
                            hint="`forktool backup list` shows them" + (f"; newest: {names[-1]}" if names else ""))
    return p


def load_for_restore(path: Path, pristine_get, state_schema: str | None = None
                     ) -> tuple[Manifest, dict[str, bytes], dict]:
    """The backed-up manifest, every file's bytes (checked against it), and the saved state (checked against
    state_schema when given and not empty)."""
    m = _load(path)
    if state_schema and m["state"]:
        try:
            schema.check(m["state"], state_schema, f"{path / 'manifest.json'}: state")
        except ForktoolError as err:
            raise ForktoolError(f"backup {path.name}: its saved state is unusable: {err.what}", where=err.where,
                                hint="the backup is damaged; pick another one (`forktool backup list`)") from None
    manifest = manifest_from_json(m["files"])
    if digest(manifest) != m["tree_digest"]:
        raise ForktoolError(f"backup {path.name}: manifest does not match its recorded digest", where=str(path),
                            hint="the backup was tampered with; pick another one")
    if "checksum" in m and m["checksum"] != _checksum(m):
        raise ForktoolError(f"backup {path.name}: manifest.json does not match its checksum", where=str(path),
                            hint="the backup was tampered with; pick another one (`forktool backup list`)")
    stored = set(m["stored"])
    if not stored <= set(manifest):
        extra = sorted(stored - set(manifest))
        raise ForktoolError(f"backup {path.name}: stored file(s) {', '.join(extra[:5])} are not in its manifest",
                            where=str(path), hint="the backup was tampered with; pick another one")
    objs = path / "objects"
    if stored and (objs.is_symlink() or not objs.is_dir()):
        raise ForktoolError(f"backup {path.name}: its objects directory is missing or not a directory",
                            where=str(objs), hint="the backup is damaged; pick another one (`forktool backup list`)")
    store = ObjectStore(objs)
    contents: dict[str, bytes] = {}
    for rel, e in manifest.items():
        if rel in stored:
            op = store.path(e.sha256)
            if op.is_symlink() or not op.is_file():
                raise ForktoolError(f"backup {path.name}: the object of {rel} is missing or not a regular file",
                                    where=str(op), hint="the backup is damaged; pick another one")
            data = store.get(e.sha256)
        else:
            data = pristine_get(e.sha256)
        if sha256_bytes(data) != e.sha256:
            raise ForktoolError(f"backup {path.name}: {rel} does not match its sha256", where=str(path),
                                hint="the backup is damaged; pick another one (`forktool backup list`)")
        contents[rel] = data
    return manifest, contents, m.get("state", {})


def in_use(project: Project) -> set[Path]:
    """The backups an operation may still restore, which prune must keep: those of a sync that is in progress
    (starting, stopped, finishing: state.json) and of the last finished sync, which `sync --undo` can still take
    back (undo.json).

    Read from the sync's own state files, each checked against its schema; one that cannot be read is refused
    rather than guessed at, so prune never deletes on a misreading."""
    sync = project.sync_dir
    needed: set[Path] = set()
    for name in ("state.json", "undo.json"):
        path = sync / name
        try:
            st = schema.load_sync_state(path, project.state_dir)
        except ForktoolError as e:
            raise ForktoolError(f"cannot tell which backups the sync recorded in {path} needs: {e.what}",
                                where=e.where or str(path), hint="nothing was removed; " + (e.hint or
                                "fix or restore that file, then prune again")) from None
        if st is None or st["stage"] == "aborted" or not st["backups"]:
            continue
        needed.add(project.backups_dir / st["backups"]["tree"])
        needed.add(sync_backups_dir(project) / st["backups"]["project"])
    return needed


def check_dirs(project: Project) -> None:
    """Both backup directories (the tree's and the sync's) are real directories or absent; else refused."""
    _check_dir(project.backups_dir)
    _check_dir(sync_backups_dir(project))


def sync_backups_dir(project: Project) -> Path:
    """Where a sync keeps its backups of the pin, lock, patches, state and registry (the tree's go with the rest)."""
    return project.sync_backups_dir


def prune(backups_dir: Path, keep: int, needed: frozenset[Path] | set[Path] = frozenset()) -> tuple[list[str], list[str]]:
    """Delete all but the newest `keep` backups, never one in `needed` (the caller holds the project lock);
    returns (removed, kept because needed)."""
    if keep < 0:
        raise UsageError(f"--keep {keep}: must be zero or more", where="--keep",
                         hint="give how many of the newest backups to keep, e.g. --keep 5")
    backups = list_backups(backups_dir)
    doomed = backups[: max(0, len(backups) - keep)]
    held = [b.name for b in doomed if b.path in needed]
    gone = []
    for b in doomed:
        if b.path not in needed:
            # out of sight first, in one rename: a prune cut short (SIGTERM, a kill) never leaves a half-deleted backup
            # under its name, listed as whole; what is left is a work directory the next backup made here removes
            doomed_dir = backups_dir / f"{WORK_PREFIX}{os.getpid()}-{os.urandom(6).hex()}"
            b.path.rename(doomed_dir)
            remove_tree(doomed_dir)
            gone.append(b.name)
    return gone, held
