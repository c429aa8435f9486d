"""Build impact: which artifacts a set of touched paths feeds, from the rules in registry/build.yaml."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from forktool.errors import ConfigError
from forktool.project import Project
from forktool.vendor import matches

IMPACTS = ("host", "cuda-dso")


@dataclass(frozen=True)
class Artifact:
    name: str
    impact: tuple[str, ...]
    paths: tuple[str, ...]


def load_artifacts(path: Path) -> list[Artifact]:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{path} not found", where=str(path)) from e
    arts = raw.get("artifacts") if isinstance(raw, dict) else None
    if not isinstance(arts, list):
        raise ConfigError("`artifacts` must be a list", where=f"{path}: artifacts")
    out = []
    for i, a in enumerate(arts):
        where = f"{path}: artifacts[{i}]"
        if not isinstance(a, dict):
            raise ConfigError("an artifact must be a mapping", where=where)
        unknown = set(a) - {"name", "impact", "paths", "targets", "outputs", "profiles"}
        if unknown:
            raise ConfigError(f"unknown key(s) {', '.join(sorted(unknown))}", where=where)
        imp = a.get("impact")
        imps = tuple(imp) if isinstance(imp, list) else (imp,)
        if not imps or any(x not in IMPACTS for x in imps):
            raise ConfigError(f"impact must be one or more of {', '.join(IMPACTS)}", where=f"{where}.impact")
        out.append(Artifact(str(a.get("name")), imps, tuple(a.get("paths") or ())))
    return out


def artifacts_for(project: Project, paths: list[str]) -> dict[str, list[str]]:
    """artifact name -> touched paths that feed it (first matching rule wins; unmatched paths feed none)."""
    arts = load_artifacts(project.registry_dir / "build.yaml")
    out: dict[str, list[str]] = {}
    for rel in paths:
        for a in arts:
            if matches(rel, a.paths):
                out.setdefault(a.name, []).append(rel)
                break
    return out


def impacts_for(project: Project, paths: list[str]) -> list[str]:
    arts = {a.name: a for a in load_artifacts(project.registry_dir / "build.yaml")}
    found = {i for name in artifacts_for(project, paths) for i in arts[name].impact}
    return [i for i in IMPACTS if i in found]


def impact_label(project: Project, paths: list[str]) -> str:
    return ", ".join(impacts_for(project, paths)) or "none"
