"""Build impact: which artifacts a set of touched paths feeds, by the rules in registry/build.yaml."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from forktool.build import BuildConfig, load_config
from forktool.project import Project


def _config(project: Project) -> BuildConfig:
    """registry/build.yaml, read once per version of the file (a check asks about many paths)."""
    path = project.registry_dir / "build.yaml"
    try:
        st = os.stat(path)
        key: tuple = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        return load_config(project)  # its own clear error
    return _config_at(project.root, key)


@functools.lru_cache(maxsize=1)
def _config_at(root: Path, version: tuple) -> BuildConfig:
    """The build config of the project at root, as of `version` of its build.yaml (a newer one replaces it)."""
    return load_config(Project(root))


def impacts_for(project: Project, paths: list[str]) -> list[str]:
    cfg = _config(project)
    return cfg.impacts(cfg.feeding(paths)[0])


def impact_label(project: Project, paths: list[str]) -> str:
    return ", ".join(impacts_for(project, paths)) or "none"


def profile_names(project: Project) -> list[str]:
    return sorted(_config(project).profiles)


def build_config(project: Project) -> BuildConfig:
    """registry/build.yaml, read once per version of the file."""
    return _config(project)
