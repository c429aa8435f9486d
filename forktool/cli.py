"""The command line: options in, a command call, a report out, an exit code. No logic here.

`--version` and the commands that take flags only (status, verify, ...) are dispatched without loading typer,
so the everyday commands start fast; everything else, and any --help, goes through the typer app in cli_app.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

from forktool import output
from forktool.errors import ForktoolError

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from forktool.output import Report
    from forktool.project import Project


class Exit(Exception):
    def __init__(self, code: int):
        self.code = code


def run(json_flag: bool, fn: Callable[[Project], Report]) -> None:
    from forktool import cache
    from forktool.project import find_project

    output.set_json(json_flag)
    try:
        code = output.emit(fn(find_project()))
        if code == 0:
            cache.flush_valid()
    except ForktoolError as e:
        output.error(str(e), e.to_json())
        code = e.exit_code
    except KeyboardInterrupt:
        output.error("interrupted")
        code = 130
    except Exception as e:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):  # disk full: an expected failure
            output.error(f"no space left on the device: {e}\n  next: free some space and run the command again",
                         {"error": f"no space left on the device: {e}", "kind": "NoSpace"})
            code = 1
        else:  # a bug: say so, with the traceback, and exit 3
            import traceback

            output.error(f"internal error: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                         {"error": f"internal error: {e}", "kind": "InternalError"})
            code = 3
    finally:
        cache.forget_valid()  # what a failed command checked is not remembered
    raise Exit(code)


Opts = dict[str, str | bool]


def _status(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.status(p)


def _verify(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.verify(p, "--no-cache" not in o)


def _apply(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.apply(p, _value(o, "--upto"), "--force" in o, "--reanchor" in o)


def _unapply(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.unapply(p, _value(o, "--to"), "--force" in o)


def _refresh(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.refresh(p, str(o["ID"]))


def _build(p: Project, o: Opts) -> Report:
    from forktool.commands import build_cmds
    jobs = _value(o, "--jobs") or _value(o, "-j")
    return build_cmds.dispatch(p, _value(o, "--profile"), "--plan" in o, "--check" in o, "--all" in o,
                               int(jobs) if jobs else None)


def _markers(p: Project, o: Opts) -> Report:
    from forktool.commands import registry_cmds
    return registry_cmds.markers(p)


def _registry_check(p: Project, o: Opts) -> Report:
    from forktool.commands import registry_cmds
    return registry_cmds.check(p)


def _vendor_status(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.vendor_status(p)


def _backup_list(p: Project, o: Opts) -> Report:
    from forktool.commands import backup_cmds
    return backup_cmds.list_(p)


def _value(o: Opts, name: str) -> str | None:
    v = o.get(name)
    return v if isinstance(v, str) else None


# the everyday commands: (words, flags, options taking a value, positional arguments, call). The typer app
# defines the same commands with the same options (a test holds the two to the same results); anything else
# on the line (--help, a typo, a missing value, a -j that is not a number) goes to typer, which owns usage errors.
PLAIN: list[tuple[tuple[str, ...], frozenset[str], frozenset[str], tuple[str, ...], Callable[[Project, Opts], Report]]] = [
    (("status",), frozenset({"--json"}), frozenset(), (), _status),
    (("verify",), frozenset({"--json", "--no-cache"}), frozenset(), (), _verify),
    (("apply",), frozenset({"--json", "--force", "--reanchor"}), frozenset({"--upto"}), (), _apply),
    (("unapply",), frozenset({"--json", "--force"}), frozenset({"--to"}), (), _unapply),
    (("refresh",), frozenset({"--json"}), frozenset(), ("ID",), _refresh),
    (("build",), frozenset({"--json", "--plan", "--check", "--all"}), frozenset({"--profile", "--jobs", "-j"}), (), _build),
    (("markers",), frozenset({"--json"}), frozenset(), (), _markers),
    (("registry", "check"), frozenset({"--json"}), frozenset(), (), _registry_check),
    (("vendor", "status"), frozenset({"--json"}), frozenset(), (), _vendor_status),
    (("backup", "list"), frozenset({"--json"}), frozenset(), (), _backup_list),
]


def _options(args: list[str], flags: frozenset[str], valued: frozenset[str], positional: tuple[str, ...]) -> Opts | None:
    """The options on the line, or None when anything is not a known flag, a valued option with its value or
    one of the positional arguments (all of which must be there)."""
    out: Opts = {}
    pos = list(positional)
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if name in valued:
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("-"):
                    return None
                i += 1
                value = args[i]
            if name in out or not value:
                return None
            out[name] = value
        elif a in flags and a not in out:
            out[a] = True
        elif pos and a and not a.startswith("-"):
            out[pos.pop(0)] = a
        else:
            return None
        i += 1
    if pos:
        return None
    for n in ("--jobs", "-j"):
        if n in out and not str(out[n]).isdigit():
            return None
    if "--jobs" in out and "-j" in out:
        return None
    return out


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


# the commands after which entry() may leave without the interpreter's teardown (see there)
QUICK_EXIT = frozenset({("status",), ("verify",), ("apply",), ("unapply",), ("refresh",)})
_quick: list[bool] = []


def _fast(argv: list[str]) -> int | None:
    """The exit code of a command dispatched without typer, or None when typer must parse argv."""
    if argv == ["--version"]:
        sys.stdout.write(version_text() + "\n")
        return 0
    for words, flags, valued, positional, call in PLAIN:
        n = len(words)
        if tuple(argv[:n]) != words:
            continue
        opts = _options(argv[n:], flags, valued, positional)
        if opts is None:
            return None
        if words in QUICK_EXIT:
            _quick.append(True)
        try:
            run("--json" in opts, lambda p, o=opts, c=call: c(p, o))  # type: ignore[misc]
        except Exit as e:
            return e.code
    return None


def entry() -> None:
    """The `forktool` console script and `python -m forktool`: main(), then the process exits.

    The everyday tree commands (QUICK_EXIT) run without the cyclic garbage collector and exit with os._exit
    once stdout and stderr are flushed. In these short commands the collector found next to nothing to free
    (none of the objects of an `unapply`, 33 of an `apply`) but ran up to 19 times, walking the young objects
    (the manifests' thousands of tuples): up to 4.6 ms. os._exit skips the
    interpreter's teardown (module and object finalisation, about 6 ms). Nothing on those paths needs it:
    every file they write is closed (and the journal, state and backups fsynced) before main() returns, the
    threads they wait on have finished, and nothing registers an atexit handler. If a flush fails (a closed
    pipe), the ordinary exit runs instead, with Python's own handling.
    """
    if tuple(sys.argv[1:2]) in QUICK_EXIT:
        import gc

        gc.disable()
    code = main()
    if _quick:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            raise SystemExit(code) from None
        os._exit(code)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    code = _fast(args)
    if code is not None:
        return code
    return _main_typer(args)


def _main_typer(argv: list[str]) -> int:
    # plain click help and usage errors unless asked for rich's (TYPER_USE_RICH=1): a third of the start-up
    os.environ.setdefault("TYPER_USE_RICH", "0")
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
        import traceback

        output.error(f"internal error: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
