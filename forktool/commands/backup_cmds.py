"""backup create | list | restore | prune."""

from __future__ import annotations

from forktool import backup as bk
from forktool import txn
from forktool.commands import open_workspace
from forktool.errors import UsageError
from forktool.output import Report
from forktool.project import Project
from forktool.tree import scan


def create(project: Project, slug: str) -> Report:
    if not slug.strip() or any(ord(ch) < 32 for ch in slug):
        raise UsageError(f"backup slug {slug!r} is empty or holds a control character", where="backup create SLUG",
                         hint="give a short name, e.g. `forktool backup create before-edit`")
    with open_workspace(project) as ws:
        b = bk.create(project.backups_dir, project.tree, slug, "manual backup", scan(project.tree), ws.pristine,
                      ws.state.to_json())
    return Report(b.to_json(), [f"backup [bold]{b.name}[/bold]: {b.files} files, {b.stored} stored "
                                "(the rest are pristine)"])


def list_(project: Project) -> Report:
    txn.check_state_dir(project.state_dir)
    bs = bk.list_backups(project.backups_dir)
    lines = [f"{b.name}  {b.files} files, {b.stored} stored  {b.reason}" for b in bs] or ["no backups"]
    return Report({"backups": [b.to_json() for b in bs]}, lines)


def restore(project: Project, name: str) -> Report:
    with open_workspace(project) as ws:
        res = ws.restore(name)
    return Report(res, [f"restored {name}: wrote {len(res['written'])} file(s)"
                        + (f"; previous tree backed up as {res['backup']}" if res["backup"] else "")])


def prune(project: Project, keep: int) -> Report:
    with txn.locked(project.state_dir):  # never delete a backup another command is reading
        gone = bk.prune(project.backups_dir, keep)
    return Report({"removed": gone, "kept": keep}, [f"removed {len(gone)} backup(s), kept the newest {keep}"])
