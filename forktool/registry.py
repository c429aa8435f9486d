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
    parts: tuple[tuple[str, str], ...] = ()  # (name, what it checks) of a gate made of parts, in the registry's order

    def part_of(self, reported: str) -> str | None:
        """The declared part a reported part belongs to: its own name, or its family before the first '.' (gates.cpu
        reports `a.llama` for part a on one model); None where the registry declares neither."""
        names = dict(self.parts)
        if reported in names:
            return reported
        family = reported.split(".", 1)[0]
        return family if family in names else None


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
    top = read_yaml_mapping(path, "registry", "restore it from git, or start one: write `schema: 1`, `patches: []` "
                            "and `hooks: {}` there and run `forktool apply --reanchor`, which fills it (docs/registry.md)")
    return from_data(top, path)


def from_data(top: dict, path: Path) -> Registry:
    """The model of registry data already checked against its schema."""
    from forktool import schemas
    reg = Registry(path)
    seen: set[str] = set()
    for i, d in enumerate(top["patches"]):
        w = f"{path}: patches[{i}]"
        pid = d["id"]
        if pid in seen:
            raise ConfigError(f"duplicate patch id {pid}", where=f"{w}.id",
                              hint=schemas.fix("registry", "one of the two entries"))
        seen.add(pid)
        gates = tuple(Gate(g["name"], tuple(g["needs"]), tuple(g["command"]), g["proves"], g.get("timeout", 1800),
                           tuple((g.get("parts") or {}).items()))
                      for g in d.get("gates") or [])
        reg.patches.append(PatchEntry(
            pid, d["file"], d["title"], d.get("bug", ""), d["status"], d.get("shipped", ""), tuple(d["build_impact"]),
            tuple(d["files"]), tuple(d["hooks"]), gates, d.get("description", "")))
    for hid, d in top["hooks"].items():
        sites = tuple(Site(s["file"], s["symbol"], s.get("line")) for s in d["sites"])
        reg.hooks[hid] = Hook(hid, d["patch"], d.get("description", ""), sites)
    return reg


def gate_data(g: Gate) -> dict:
    d = {"name": g.name, "needs": list(g.needs), "command": list(g.command), "proves": g.proves,
         "timeout": g.timeout}
    if g.parts:
        d["parts"] = dict(g.parts)
    return d


def patch_data(p: PatchEntry) -> dict:
    """One patch entry as YAML data: the keys the schema requires always, the optional ones when set."""
    return {k: v for k, v in {
        "id": p.id, "file": p.file, "title": p.title, "bug": p.bug, "status": p.status, "shipped": p.shipped,
        "description": p.description, "build_impact": list(p.build_impact), "files": list(p.files),
        "hooks": list(p.hooks), "gates": [gate_data(g) for g in p.gates]}.items()
        if k in ("build_impact", "files", "hooks") or v not in ("", [])}


def site_data(s: Site) -> dict:
    return {k: v for k, v in {"file": s.file, "symbol": s.symbol, "line": s.line}.items() if v is not None}


def hook_data(h: Hook) -> dict:
    return {k: v for k, v in {"patch": h.patch, "description": h.description,
                              "sites": [site_data(s) for s in h.sites]}.items() if v != ""}


def dump(reg: Registry) -> str:
    """YAML text for the whole registry (forktool/regfile.py edits an existing file in place instead)."""
    data = {"schema": 1, "patches": [patch_data(p) for p in reg.patches],
            "hooks": {h.id: hook_data(h) for h in reg.hooks.values()}}
    import yaml  # only when the registry is written back

    return yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True)
