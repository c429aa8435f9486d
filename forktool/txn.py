"""Crash-safe tree updates: stage everything, mark the plan committed, then replace; a journal finishes the job."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from forktool.errors import ForktoolError
from forktool.tree import EXECUTABLE, SYMLINK, atomic_write, remove_empty_parents, resolve_inside


@dataclass(frozen=True)
class Write:
    path: str
    data: bytes | None  # None: delete
    mode: str


def _fault(point: str) -> None:
    # fault injection for the crash tests: FORKTOOL_FAULT=<point> kills the process right here
    if os.environ.get("FORKTOOL_FAULT") == point:
        os._exit(137)


@contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ForktoolError("another forktool command is running in this project", where=str(state_dir),
                                hint="wait for it to finish") from None
        yield


def txn_dir(state_dir: Path) -> Path:
    return state_dir / "txn"


def commit(tree: Path, state_dir: Path, writes: list[Write], state_after: dict) -> None:
    """Apply writes to tree and record state_after, all or nothing (recoverable after a kill)."""
    tdir = txn_dir(state_dir)
    if tdir.exists():
        shutil.rmtree(tdir)
    (tdir / "new").mkdir(parents=True)
    entries = []
    for n, w in enumerate(writes):
        resolve_inside(tree, w.path, "transaction")
        staged = None
        if w.data is not None:
            staged = str(n)
            atomic_write(tdir / "new" / staged, w.data)
        entries.append({"path": w.path, "staged": staged, "mode": w.mode})
        if n == 0:
            _fault("staging")
    plan = {"entries": entries, "state": state_after}
    atomic_write(tdir / "plan.json", json.dumps(plan, sort_keys=True).encode())
    _fault("committed")
    _roll_forward(tree, state_dir)


def _roll_forward(tree: Path, state_dir: Path) -> None:
    tdir = txn_dir(state_dir)
    plan = json.loads((tdir / "plan.json").read_text())
    removed = []
    for n, e in enumerate(plan["entries"]):
        target = resolve_inside(tree, e["path"], "journal")
        if e["staged"] is None:
            if target.is_symlink() or target.exists():
                target.unlink()
            removed.append(e["path"])
        else:
            src = tdir / "new" / e["staged"]
            if src.exists():  # gone: already moved before a crash
                target.parent.mkdir(parents=True, exist_ok=True)
                if e["mode"] == SYMLINK:
                    if target.is_symlink() or target.exists():
                        target.unlink()
                    target.symlink_to(src.read_text())
                    src.unlink()
                else:
                    os.chmod(src, 0o755 if e["mode"] == EXECUTABLE else 0o644)
                    os.replace(src, target)
        if n == 0:
            _fault("replacing")
    remove_empty_parents(tree, removed)
    atomic_write(state_dir / "state.json", json.dumps(plan["state"], indent=1, sort_keys=True).encode())
    _fault("state-written")
    shutil.rmtree(tdir)


def recover(tree: Path, state_dir: Path) -> str | None:
    """Finish or discard an interrupted transaction; returns what was done, if anything."""
    tdir = txn_dir(state_dir)
    if not tdir.exists():
        return None
    if (tdir / "plan.json").is_file():
        _roll_forward(tree, state_dir)
        return "finished an interrupted update (rolled forward from the journal)"
    shutil.rmtree(tdir)
    return "discarded an interrupted update that had not started writing (tree untouched)"
