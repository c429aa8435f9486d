"""recover: show an interrupted update's journal, then finish it, roll the tree back, or discard it."""

from __future__ import annotations

from forktool import recovery
from forktool.output import Report
from forktool.project import Project


def recover(project: Project, discard: bool, backup: str | None) -> Report:
    res = recovery.recover(project, discard=discard, backup=backup)
    temps = _temps(res)
    if not res["journals"]:
        head = ["no interrupted update", *temps] if temps else ["no interrupted update: nothing to recover"]
        return Report(res, head, exit_code=1 if _kept(res) else 0)
    lines = temps
    for j in res["journals"]:
        lines.append(f"{j['kind']} journal {j['journal']}: "
                     + (f"[yellow]damaged: {j['damaged']}[/yellow]" if j["damaged"] else
                        f"{len(j['files'])} file(s)" if j["started"] else "staging only, never started writing"))
        if j["backup"]:
            lines.append(f"  taken before it: backup {j['backup']}")
        lines.append(f"  {j['action']}" + (f": wrote {len(j['written'])} file(s)" if "written" in j else "")
                     + (f"; the tree as it was is kept as backup {j['saved_as']}" if j.get("saved_as") else ""))
    check = res["check"]
    if not check["checked"]:
        lines.append(f"tree not checked: {check['why']} (`forktool status` shows where it stands; "
                     "`forktool sync --abort` returns to before it)")
        return Report(res, lines, exit_code=1 if _kept(res) else 0)
    if check["clean"]:
        lines.append(f"tree checked: it holds exactly what the recorded state says (top: {check['top'] or 'none'})")
        return Report(res, lines, exit_code=1 if _kept(res) else 0)
    lines.append(f"[yellow]tree checked: {len(check['changes'])} change(s) no patch explains"
                 + (f", applied patch(es) {', '.join(check['stale'])} changed on disk" if check["stale"] else "")
                 + "[/yellow]")
    lines += [f"  {c}" for c in check["changes"][:50]]
    lines.append("next: `forktool apply --force` re-applies the series (backing the changes up first), or "
                 "`forktool backup restore NAME` returns to a backup (`forktool backup list`)")
    return Report(res, lines, exit_code=1)


def _temps(res: dict) -> list[str]:
    """Lines for the temporary files of writes cut short (a kill mid-write leaves one beside its target)."""
    if not res["temps"]:
        return []
    gone = [t for t in res["temps"] if t["removed"]]
    kept = [t for t in res["temps"] if not t["removed"]]
    mins = res["stale_after_s"] // 60
    lines = [f"removed {len(gone)} temporary file(s) of writes cut short (untouched for {mins} min or more):"] if gone \
        else []
    lines += [f"  {t['path']}" for t in gone]
    lines += [f"[yellow]could not remove {t['path']}: {t['why']}[/yellow] (`rm` it: forktool never reads it)"
              for t in kept]
    return lines


def _kept(res: dict) -> bool:
    return any(not t["removed"] for t in res["temps"])
