"""Hook relocation: find every registered site's enclosing symbol again in the result on the new upstream."""

from __future__ import annotations

import dataclasses
import re

from forktool.errors import ConfigError
from forktool.project import Project
from forktool.registry import Registry
from forktool.sync.trial import Reader
from forktool.tree import Manifest

SOURCE_EXTS = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh")


def _component_sources(manifest: Manifest, prefix: str) -> list[str]:
    return sorted(p for p in manifest if p.startswith(prefix) and p.endswith(SOURCE_EXTS))


def relocate_hooks(project: Project, read: Reader, manifest: Manifest, prefix: str) -> tuple[dict, str | None]:
    """Find every registered hook site's symbol again in the new tree (advisory line numbers); also the
    registry text with the sites that were found moved to their new place (None without a registry)."""
    from forktool import registry
    found, reg = relocate(project, read, manifest, prefix)
    return found, registry.dump(reg) if reg is not None else None


def _file_scope_marker(data: bytes, hook: str) -> int | None:
    """Line of the first marker for hook that stands at file scope (a site whose symbol is FILE_SCOPE)."""
    from forktool import symbols
    from forktool.markers import scan_file
    for m in scan_file("", data):
        if m.hook == hook and symbols.site_symbol(data, m.line) == symbols.FILE_SCOPE:
            return m.line
    return None


def relocate(project: Project, read: Reader, manifest: Manifest, prefix: str) -> tuple[dict, Registry | None]:
    """relocate_hooks, returning the registry with the found sites moved (None without a readable one)."""
    path = project.registry_dir / "UPSTREAM_SYNC.yaml"
    if not path.is_file():
        return {"registry": False, "sites": []}, None
    from forktool import registry, symbols
    try:
        reg = registry.load(path)
    except ConfigError as e:
        # the trial is still worth reporting; the broken registry is one more thing for a human
        return {"registry": True, "sites": [], "error": str(e)}, None
    candidates = _component_sources(manifest, prefix)
    sites = []
    for hid, hook in sorted(reg.hooks.items()):
        for s in hook.sites:
            rel = s.file if s.file in manifest or not prefix or s.file.startswith(prefix) else prefix + s.file
            row = {"hook": hid, "patch": hook.patch, "symbol": s.symbol, "file": s.file, "line": s.line,
                   "new_file": None, "new_line": None, "status": "vanished"}
            data = read(rel)
            if data is not None and s.symbol == symbols.FILE_SCOPE:
                line = _file_scope_marker(data, hid)
            else:
                line = symbols.find_symbol(data, s.symbol) if data is not None else None
            if line is not None:
                row.update(new_file=s.file, new_line=line, status="found" if line == s.line else "moved_lines")
            else:
                needle = re.split(r"::|\.", s.symbol)[-1].encode()
                for other in candidates:
                    if other == rel:
                        continue
                    text = read(other)
                    if text is None or needle not in text:
                        continue
                    hit = symbols.find_symbol(text, s.symbol)
                    if hit is not None:
                        shown = other if s.file.startswith(prefix) or not prefix else other[len(prefix):]
                        row.update(new_file=shown, new_line=hit, status="moved_file")
                        break
            sites.append(row)
    moved = iter(sites)
    for hid, hook in sorted(reg.hooks.items()):
        new_sites = []
        for site in hook.sites:
            row = next(moved)
            if row["new_line"] is not None:
                site = dataclasses.replace(site, file=str(row["new_file"]), line=int(row["new_line"]))
            new_sites.append(site)
        reg.hooks[hid] = dataclasses.replace(hook, sites=tuple(new_sites))
    return {"registry": True, "sites": sites}, reg

