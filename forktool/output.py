"""The only place that prints: rich text on stderr, JSON on stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

_err: Console | None = None  # rich loads on the first line shown: --json runs and fast starts skip it
_json_mode = False


def __getattr__(name: str) -> Any:
    if name == "Console":
        from rich.console import Console

        return Console
    raise AttributeError(name)


def _console() -> Console:
    global _err
    if _err is None:
        from rich.console import Console

        _err = Console(stderr=True, highlight=False, soft_wrap=True)
    return _err


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def set_json(flag: bool) -> None:
    global _json_mode
    _json_mode = flag


def escape(text: str) -> str:
    """Text shown as is, not read as rich markup."""
    return _escape(text)


@dataclass
class Report:
    """What a command returns: JSON data and the human lines that show the same facts."""

    data: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    exit_code: int = 0


def emit(report: Report) -> int:
    if _json_mode:
        sys.stdout.write(json.dumps(report.data, indent=2, sort_keys=True) + "\n")
        sys.stdout.flush()
    else:
        for line in report.lines:
            _console().print(line)
    return report.exit_code


def info(message: str) -> None:
    """Progress note on stderr (suppressed in --json mode)."""
    if not _json_mode:
        _console().print("[dim]" + _escape(message) + "[/dim]")


def warn(message: str) -> None:
    _console().print("[yellow]warning:[/yellow] " + _escape(message))


def error(message: str, payload: dict[str, Any] | None = None) -> None:
    if _json_mode and payload is not None:
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    _console().print("[red]error:[/red] " + _escape(message))


@contextmanager
def step(message: str) -> Iterator[None]:
    """A quiet task line: shown while it runs, so a long step is visible."""
    if _json_mode or not _console().is_terminal:
        info(message)
        yield
        return
    with _console().status(message):
        yield


class Progress:
    """Counts work done of work to do: a rich bar on a terminal, plain lines otherwise, nothing in --json mode."""

    def __init__(self, bar: Any = None, task: Any = None) -> None:
        self._bar, self._task = bar, task

    def update(self, done: int, total: int | None, current: str, line: str = "") -> None:
        """done of total (None: unknown), what is being worked on, and the line to show when no bar is drawn."""
        if _json_mode:
            return
        if self._bar is None:
            if line:
                _console().print(f"[dim][{done}/{total if total is not None else '?'}] {escape(line)}[/dim]")
            return
        self._bar.update(self._task, completed=done, total=total, description=escape(current))


@contextmanager
def progress(description: str) -> Iterator[Progress]:
    if _json_mode or not _console().is_terminal:
        yield Progress()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    with Bar(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TextColumn("elapsed"),
             TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=_console(), transient=False) as bar:
        yield Progress(bar, bar.add_task(escape(description), total=None))
