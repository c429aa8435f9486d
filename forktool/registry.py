"""The UPSTREAM_SYNC registry: a strict schema, and the two-way check against series, patches and tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from forktool.errors import ConfigError
from forktool.project import read_yaml_mapping


@dataclass(frozen=True)
class Gate:
    name: str
    needs: tuple[str, ...]
    command: tuple[str, ...]
    proves: str
    timeout: int


@dataclass(frozen=True)
class Site:
    file: str
    symbol: str
    line: int | None


@dataclass(frozen=True)
class Hook:
    id: str
    patch: str
    description: str
    sites: tuple[Site, ...]


@dataclass(frozen=True)
class PatchEntry:
    id: str
    file: str
    title: str
    bug: str
    status: str
    shipped: str
    build_impact: tuple[str, ...]
    files: tuple[str, ...]
    hooks: tuple[str, ...]
    gates: tuple[Gate, ...]
    description: str = ""


@dataclass
class Registry:
    path: Path
    patches: list[PatchEntry] = field(default_factory=list)
    hooks: dict[str, Hook] = field(default_factory=dict)

    def patch(self, pid: str) -> PatchEntry | None:
        return next((p for p in self.patches if p.id == pid), None)


def load(path: Path) -> Registry:
    """registry/UPSTREAM_SYNC.yaml checked against its schema (forktool/schemas.py), then cross-checked."""
    top = read_yaml_mapping(path, "registry", "the registry lives there")
    reg = Registry(path)
    seen: set[str] = set()
    for i, d in enumerate(top["patches"]):
        w = f"{path}: patches[{i}]"
        pid = d["id"]
        if pid in seen:
            raise ConfigError(f"duplicate patch id {pid}", where=f"{w}.id")
        seen.add(pid)
        gates = tuple(Gate(g["name"], tuple(g["needs"]), tuple(g["command"]), g["proves"], g.get("timeout", 1800))
                      for g in d.get("gates") or [])
        reg.patches.append(PatchEntry(
            pid, d["file"], d["title"], d.get("bug", ""), d["status"], d.get("shipped", ""), tuple(d["build_impact"]),
            tuple(d["files"]), tuple(d["hooks"]), gates, d.get("description", "")))
    for hid, d in top["hooks"].items():
        sites = tuple(Site(s["file"], s["symbol"], s.get("line")) for s in d["sites"])
        reg.hooks[hid] = Hook(hid, d["patch"], d.get("description", ""), sites)
    return reg


def dump(reg: Registry) -> str:
    """YAML text for the registry (used to update advisory line numbers)."""
    def gate(g: Gate) -> dict:
        return {"name": g.name, "needs": list(g.needs), "command": list(g.command), "proves": g.proves,
                "timeout": g.timeout}
    data = {
        "schema": 1,
        "patches": [{k: v for k, v in {
            "id": p.id, "file": p.file, "title": p.title, "bug": p.bug, "status": p.status, "shipped": p.shipped,
            "description": p.description, "build_impact": list(p.build_impact), "files": list(p.files),
            "hooks": list(p.hooks), "gates": [gate(g) for g in p.gates]}.items() if v not in ("", [])}
            for p in reg.patches],
        "hooks": {h.id: {k: v for k, v in {"patch": h.patch, "description": h.description,
                                            "sites": [{k2: v2 for k2, v2 in {"file": s.file, "symbol": s.symbol,
                                                                             "line": s.line}.items() if v2 is not None}
                                                      for s in h.sites]}.items() if v != ""}
                  for h in reg.hooks.values()},
    }
    import yaml  # only when the registry is written back

    return yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True)
