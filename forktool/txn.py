"""Crash-safe tree updates: stage everything, mark the plan committed, then replace; a journal finishes the job."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, NamedTuple

from forktool import schema
from forktool.errors import ForktoolError, UnsafePathError
from forktool.tree import (
    EXECUTABLE,
    FSYNC_BATCH,
    SYMLINK,
    atomic_write,
    fsync_all,
    remove_empty_parents,
    remove_tree,
    resolve_inside,
    run_all,
    sha256_bytes,
    signals_held,
)

if TYPE_CHECKING:
    from typing import Any


class Write(NamedTuple):
    path: str
    data: bytes | None  # None: delete
    mode: str
    sha256: str | None = None  # of data, when the caller has just computed or checked it (else computed here)


def _fault(point: str) -> None:
    # fault injection for the crash tests: FORKTOOL_FAULT=<point> kills the process right here
    if os.environ.get("FORKTOOL_FAULT") == point:
        os._exit(137)


def fault(point: str) -> None:
    """A named crash point for other modules' steps (FORKTOOL_FAULT=<point> kills the process there)."""
    _fault(point)


def check_state_dir(state_dir: Path) -> None:
    """The state directory (and the project root's own entry for it) must be a real directory, not a link."""
    if state_dir.is_symlink():
        raise UnsafePathError(f"{state_dir} is a symlink; forktool keeps its state only in a real directory",
                              where=str(state_dir), hint=f"remove the link and run again (`rm {state_dir}`)")
    if os.path.lexists(state_dir) and not state_dir.is_dir():
        raise UnsafePathError(f"{state_dir} is not a directory", where=str(state_dir),
                              hint=f"move it away (`mv {state_dir} {state_dir}.bad`) and run again")


@contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    check_state_dir(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = state_dir / "lock"
    try:
        # O_NOFOLLOW: a planted link must never make forktool truncate or create a file elsewhere
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise UnsafePathError(f"{lock} cannot be opened as the project lock ({e.strerror})", where=str(lock),
                              hint=f"it must be a regular file: remove it (`rm -r {lock}`) and run again") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(f"{lock} is not a regular file", where=str(lock),
                                  hint=f"remove it (`rm -r {lock}`) and run again")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ForktoolError("another forktool command is running in this project", where=str(state_dir),
                                hint="wait for it to finish") from None
        yield
    finally:
        os.close(fd)


def txn_dir(state_dir: Path) -> Path:
    return state_dir / "txn"


def _feasible(tree: Path, writes: list[Write]) -> None:
    """Refuse, before anything is committed, writes the filesystem cannot carry out (a file where a directory
    must be, a directory where a file must be), so a committed plan always rolls forward."""
    deleted = {w.path for w in writes if w.data is None}
    written = {w.path for w in writes if w.data is not None}
    _writable_dirs(tree, writes)
    for w in writes:
        if w.data is None:
            continue
        parts = w.path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            if parent in written:
                # two writes where one path is a directory of the other: the filesystem can hold only one
                raise ForktoolError(f"{parent} is written as a file and as the directory of {w.path} in one update",
                                    where=str(tree / parent), hint="nothing was changed; fix the patch that creates "
                                    "these paths (one of them must go)")
        target = tree / w.path
        if target.is_dir() and not target.is_symlink():
            raise ForktoolError(f"{w.path} is a directory in the vendored tree, but a file must be written there",
                                where=str(target), hint="nothing was changed; remove or rename the directory, or fix "
                                "the patch that writes this path")
        parts = w.path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            p = tree / parent
            if os.path.lexists(p) and not p.is_dir() and parent not in deleted:
                raise ForktoolError(f"{w.path} needs {parent} to be a directory, but it is a file", where=str(p),
                                    hint="nothing was changed; fix the patch that writes this path")


def _writable_dirs(tree: Path, writes: list[Write]) -> None:
    """Refuse, before anything is committed, a write or removal in a directory this process may not change (a
    read-only directory in the tree): the rename into it would fail halfway through the plan. The nearest directory
    that exists is the one checked (the plan creates the rest). A file's own mode does not matter: it is replaced
    by a rename, never written in place."""
    seen: dict[Path, bool] = {}
    for w in writes:
        d = (tree / w.path).parent
        while d != tree and (d.is_symlink() or not d.is_dir()):  # missing, or a file the plan removes first
            d = d.parent
        if d not in seen:
            seen[d] = os.access(d, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids)
        if not seen[d]:
            shown = d.relative_to(tree).as_posix() if d != tree else "."
            raise ForktoolError(f"{w.path} cannot be {'written' if w.data is not None else 'removed'}: the directory "
                                f"{shown} of the vendored tree is not writable", where=str(d),
                                hint=f"nothing was changed; make it writable (`chmod u+w '{d}'`) and run the "
                                "command again")


def check_plan(tree: Path, writes: list[Write]) -> None:
    """Refuse a plan that could not be carried out to its end: every check commit() makes before the plan is
    committed (callers that make a backup first call it before the backup, so a refusal leaves nothing behind)."""
    seen: set[str] = set()
    for i, w in enumerate(writes):
        resolve_inside(tree, w.path, "transaction")
        if w.path in seen:
            raise ForktoolError(f"{w.path} is written twice in one update", where=str(tree),
                                hint="nothing was changed; this is a bug in forktool, please report it")
        seen.add(w.path)
        if w.mode == SYMLINK and w.data is not None:
            try:
                _check_link(w.path, w.data, Path(), f"writes[{i}]")
            except ForktoolError:
                raise UnsafePathError(f"{w.path}: a symlink pointing outside the vendored tree cannot be written",
                                      where=str(tree / w.path),
                                      hint="nothing was changed; fix the patch that creates this link") from None
    _feasible(tree, writes)


def _stage(path: Path, data: bytes) -> int:
    """Write a staged file (a new name in the fresh journal directory) and return its open descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def commit(tree: Path, state_dir: Path, writes: list[Write], state_after: dict, backup: str | None = None) -> None:
    """Apply writes to tree and record state_after, all or nothing (recoverable after a kill).

    Every staged file is written and fsynced before plan.json (written atomically, fsynced) commits the plan;
    the plan is checked here as recovery would check it, then rolled forward from memory. `backup` names the
    backup taken just before, kept in the plan for `forktool recover` to roll back to.
    """
    tdir = txn_dir(state_dir)
    check_state_dir(state_dir)
    check_plan(tree, writes)
    fds: list[int] = []
    # a journal whose plan is still here is a damaged one `forktool recover` is rolling back (every command leaves
    # only those in place): between its removal and this plan's commit, neither would be left to say what the tree
    # must become (the next command would discard a plan-less journal as one that never started), so the signals
    # that can be held wait until this plan is committed; then the next command rolls it forward
    import signal

    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if os.path.lexists(tdir / "plan.json") else ()
    with signals_held(*held):
        try:
            try:
                if tdir.is_symlink() or tdir.is_file():
                    tdir.unlink()
                elif tdir.exists():
                    remove_tree(tdir)
                (tdir / "new").mkdir(parents=True)
                entries = []
                for n, w in enumerate(writes):
                    staged = None
                    if w.data is not None:
                        staged = str(n)
                        fds.append(_stage(tdir / "new" / staged, w.data))
                        if len(fds) == FSYNC_BATCH:
                            fsync_all(fds)
                            while fds:
                                os.close(fds.pop())
                    entries.append({"path": w.path, "staged": staged, "mode": w.mode,
                                    "sha256": (w.sha256 or sha256_bytes(w.data)) if w.data is not None else None})
                    if n == 0:
                        _fault("staging")
                fsync_all(fds)
            finally:
                for fd in fds:
                    os.close(fd)
            plan = {"entries": entries, "state": state_after}
            if backup is not None:
                plan["backup"] = backup
            atomic_write(tdir / "plan.json", json.dumps(plan, sort_keys=True).encode())
        except OSError as e:
            # nothing in the tree moved yet: drop the half-made journal and say why
            try:
                remove_tree(tdir)
            except OSError:
                pass
            if schema.is_no_space(e):
                raise schema.no_space(e, str(tdir)) from None
            raise ForktoolError(f"could not stage the update: {e}", where=str(tdir),
                                hint="nothing was changed; fix the cause and run the command again") from None
    _fault("committed")
    _roll_forward(tree, state_dir, plan)


RECOVER_HINT = ("`forktool recover` shows it and rolls the tree back to the backup taken before the update; "
                "`forktool recover --discard` drops the journal and keeps the tree as it is; either checks the tree "
                "afterwards")


DAMAGED = "the journal of an interrupted update is damaged or not forktool's: "


def _damaged(tdir: Path, why: str) -> ForktoolError:
    return ForktoolError(f"{DAMAGED}{why}",
                         where=str(tdir / "plan.json"), hint=f"nothing was changed. {RECOVER_HINT}")


def _read_plan(tree: Path, state_dir: Path, state_schema: str | None = None) -> dict[str, Any]:
    """The committed plan, checked against the journal schema and against the tree, before anything moves."""
    tdir = txn_dir(state_dir)
    if tdir.is_symlink() or not tdir.is_dir():
        raise _damaged(tdir, f"{tdir} is not a directory")
    new = tdir / "new"
    if new.is_symlink() or (os.path.lexists(new) and not new.is_dir()):
        raise _damaged(tdir, f"{new} is not a directory")
    try:
        plan = schema.load_json(tdir / "plan.json", "journal", root=state_dir, limit=schema.STATE_LIMIT)
        if state_schema:
            schema.check(plan["state"], state_schema, f"{tdir / 'plan.json'}: state")
    except ForktoolError as err:
        raise _damaged(tdir, f"{err.what} ({err.where})") from None
    seen: set[str] = set()
    for i, e in enumerate(plan["entries"]):
        w = f"entries[{i}]"
        if e["path"] in seen:
            raise _damaged(tdir, f"{w}: {e['path']} appears twice")
        seen.add(e["path"])
        try:
            resolve_inside(tree, e["path"], f"journal {w}")
        except ForktoolError as err:
            raise _damaged(tdir, f"{w}: {err.what}") from None
        if e["staged"] is None:
            continue
        src = new / e["staged"]
        if not os.path.lexists(src):
            continue  # already moved before a crash
        if src.is_symlink() or not src.is_file():
            raise _damaged(tdir, f"{w}: staged file {src} is not a regular file")
        data = src.read_bytes()
        if e.get("sha256") and sha256_bytes(data) != e["sha256"]:
            raise _damaged(tdir, f"{w}: staged file {src} does not match its sha256")
        if e["mode"] == SYMLINK:
            _check_link(e["path"], data, tdir, w)
    return plan


def _check_link(rel: str, target: bytes, tdir: Path, where: str) -> None:
    """A symlink the journal would create must point inside the tree, judged from the link's own directory."""
    try:
        text = target.decode("utf-8")
    except UnicodeDecodeError:
        raise _damaged(tdir, f"{where}: symlink target of {rel} is not UTF-8") from None
    parts = list(PurePosixPath(rel).parent.parts)
    if not text or text.startswith("/") or "\0" in text:
        raise _damaged(tdir, f"{where}: symlink {rel} -> {text!r} points outside the vendored tree")
    for part in text.split("/"):
        if part == "..":
            if not parts:
                raise _damaged(tdir, f"{where}: symlink {rel} -> {text!r} points outside the vendored tree")
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)


