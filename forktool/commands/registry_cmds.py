"""registry check | render, and markers: the UPSTREAM_SYNC registry against series and tree."""

from __future__ import annotations

from pathlib import Path

import jinja2

from forktool import registry as rg
from forktool.errors import ForktoolError
from forktool.markers import scan_file
from forktool.output import Report
from forktool.project import Project
from forktool.regcheck import Problem
from forktool.regcheck import check as run_check
from forktool.tree import atomic_write
from forktool.workspace import open_workspace


def _path(project: Project) -> Path:
    return project.registry_dir / "UPSTREAM_SYNC.yaml"


def check(project: Project) -> Report:
    reg = rg.load(_path(project))
    with open_workspace(project) as ws:
        problems, warnings = run_check(ws, reg)
    md = _md_path(project)
    if not md.exists() or md.read_text() != render_text(project, reg):
        problems.append(Problem("registry/UPSTREAM_SYNC.md", "is stale; run `forktool registry render`"))
    lines = [f"[red]✗[/red] {p}" for p in problems] + [f"[yellow]advisory:[/yellow] {w}" for w in warnings]
    if not problems:
        lines.append(f"registry: OK ({len(reg.patches)} patches, {len(reg.hooks)} hooks, all markers at their sites)")
    return Report({"ok": not problems, "problems": [{"where": p.where, "what": p.what} for p in problems],
                   "advisories": warnings, "patches": len(reg.patches), "hooks": len(reg.hooks)},
                  lines, exit_code=1 if problems else 0)


def check_if_present(project: Project) -> Report | None:
    """The registry check, or None when the project keeps no registry."""
    if not _path(project).is_file():
        return None
    return check(project)


def markers(project: Project) -> Report:
    with open_workspace(project) as ws:
        found = []
        for rel in sorted(set(ws.state.files) | {p for _, p in ws.local_changes()}):
            found.extend(scan_file(rel, ws.disk_bytes(rel) or b""))
    return Report({"markers": [m.to_json() for m in found]}, [f"{m.path}:{m.line}:{m.hook}" for m in found]
                  or ["no markers in the tree (is the series applied?)"])


def _md_path(project: Project) -> Path:
    return project.registry_dir / "UPSTREAM_SYNC.md"


def render_text(project: Project, reg: rg.Registry) -> str:
    env = jinja2.Environment(loader=jinja2.PackageLoader("forktool", "templates"), keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env.get_template("UPSTREAM_SYNC.md.j2").render(reg=reg)


def render(project: Project, check_only: bool) -> Report:
    reg = rg.load(_path(project))
    text = render_text(project, reg)
    md = _md_path(project)
    current = md.read_text() if md.exists() else None
    if check_only:
        if current != text:
            raise ForktoolError("registry/UPSTREAM_SYNC.md is stale", where=str(md),
                                hint="run `forktool registry render` and commit the result")
        return Report({"stale": False, "path": str(md)}, ["registry/UPSTREAM_SYNC.md is current"])
    if current != text:
        atomic_write(md, text.encode())
    return Report({"written": current != text, "path": str(md)},
                  [f"{'wrote' if current != text else 'unchanged:'} {md.relative_to(project.root)}"])
