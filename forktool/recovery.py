"""`forktool recover`: show an interrupted update's journal, then finish it, roll back from its backup or discard it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from forktool import backup as bk
from forktool import schema, txn
from forktool.errors import ForktoolError, UsageError
from forktool.project import Project
from forktool.tree import STALE_TEMP_S, stale_temps
from forktool.workspace import Workspace


def journals(project: Project) -> list[tuple[str, Path, Path, str | None]]:
    """Every journal forktool keeps: (kind, the root its paths are relative to, its directory's parent, the
    schema of the state it records)."""
    return [("tree", project.tree, project.state_dir, "state"),
            ("sync", project.root, project.sync_dir, "sync-state"),
            ("project", project.root, project.project_journal_dir, None)]


def recover(project: Project, *, discard: bool = False, backup: str | None = None) -> dict[str, Any]:
    """Under the project lock: each journal found is shown, then finished when it is intact, discarded with
    `discard`, or (the tree's) rolled back to the backup taken before it (or `backup`); the tree is then checked
    against the recorded state."""
    if discard and backup is not None:
        raise UsageError("--discard and --backup exclude each other", where="forktool recover",
                         hint="--discard keeps the tree as it is; --backup NAME rolls it back to that backup")
    found: list[dict[str, Any]] = []
    with txn.locked(project.state_dir):
        for kind, root, state_dir, state_schema in journals(project):
            j = txn.inspect(root, state_dir, state_schema)
            if j is None:
                continue
            entry: dict[str, Any] = {"kind": kind, "journal": str(j.path), "damaged": j.damaged,
                                     "started": j.started, "files": j.paths, "backup": j.backup}
            found.append(entry)
            if discard or not j.started:
                txn.discard(state_dir)
                entry["action"] = "discarded" if j.started else "discarded (it had not started writing)"
            elif not j.damaged and backup is None:
                txn.recover(root, state_dir, state_schema)
                entry["action"] = "finished (rolled forward)"
            elif kind != "tree":
                undo = ("`forktool sync --abort` puts the project back as it was before the sync" if kind == "sync"
                        else "`forktool backup restore sync/NAME` puts the project files back from a sync's backup")
                raise ForktoolError(f"the {kind} journal is damaged: {j.damaged}", where=str(j.path),
                                    hint=f"nothing was changed; `forktool recover --discard` drops it, then {undo}")
            else:
                name = backup or j.backup or _newest(project)
                ws = Workspace(project)
                res = ws.restore(name)
                entry["action"] = f"rolled back to backup {name}"
                entry["written"] = res["written"]
                entry["saved_as"] = res["backup"]
        check = _check(project) if found else None
        temps = remove_stale_temps(project)
    return {"journals": found, "check": check, "temps": temps, "stale_after_s": STALE_TEMP_S}


# where a write cut short can leave its temporary file, and how deep below: the project's records and caches (not
# into journals, which own theirs, backups, or downloads, which the next fetch clears), its patches, registry and
# pin, and the shared cache's entries (not its unpacked trees); the vendored tree itself is written only through a
# journal
_SKIP_STATE = frozenset({"txn", "vendor-backups", "sync-backups", "tmp"})
_SKIP_CACHE = frozenset({"pristine", "git"})


def remove_stale_temps(project: Project) -> list[dict[str, Any]]:
    """Remove the temporary files that writes cut short by a kill left (each untouched for STALE_TEMP_S, so no
    running write's, in this project or another sharing the cache); each is named, with whether it went."""
    now = time.time()
    found = stale_temps(project.state_dir, depth=16, now=now, skip=_SKIP_STATE)
    for d in (project.patches_dir, project.registry_dir, project.vendor_yaml.parent):
        found += stale_temps(d, depth=0, now=now)
    try:
        found += stale_temps(project.cache_dir, depth=2, now=now, skip=_SKIP_CACHE)
    except ForktoolError:  # a cache that is not a directory holds none; every command that needs it says so
        pass
    out: list[dict[str, Any]] = []
    for p in found:
        try:
            os.unlink(p)
            out.append({"path": str(p), "removed": True})
        except OSError as e:
            out.append({"path": str(p), "removed": False, "why": e.strerror})
    return out


def _newest(project: Project) -> str:
    usable = [b for b in bk.list_backups(project.backups_dir) if b.tree_digest]
    if not usable:
        raise ForktoolError("the journal does not name its backup and there is no backup to roll back to",
                            where=str(project.backups_dir), hint="nothing was changed; `forktool recover --discard` "
                            "drops the journal and keeps the tree as it is")
    return usable[-1].name


def _check(project: Project) -> dict[str, Any]:
    """The tree against the recorded state and the series, as `forktool status` judges it; not checked while a
    sync holds the tree (its own state says what the tree should be: `forktool status` shows it)."""
    st = schema.load_sync_state(project.sync_dir / "state.json", project.state_dir)
    if st is not None and st["stage"] in ("starting", "stopped", "finishing"):
        return {"checked": False, "why": f"a sync to {st['to_spec']} is in progress ({st['stage']}); the tree "
                "belongs to it", "clean": None, "changes": [], "stale": [], "top": None}
    ws = Workspace(project)
    changes = ws.local_changes()
    stale = ws.applied_stale()
    return {"checked": True, "clean": not changes and not stale, "changes": [f"{s}: {p}" for s, p in changes],
            "stale": stale, "top": ws.state.top}
