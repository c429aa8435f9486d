"""registry check and markers: the UPSTREAM_SYNC registry against series and tree."""

from __future__ import annotations

from forktool.output import Report
from forktool.project import Project


def check_if_present(project: Project) -> Report | None:
    """The registry check, or None when the project keeps no registry yet."""
    if not (project.registry_dir / "UPSTREAM_SYNC.yaml").is_file():
        return None
    from forktool.commands import registry_check
    return registry_check.check(project)
