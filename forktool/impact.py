"""Build impact: which artifacts a set of touched paths feeds, by the rules in registry/build.yaml."""

from __future__ import annotations

from forktool.build import IMPACTS, load_config
from forktool.project import Project


def artifacts_for(project: Project, paths: list[str]) -> dict[str, list[str]]:
    """artifact name -> touched paths that feed it (first matching rule wins; unmatched paths feed none)."""
    return load_config(project).feeding(paths)[0]


def impacts_for(project: Project, paths: list[str]) -> list[str]:
    cfg = load_config(project)
    by_name = {a.name: a for a in cfg.artifacts}
    found = {i for name in cfg.feeding(paths)[0] for i in by_name[name].impact}
    return [i for i in IMPACTS if i in found]


def impact_label(project: Project, paths: list[str]) -> str:
    return ", ".join(impacts_for(project, paths)) or "none"
