"""backup create | list | restore | prune."""

from __future__ import annotations

from forktool import backup as bk
from forktool import txn
from forktool.commands import open_workspace
from forktool.errors import UsageError
from forktool.output import Report
from forktool.project import Project
from forktool.tree import scan
from forktool.workspace import require_tree


def create(project: Project, slug: str) -> Report:
    if not slug.strip() or any(ord(ch) < 32 for ch in slug):
        raise UsageError(f"backup slug {slug!r} is empty or holds a control character", where="backup create SLUG",
                         hint="give a short name, e.g. `forktool backup create before-edit`")
    # a backup of no files would restore as an empty tree
    require_tree(project.tree, ", so there is nothing to back up", "`forktool apply` makes the tree with the series applied")
    with open_workspace(project) as ws:
        b = bk.create(project.backups_dir, project.tree, slug, "manual backup", scan(project.tree), ws.pristine,
                      ws.state.to_json())
    return Report(b.to_json(), [f"backup [bold]{b.name}[/bold]: {b.files} files, {b.stored} stored "
                                "(the rest are pristine)"])


def list_(project: Project) -> Report:
    txn.check_state_dir(project.state_dir)
    bs = bk.list_backups(project.backups_dir)
    sync = bk.list_backups(bk.sync_backups_dir(project))
    lines = [f"{b.name}  {b.files} files, {b.stored} stored  {b.reason}" for b in bs]
    lines += [f"{bk.SYNC_PREFIX}{b.name}  {b.files} project files  {b.reason}" for b in sync]
    return Report({"backups": [b.to_json() for b in bs], "sync_backups": [b.to_json() for b in sync]},
                  lines or ["no backups"])


def restore(project: Project, name: str) -> Report:
    with open_workspace(project) as ws:
        if name.startswith(bk.SYNC_PREFIX):
            res = ws.restore_sync(name[len(bk.SYNC_PREFIX):])
        else:
            res = ws.restore(name)
    return Report(res, [f"restored {name}: wrote {len(res['written'])} file(s)"
                        + (f"; previous tree backed up as {res['backup']}" if res["backup"] else "")
                        + (f", previous project files as sync/{res['sync_backup']}" if res.get("sync_backup")
                           else "")])


def prune(project: Project, keep: int) -> Report:
    """The newest `keep` of the tree's backups and of the sync's each stay, and so does every backup a sync
    in progress or the last finished sync needs."""
    with txn.locked(project.state_dir):  # never delete a backup another command is reading
        needed = bk.in_use(project)
        gone, held = bk.prune(project.backups_dir, keep, needed)
        sync_gone, sync_held = bk.prune(bk.sync_backups_dir(project), keep, needed)
    gone += [bk.SYNC_PREFIX + n for n in sync_gone]
    held += [bk.SYNC_PREFIX + n for n in sync_held]
    lines = [f"removed {len(gone)} backup(s), kept the newest {keep}"]
    if held:
        lines.append(f"also kept {len(held)} backup(s) a sync needs (`forktool sync --abort` or its undo): "
                     + ", ".join(held))
    return Report({"removed": gone, "kept": keep, "kept_for_sync": held}, lines)