def _move(tree: Path, tdir: Path, e: dict[str, Any], made_dirs: frozenset[str] = frozenset()) -> bool:
    """Carry out one journal entry (idempotent: a staged file already moved is skipped); True for a removal.

    made_dirs: the directories the plan's writes create; a removed file found as one of them was removed, and
    its path then filled by those writes, before a crash."""
    target = resolve_inside(tree, e["path"], "journal")
    if e["staged"] is None:
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir() and e["path"] in made_dirs:
            pass
        elif target.exists():
            raise ForktoolError(f"{e['path']} is not a file and cannot be removed", where=str(target),
                                hint="move it out of the tree (forktool removes only files) and run the command "
                                     "again")
        return True
    src = tdir / "new" / e["staged"]
    if src.exists():  # gone: already moved before a crash
        target.parent.mkdir(parents=True, exist_ok=True)
        if e["mode"] == SYMLINK:
            if target.is_symlink() or target.is_file():
                target.unlink()
            target.symlink_to(src.read_text())
            src.unlink()
        else:
            os.chmod(src, 0o755 if e["mode"] == EXECUTABLE else 0o644)
            os.replace(src, target)
    return False


def _roll_forward(tree: Path, state_dir: Path, plan: dict[str, Any]) -> None:
    """Carry out a committed plan, then record its state and drop the journal.

    The first entry, every removal and every symlink go one by one in the plan's order (a removal can make
    room for a later write); the other entries, regular files replaced by their staged copies, are
    independent of each other and of order, so they are renamed concurrently: a rename that frees the
    replaced file's blocks waits on the filesystem, and concurrent ones are served together. Each entry is
    idempotent, so after a crash at any point recovery carries out the same plan again.
    """
    tdir = txn_dir(state_dir)
    removed = []
    entries = plan["entries"]
    made = frozenset(p[:i] for e in entries if e["staged"] is not None for p in [e["path"]]
                     for i in range(len(p)) if p[i] == "/")
    try:
        later = []
        for n, e in enumerate(entries):
            if n and e["staged"] is not None and e["mode"] != SYMLINK:
                later.append(e)
                continue
            if _move(tree, tdir, e, made):
                removed.append(e["path"])
            if n == 0:
                _fault("replacing")
        run_all(lambda e: _move(tree, tdir, e, made), later)
        remove_empty_parents(tree, removed)
        # the temp file inside the journal: a kill before the rename leaves it where the journal's removal takes it
        atomic_write(state_dir / "state.json", json.dumps(plan["state"], indent=1, sort_keys=True).encode(),
                     temp_dir=tdir)
    except OSError as e:
        what = "no space left on the device" if schema.is_no_space(e) else str(e)
        raise ForktoolError(
            f"the update could not finish: {what}", where=str(tdir),
            hint="the journal is kept, so no work is lost: fix the cause and run any forktool command to finish it; "
                 "or give up on it: " + RECOVER_HINT
        ) from None
    _fault("state-written")
    _drop(tdir)


