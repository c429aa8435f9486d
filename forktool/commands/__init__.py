"""One module per command; each returns an output.Report and never prints or exits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from forktool.project import Project
    from forktool.workspace import Workspace


@contextmanager
def open_workspace(project: Project, use_cache: bool = True) -> Iterator[Workspace]:
    """The project's snapshot under its lock, with progress and recovery notes shown on stderr."""
    from forktool import output
    from forktool.workspace import open_workspace as _open

    with _open(project, use_cache=use_cache, progress=output.info, warn=output.warn) as ws:
        yield ws
