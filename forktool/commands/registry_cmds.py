"""registry check | render, and markers: the UPSTREAM_SYNC registry against series and tree."""

from __future__ import annotations

from pathlib import Path

from forktool import registry as rg
from forktool.cache import caches_root
from forktool.commands import open_workspace
from forktool.errors import ForktoolError
from forktool.markers import scan_file
from forktool.output import Report, escape
from forktool.project import Project
from forktool.regcheck import registry_problems, render_md
from forktool.tree import atomic_write
from forktool.workspace import require_tree


def _path(project: Project) -> Path:
    return project.registry_dir / "UPSTREAM_SYNC.yaml"


def check(project: Project) -> Report:
    rg.load(_path(project))  # a registry that does not load is a refusal here, with its own error
    with open_workspace(project) as ws:
        problems, warnings, summary = registry_problems(ws, None, caches_root(ws.state_dir)) or ([], [], {})
        # sites are checked on the series applied in memory: an edit of the tree is not (verify names it)
        absent = not project.tree.exists()
        edited = ws.local_changes() if not absent else []
    # escaped: a symbol or a path is shown as written, never read as markup (`x[red]y[/red]` lost its brackets)
    lines = [f"[red]✗[/red] {escape(str(p))}" for p in problems] + [
        f"[yellow]advisory:[/yellow] {escape(w)}" for w in warnings]
    if problems:
        lines += [f"[red]error:[/red] registry check found {len(problems)} problem(s)",
                  "  next: fix each item (docs/registry.md says which keys a person writes; `forktool refresh ID` "
                  "rewrites the ones the tool derives), then run `forktool registry check` again"]
    else:
        lines.append(f"registry: OK ({summary['patches']} patches, {summary['hooks']} hooks, "
                     "all markers at their sites)")
    if absent:
        lines.append("[yellow]not checked:[/yellow] the vendored tree, which is absent (sites are checked on the "
                     "series applied in memory; `forktool apply` makes the tree)")
    elif edited:
        lines.append(f"[yellow]not checked:[/yellow] the sites of the markers in the {len(edited)} file(s) of the "
                     "tree that no patch explains (sites are checked on the series; `forktool status` lists the "
                     "files, `forktool refresh ID` takes them into a patch)")
    return Report({"ok": not problems, "problems": [{"where": p.where, "what": p.what} for p in problems],
                   **({"error": f"registry check found {len(problems)} problem(s)"} if problems else {}),
                   "advisories": warnings, "patches": summary["patches"], "hooks": summary["hooks"],
                   "not_checked": ["tree"] if edited or absent else []}, lines, exit_code=1 if problems else 0)


def markers(project: Project) -> Report:
    with open_workspace(project) as ws:
        # an empty list would read as a tree without markers
        require_tree(project.tree, ", so there are no markers to list", "`forktool apply` makes the tree with the "
                     "series applied; `forktool registry check` checks the series' markers without it")
        found = []
        for rel in sorted(set(ws.state.files) | {p for _, p in ws.local_changes()}):
            found.extend(scan_file(rel, ws.disk_bytes(rel) or b""))
    return Report({"markers": [m.to_json() for m in found]}, [escape(f"{m.path}:{m.line}:{m.hook}") for m in found]
                  or ["no markers in the tree (is the series applied?)"])


def _md_path(project: Project) -> Path:
    return project.registry_dir / "UPSTREAM_SYNC.md"


def render(project: Project, check_only: bool) -> Report:
    reg = rg.load(_path(project))
    text = render_md(reg)
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
