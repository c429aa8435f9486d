"""The only place that prints: rich text on stderr, JSON on stdout.

The process has one console (`CONSOLE`): the mode of the command that runs (set by `session`, which cli.run
opens around every command) and where its lines go (stderr; `capture` points them at a file). It is the one
piece of process-wide state in forktool: a process runs one command at a time and has one stderr, and every
core function that reports progress would otherwise take the console as a parameter only to hand it on.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from rich.console import Console


class _Console:
    """The process's console: the output mode, and the rich console once a line needs one."""

    __slots__ = ("json_mode", "rich")

    def __init__(self) -> None:
        self.json_mode = False  # JSON on stdout; lines on stderr stay for warnings and errors only
        self.rich: Console | None = None  # rich loads on the first line it styles: --json runs and fast starts skip it


CONSOLE = _Console()


def __getattr__(name: str) -> Any:
    if name == "Console":
        from rich.console import Console

        return Console
    raise AttributeError(name)


def _console() -> Console:
    if CONSOLE.rich is None:
        from rich.console import Console

        CONSOLE.rich = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    return CONSOLE.rich


# rich's markup: a tag is "[" + a letter, "#", "/" or "@" + anything but "[" + "]"; backslashes before it escape it
_TAG = re.compile(r"(\\*)(\[[a-z#/@][^[]*?\])")
# lines holding only these characters come out of rich, on a stream that is not a terminal, as their plain text
_SIMPLE = re.compile(r"[^\x00-\x1f\x7f-\x9f]*")


def _escape(text: str) -> str:
    """rich's markup escape, without loading rich: double the backslashes before a tag, then escape the tag."""
    text = _TAG.sub(lambda m: m.group(1) * 2 + "\\" + m.group(2), text)
    if text.endswith("\\") and not text.endswith("\\\\"):
        return text + "\\"
    return text


def plain(markup: str) -> str:
    """The text rich shows for a line of markup when it cannot style it: tags dropped, escapes resolved."""
    if "[" not in markup:
        return markup
    out = []
    pos = 0
    for m in _TAG.finditer(markup):
        if m.start() > pos:
            out.append(markup[pos:m.start()].replace("\\[", "["))
        pos = m.end()
        pairs, escaped = divmod(len(m.group(1)), 2)
        out.append("\\" * pairs)
        if escaped:
            out.append(m.group(2))
    out.append(markup[pos:].replace("\\[", "["))
    return "".join(out)


def _plain_stream() -> bool:
    """True when lines can be written as plain text without rich: no console was set up, stderr is not a
    terminal and nothing in the environment asks for one (rich's own rules)."""
    if CONSOLE.rich is not None:
        return False
    env = os.environ
    if env.get("TTY_COMPATIBLE") == "1" or (env.get("TTY_COMPATIBLE") != "0" and env.get("FORCE_COLOR")):
        return False
    try:
        return not sys.stderr.isatty()
    except (AttributeError, ValueError):
        return True


def _show(markup: str) -> None:
    """One line on stderr: plain text when nothing will style it (rich stays unloaded), through rich otherwise."""
    if _plain_stream() and _SIMPLE.fullmatch(markup):
        sys.stderr.write(plain(markup) + "\n")
        sys.stderr.flush()
    else:
        _console().print(markup)


@contextmanager
def session(json_mode: bool) -> Iterator[None]:
    """One command's output mode: JSON on stdout (True) or lines on stderr; the previous mode returns after."""
    before = CONSOLE.json_mode
    CONSOLE.json_mode = json_mode
    try:
        yield
    finally:
        CONSOLE.json_mode = before


@contextmanager
def capture(err: Any) -> Iterator[None]:
    """Lines meant for stderr go to the file `err` instead, through rich as on a stream that is not a terminal
    (for callers that run commands in-process and read what they said)."""
    from rich.console import Console

    before = CONSOLE.rich
    CONSOLE.rich = Console(file=err, highlight=False, soft_wrap=True, width=200)
    try:
        yield
    finally:
        CONSOLE.rich = before


def write_out(text: str, exit_code: int = 0) -> None:
    """text on stdout, flushed; OutputError when stdout cannot take it (closed, full, a closed pipe), carrying
    the exit code the command had reached."""
    from forktool.errors import OutputError

    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as e:  # ValueError: the stream object was closed
        raise OutputError(e, exit_code) from None


def escape(text: str) -> str:
    """Text shown as is, not read as rich markup."""
    return _escape(text)


class Report:
    """What a command returns: JSON data and the human lines that show the same facts."""

    __slots__ = ("data", "lines", "exit_code")

    def __init__(self, data: dict[str, Any], lines: list[str] | None = None, exit_code: int = 0):
        self.data = data
        self.lines: list[str] = [] if lines is None else lines
        self.exit_code = exit_code


def emit(report: Report) -> int:
    if CONSOLE.json_mode:
        write_out(json.dumps(report.data, indent=2, sort_keys=True) + "\n", report.exit_code)
    else:
        for line in report.lines:
            _show(line)
    return report.exit_code


def info(message: str) -> None:
    """Progress note on stderr (suppressed in --json mode)."""
    if not CONSOLE.json_mode:
        _show("[dim]" + _escape(message) + "[/dim]")


def warn(message: str) -> None:
    _show("[yellow]warning:[/yellow] " + _escape(message))


def error(message: str, payload: dict[str, Any] | None = None) -> None:
    if CONSOLE.json_mode and payload is not None:
        from forktool.errors import OutputError

        try:
            write_out(json.dumps(payload, indent=2, sort_keys=True) + "\n", 1)
        except OutputError:  # the failure being reported is the news: it still goes to stderr, its exit code stands
            pass
    _show("[red]error:[/red] " + _escape(message))


@contextmanager
def step(message: str) -> Iterator[None]:
    """A quiet task line: shown while it runs, so a long step is visible."""
    if CONSOLE.json_mode or _plain_stream() or not _console().is_terminal:
        info(message)
        yield
        return
    with _console().status(message):
        yield


class Progress:
    """Counts work done: a rich bar on a terminal, plain lines otherwise, nothing in --json mode."""

    def __init__(self, bar: Any = None, task: Any = None) -> None:
        self._bar, self._task = bar, task

    def update(self, done: int, total: int | None, current: str, line: str = "", percent: int | None = None) -> None:
        """done of total (None: not known beforehand), what is being worked on, the line to show when no bar is
        drawn, and how far the whole job is (0-100) when only that is known. Plain lines count `[done/total]`
        when the total is known, else `[done]` (make's own lines carry its position)."""
        if CONSOLE.json_mode:
            return
        if self._bar is None:
            if line:
                _show(f"[dim][{done}{f'/{total}' if total is not None else ''}] {escape(line)}[/dim]")
            return
        if total is not None:
            self._bar.update(self._task, completed=done, total=total, description=escape(current),
                             count=f"{done}/{total}")
        else:
            self._bar.update(self._task, completed=percent, total=100 if percent is not None else None,
                             description=escape(current), count=f"{done} done")


@contextmanager
def progress(description: str) -> Iterator[Progress]:
    if CONSOLE.json_mode or _plain_stream() or not _console().is_terminal:
        yield Progress()
        return
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    with Bar(TextColumn("{task.description:<24}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
             TextColumn("{task.fields[count]}"), TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA"),
             TimeRemainingColumn(), console=_console(), transient=False) as bar:
        yield Progress(bar, bar.add_task(escape(description), total=None, count=""))