def _drop(tdir: Path) -> None:
    """Remove a journal whose plan is carried out, plan.json last: a kill during the removal leaves a plan, which
    the next command carries out again (every entry is idempotent), never a journal that reads as one whose plan was
    not yet committed (and so is reported as having left the tree untouched)."""
    for entry in os.scandir(tdir):
        if entry.name == "plan.json":
            continue
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            os.unlink(entry.path)
    _fault("dropping")
    if os.path.lexists(tdir / "plan.json"):
        os.unlink(tdir / "plan.json")
    os.rmdir(tdir)


class Journal(NamedTuple):
    """An interrupted update as `forktool recover` shows it: its plan when it can be read, else why not."""

    path: Path
    damaged: str  # why it cannot be carried out ('' when it can)
    started: bool  # a plan was committed (else only staging began and the tree was never touched)
    paths: list[str]  # the files it writes or removes (empty when damaged)
    backup: str | None  # the backup taken just before it, when the plan names one


def inspect(tree: Path, state_dir: Path, state_schema: str | None = None) -> Journal | None:
    """The journal in state_dir, read and checked without moving anything; None when there is none."""
    tdir = txn_dir(state_dir)
    check_state_dir(state_dir)
    if not os.path.lexists(tdir):
        return None
    if not (os.path.lexists(tdir / "plan.json") or tdir.is_symlink() or not tdir.is_dir()):
        return Journal(tdir, "", False, [], None)
    try:
        plan = _read_plan(tree, state_dir, state_schema)
    except ForktoolError as e:
        return Journal(tdir, e.what.removeprefix(DAMAGED), True, [], _named_backup(tdir))
    return Journal(tdir, "", True, [e["path"] for e in plan["entries"]], plan.get("backup"))


def _named_backup(tdir: Path) -> str | None:
    """The backup a damaged plan names, when that one field can still be read (nothing else is trusted)."""
    try:
        raw = json.loads(schema.read_regular(tdir / "plan.json", "plan.json", schema.STATE_LIMIT, tdir.parent))
        name = raw.get("backup") if isinstance(raw, dict) else None
        schema.check({"entries": [], "state": {}, "backup": name}, "journal", str(tdir / "plan.json"))
        return name
    except (ForktoolError, ValueError, TypeError, RecursionError):
        return None


def discard(state_dir: Path) -> None:
    """Drop the journal in state_dir without carrying out any of it (the caller holds the project lock)."""
    tdir = txn_dir(state_dir)
    check_state_dir(state_dir)
    if tdir.is_symlink() or (os.path.lexists(tdir) and not tdir.is_dir()):
        tdir.unlink()
    elif os.path.lexists(tdir):
        remove_tree(tdir)


def recover(tree: Path, state_dir: Path, state_schema: str | None = None) -> str | None:
    """Finish or discard an interrupted transaction; returns what was done, if anything.

    A journal that fails its checks is refused as a whole: nothing is moved, and the error says how to discard it.
    """
    tdir = txn_dir(state_dir)
    check_state_dir(state_dir)
    if not os.path.lexists(tdir):
        return None
    if os.path.lexists(tdir / "plan.json") or tdir.is_symlink() or not tdir.is_dir():
        plan = _read_plan(tree, state_dir, state_schema)
        _roll_forward(tree, state_dir, plan)
        return "finished an interrupted update (rolled forward from the journal)"
    remove_tree(tdir)
    return "discarded an interrupted update that had not started writing (tree untouched)"
