"""The UPSTREAM_SYNC registry: a strict schema, and the two-way check against series, patches and tree."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from forktool.errors import ConfigError
from forktool.project import read_yaml_mapping

STATUSES = ("dev", "shipped", "upstreamed", "dropped")
NEEDS = ("cpu", "cuda")
HOOK_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


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


def _keys(raw: Any, where: str, required: set[str], optional: set[str]) -> dict:
    if not isinstance(raw, dict):
        raise ConfigError("expected a mapping", where=where)
    unknown = sorted(set(raw) - required - optional)
    if unknown:
        raise ConfigError(f"unknown key(s): {', '.join(unknown)}", where=f"{where}.{unknown[0]}",
                          hint=f"allowed: {', '.join(sorted(required | optional))}")
    missing = sorted(required - set(raw))
    if missing:
        raise ConfigError(f"missing key(s): {', '.join(missing)}", where=where)
    return raw


def _strs(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ConfigError("expected a list of strings", where=where)
    return tuple(raw)


def _str(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"expected a string, got {type(raw).__name__} (quote it in YAML)", where=where)
    return raw


def load(path: Path) -> Registry:
    raw = read_yaml_mapping(path, {"schema", "patches", "hooks"}, "the registry lives there")
    top = _keys(raw, str(path), {"schema", "patches", "hooks"}, set())
    if top["schema"] != 1:
        raise ConfigError(f"unsupported schema {top['schema']!r} (expected 1)", where=f"{path}: schema")
    reg = Registry(path)
    seen: set[str] = set()
    if not isinstance(top["patches"], list):
        raise ConfigError("patches must be a list", where=f"{path}: patches")
    for i, p in enumerate(top["patches"]):
        w = f"{path}: patches[{i}]"
        d = _keys(p, w, {"id", "file", "title", "status", "build_impact", "files", "hooks"},
                  {"bug", "shipped", "gates", "description"})
        pid = _str(d["id"], f"{w}.id")
        if not re.match(r"^\d{4}$", pid):
            raise ConfigError(f"patch id {pid!r} must be four digits", where=f"{w}.id")
        if pid in seen:
            raise ConfigError(f"duplicate patch id {pid}", where=f"{w}.id")
        seen.add(pid)
        if d["status"] not in STATUSES:
            raise ConfigError(f"status must be one of {', '.join(STATUSES)}", where=f"{w}.status")
        gates = []
        for j, g in enumerate(d.get("gates") or []):
            gw = f"{w}.gates[{j}]"
            gd = _keys(g, gw, {"name", "needs", "command", "proves"}, {"timeout"})
            needs = _strs(gd["needs"], f"{gw}.needs")
            if not needs or any(n not in NEEDS for n in needs):
                raise ConfigError(f"needs must be a non-empty list of {', '.join(NEEDS)}", where=f"{gw}.needs")
            cmd = _strs(gd["command"], f"{gw}.command")
            if not cmd:
                raise ConfigError("command must not be empty", where=f"{gw}.command")
            gates.append(Gate(_str(gd["name"], f"{gw}.name"), needs, cmd, _str(gd["proves"], f"{gw}.proves"),
                              int(gd.get("timeout", 1800))))
        reg.patches.append(PatchEntry(
            pid, _str(d["file"], f"{w}.file"), _str(d["title"], f"{w}.title"), _str(d.get("bug", ""), f"{w}.bug"),
            d["status"], _str(d.get("shipped", ""), f"{w}.shipped"), _strs(d["build_impact"], f"{w}.build_impact"),
            _strs(d["files"], f"{w}.files"), _strs(d["hooks"], f"{w}.hooks"), tuple(gates),
            _str(d.get("description", ""), f"{w}.description")))
    if not isinstance(top["hooks"], dict):
        raise ConfigError("hooks must be a mapping of hook id to its entry", where=f"{path}: hooks")
    for hid, h in top["hooks"].items():
        w = f"{path}: hooks.{hid}"
        if not isinstance(hid, str) or not HOOK_RE.match(hid):
            raise ConfigError(f"bad hook id {hid!r} (lowercase, digits, '-', '.', '_')", where=w)
        d = _keys(h, w, {"patch", "sites"}, {"description"})
        sites = []
        if not isinstance(d["sites"], list) or not d["sites"]:
            raise ConfigError("sites must be a non-empty list", where=f"{w}.sites")
        for j, s in enumerate(d["sites"]):
            sw = f"{w}.sites[{j}]"
            sd = _keys(s, sw, {"file", "symbol"}, {"line"})
            line = sd.get("line")
            if line is not None and not isinstance(line, int):
                raise ConfigError("line must be an integer (advisory)", where=f"{sw}.line")
            sites.append(Site(_str(sd["file"], f"{sw}.file"), _str(sd["symbol"], f"{sw}.symbol"), line))
        reg.hooks[hid] = Hook(hid, _str(d["patch"], f"{w}.patch"), _str(d.get("description", ""), f"{w}.description"),
                              tuple(sites))
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
    return yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True)
