"""The command line: options in, a command call, a report out, an exit code. No logic here.

`--version` and the commands that take flags only (status, verify, ...) are dispatched without loading typer,
so the everyday commands start fast; everything else, and any --help, goes through the typer app in cli_app.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from forktool import output
from forktool.errors import ForktoolError

if TYPE_CHECKING:
    from forktool.output import Report
    from forktool.project import Project


class Exit(Exception):
    def __init__(self, code: int):
        self.code = code


def run(json_flag: bool, fn: Callable[[Project], Report]) -> None:
    from forktool.project import find_project

    output.set_json(json_flag)
    try:
        code = output.emit(fn(find_project()))
    except ForktoolError as e:
        output.error(str(e), e.to_json())
        code = e.exit_code
    except KeyboardInterrupt:
        output.error("interrupted")
        code = 130
    except Exception as e:  # a bug: say so, with the traceback, and exit 3
        output.error(f"internal error: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                     {"error": f"internal error: {e}", "kind": "InternalError"})
        code = 3
    raise Exit(code)


def _status(p: Project, flags: set[str]) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.status(p)


def _verify(p: Project, flags: set[str]) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.verify(p, "--no-cache" not in flags)


def _markers(p: Project, flags: set[str]) -> Report:
    from forktool.commands import registry_cmds
    return registry_cmds.markers(p)


def _registry_check(p: Project, flags: set[str]) -> Report:
    from forktool.commands import registry_cmds
    return registry_cmds.check(p)


def _vendor_status(p: Project, flags: set[str]) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.vendor_status(p)


def _backup_list(p: Project, flags: set[str]) -> Report:
    from forktool.commands import backup_cmds
    return backup_cmds.list_(p)


# commands whose whole command line is flags: (words, allowed flags, call); the typer app defines the same
# commands with the same flags (a test holds the two to the same results)
PLAIN: list[tuple[tuple[str, ...], frozenset[str], Callable[[Project, set[str]], Report]]] = [
    (("status",), frozenset({"--json"}), _status),
    (("verify",), frozenset({"--json", "--no-cache"}), _verify),
    (("markers",), frozenset({"--json"}), _markers),
    (("registry", "check"), frozenset({"--json"}), _registry_check),
    (("vendor", "status"), frozenset({"--json"}), _vendor_status),
    (("backup", "list"), frozenset({"--json"}), _backup_list),
]


def version_text() -> str:
    """The tool version, and the stamp of the series applied in the project here (when there is one)."""
    from forktool import __version__
    from forktool.project import find_project
    from forktool.state import applied_stamp

    line = f"forktool {__version__}"
    try:
        stamp = applied_stamp(find_project())
    except ForktoolError:
        return line
    return f"{line}\napplied series: {stamp}"


def _fast(argv: list[str]) -> int | None:
    """The exit code of a command dispatched without typer, or None when typer must parse argv."""
    if argv == ["--version"]:
        sys.stdout.write(version_text() + "\n")
        return 0
    for words, allowed, call in PLAIN:
        n = len(words)
        flags = argv[n:]
        if tuple(argv[:n]) == words and set(flags) <= allowed and len(set(flags)) == len(flags):
            try:
                run("--json" in flags, lambda p, f=set(flags), c=call: c(p, f))  # type: ignore[misc]
            except Exit as e:
                return e.code
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    code = _fast(args)
    if code is not None:
        return code
    return _main_typer(args)


def _main_typer(argv: list[str]) -> int:
    import typer

    try:  # typer >= 0.16 vendors its own click
        from typer._click.exceptions import UsageError as ClickUsageError  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover
        from click.exceptions import UsageError as ClickUsageError  # type: ignore[assignment]

    try:
        from forktool.cli_app import app

        app(args=argv, standalone_mode=False)
    except Exit as e:
        return e.code
    except ClickUsageError as e:
        e.show(file=sys.stderr)
        return 2
    except typer.Abort:
        return 130
    except typer.Exit as e:
        return int(e.exit_code or 0)
    except Exception as e:  # a bug outside a command body (import, option parsing): exit 3
        output.error(f"internal error: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
