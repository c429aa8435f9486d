"""The command line: a line read against cli_spec, the command's call, a report out, an exit code.

A line the declaration reads plainly runs without loading typer, so the everyday commands start fast; help, usage
errors and anything unusual go through the typer app (cli_app), which is built from the same declaration and hands
the parsed call back. Either way the call runs here, through run(). The exit codes, signals and unwritable output
follow one contract (docs/manual-cli.md): 0 done, 1 refused or failed, 2 usage, 3 internal error, 130 interrupted,
killed by SIGPIPE (a shell shows 141) when stdout is a pipe its reader closed.
"""

from __future__ import annotations

import os
import sys

# not `from typing import TYPE_CHECKING`: the console script imports this module before entry() installs the
# Ctrl-C handler, and typing is the bulk of that import (about 4 ms): a Ctrl-C then would end the process with a
# traceback instead of exit 130 and its one line (type checkers read this name as typing's)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from forktool.cli_spec import Call, Command
    from forktool.errors import OutputError

INTERRUPTED = 130
BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a process its closed pipe ended; entry() dies by the signal


def run(call: Call) -> int:
    """Run one parsed command in the current process: its report shown, every failure mapped to its exit code."""
    import errno

    from forktool import cache, output
    from forktool.errors import ForktoolError, OutputError
    from forktool.project import find_project
    from forktool.tree import NotRegularFileError

    with output.session(bool(call.opts.get("json"))):
        try:
            project = find_project()
            with cache.remembering(project.state_dir):  # what it checked is remembered only if it succeeds
                report = call.command.call(project, call.opts)
            code = output.emit(report)
        except ForktoolError as e:
            output.error(str(e), e.to_json())
            code = e.exit_code
        except OutputError as e:
            code = unwritten(e, call.command)
        except KeyboardInterrupt as e:
            if not isinstance(_signal_handler(), _Interrupt):  # in a process, the handler has said it already
                output.error("interrupted")
            _say_notes(e)
            code = INTERRUPTED
        except NotRegularFileError as e:  # something planted where forktool keeps a file: refused, nothing read
            what = f"{e.filename}: {e.strerror}"
            output.error(f"{what}\n  next: remove it (forktool never puts one there) and run the command again",
                         _noted({"error": what, "where": e.filename, "kind": "NotRegularFile",
                                 "hint": "remove it and run the command again"}, e))
            _say_notes(e)
            code = 1
        except Exception as e:
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):  # disk full: an expected failure
                output.error(f"no space left on the device: {e}\n  next: free some space and run the command again",
                             _noted({"error": f"no space left on the device: {e}", "kind": "NoSpace"}, e))
                _say_notes(e)
                code = 1
            elif isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                # a file or directory this user may not change (another user's cache entry, a read-only mount):
                # an expected failure, named, never a traceback
                what = f"{e.strerror}: {e.filename}" if e.filename else f"{e.strerror or e}"
                output.error(f"{what}\n  next: this user may not change it (another user's file or directory, or a "
                             "read-only filesystem): make it writable to you, or, inside the cache, point "
                             "FORKTOOL_CACHE at a directory of your own; then run the command again",
                             _noted({"error": what, "where": e.filename, "kind": "PermissionDenied",
                                     "hint": "make it writable, or point FORKTOOL_CACHE at a directory of your own"}, e))
                _say_notes(e)
                code = 1
            else:  # a bug: say so, with the traceback (which ends with the notes), and exit 3
                import traceback

                output.error(f"internal error: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                             _noted({"error": f"internal error: {e}", "kind": "InternalError"}, e))
                code = 3
    return code


def _notes(e: BaseException) -> list[str]:
    """What a step added to a failure it did not handle (a sync left in progress: sync.loop._left_in_progress)."""
    return [str(n) for n in getattr(e, "__notes__", ())]


def _noted(payload: dict[str, Any], e: BaseException) -> dict[str, Any]:
    """The --json error payload with the failure's notes, where it has any."""
    notes = _notes(e)
    return payload | {"notes": notes} if notes else payload


def _say_notes(e: BaseException) -> None:
    from forktool import output

    for note in _notes(e):
        try:
            output.error(note)
        except OSError:  # a closed or full stderr never changes the exit code
            pass


def unwritten(e: OutputError, command: Command | None) -> int:
    """The exit code of a run whose output stdout would not take, and the one line on stderr that says so.

    A failed command keeps its own exit code. Otherwise a closed pipe is the reader's choice (`| head`): BROKEN_PIPE,
    quietly, as git and coreutils do; any other write error (closed descriptor, disk full) is exit 1. A command that
    may have changed the project says that it ran to its end, so nobody reads the exit code as "nothing happened"."""
    import errno

    from forktool import output

    done = ""
    if command is not None and command.moves and e.exit_code == 0:
        done = (f"; `forktool {' '.join(command.words)}` itself ran to its end (`forktool status` shows where the "
                "project stands)")
    if e.exit_code != 0:
        if e.errno != errno.EPIPE:
            output.error(f"{e}")
        return e.exit_code
    if e.errno == errno.EPIPE:
        if done:
            output.error(f"{e}{done}")
        return BROKEN_PIPE
    output.error(f"{e}{done}")
    return 1


def version_text() -> str:
    """The tool version, and the stamp of the series applied in the project here (when there is one)."""
    from forktool import __version__, cache
    from forktool.errors import ForktoolError
    from forktool.project import find_project
    from forktool.state import applied_stamp

    line = f"forktool {__version__}"
    try:
        project = find_project()
        with cache.remembering(project.state_dir):  # the checks of the pin it reads, as every command's
            stamp = applied_stamp(project)
    except ForktoolError:
        return line
    return f"{line}\napplied series: {stamp}"


def _version() -> int:
    from forktool import output
    from forktool.errors import OutputError

    try:
        output.write_out(version_text() + "\n")
    except OutputError as e:
        return unwritten(e, None)
    return 0


def parse(argv: list[str]) -> Call | None | int:
    """The call a line asks for (None: --version), or an exit code when typer has already answered (help, usage)."""
    from forktool import cli_spec

    if argv == ["--version"]:
        return None
    call = cli_spec.parse(argv)
    if call is not None:
        return call
    # plain click help and usage errors unless asked for rich's (TYPER_USE_RICH=1): a third of the start-up
    os.environ.setdefault("TYPER_USE_RICH", "0")
    from forktool import cli_app

    return cli_app.parse(argv)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        call = parse(args)
        if call is None:
            return _version()
    except OSError as e:  # typer could not write the help it was showing
        from forktool.errors import OutputError

        return unwritten(OutputError(e, 0), None)
    except Exception as e:  # a bug outside a command body (building the app, parsing, --version): exit 3
        import traceback

        from forktool import output

        output.error(f"internal error: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 3
    if isinstance(call, int):
        return call
    return run(call)


# ---------------------------------------------------------------- the process


class _Interrupt:
    """The process's SIGINT handler: the first Ctrl-C says so on stderr at once and raises KeyboardInterrupt, so
    the command unwinds through its clean-up; a second one ends the process there (exit 130), since the clean-up
    is what it interrupts and the next command's journal recovery finishes any move that was under way."""

    def __init__(self) -> None:
        self.raised = False
        self.finished = False  # the command is over: a Ctrl-C while the process leaves ends it at once, still 130

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.raised:
            _say(b"error: interrupted\n")
        if self.raised or self.finished:
            os._exit(INTERRUPTED)
        self.raised = True
        raise KeyboardInterrupt


def _signal_handler() -> Any:
    import signal

    return signal.getsignal(signal.SIGINT)


def _say(line: bytes) -> None:
    try:
        os.write(2, line)
    except OSError:  # a closed or full stderr never changes the exit code
        pass


class _Stream:
    """A standard stream of the process. The first write error points the descriptor at /dev/null (so the
    interpreter's own last flush cannot fail a second time). On stdout that error is raised, and again at every
    later write but not at a flush: the output is lost and the exit code must say so. On stderr it is dropped:
    a closed or full stderr never changes the exit code."""

    def __init__(self, raw: Any, fd: int, quiet: bool, error: OSError | None = None) -> None:
        self._raw, self._fd, self._quiet, self._error = raw, fd, quiet, error

    def write(self, text: str) -> int:
        if self._error is not None:
            return self._failed(self._error, len(text))
        try:
            return self._raw.write(text)
        except (OSError, ValueError) as e:
            return self._failed(e, len(text))

    def flush(self) -> None:
        if self._error is not None:  # said by the write or flush that met it; the interpreter's last flush is quiet
            return
        try:
            self._raw.flush()
        except (OSError, ValueError) as e:
            self._failed(e, 0)

    def isatty(self) -> bool:
        return self._error is None and self._raw.isatty()

    def _failed(self, e: OSError | ValueError, n: int) -> int:
        if self._error is None:
            import errno

            _to_devnull(self._fd)
            self._error = e if isinstance(e, OSError) else OSError(errno.EBADF, "the stream is closed")
        if self._quiet:
            return n
        raise OSError(self._error.errno, self._error.strerror)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _to_devnull(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


def _streams() -> None:
    """Standard streams the contract can rely on. A closed descriptor 0, 1 or 2 gets /dev/null, so no file the
    command opens can take its number (and receive what is meant for the terminal); a closed stdout stays closed
    to every write, which fails as a write error does."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _to_devnull(fd)
            closed.append(fd)
    if 1 in closed or sys.stdout is None:
        import errno

        closed_error = OSError(errno.EBADF, "stdout is closed")
        sys.stdout = _Stream(open(1, "w", closefd=False), 1, quiet=False, error=closed_error)  # type: ignore[assignment]
    else:
        sys.stdout = _Stream(sys.stdout, 1, quiet=False)  # type: ignore[assignment]
    if 2 in closed or sys.stderr is None:
        sys.stderr = _Stream(open(2, "w", closefd=False), 2, quiet=True)  # type: ignore[assignment]
    else:
        sys.stderr = _Stream(sys.stderr, 2, quiet=True)  # type: ignore[assignment]


def _die_by_sigpipe() -> None:
    """Leave as git and coreutils do when their reader has gone: killed by SIGPIPE (which Python ignores)."""
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    os._exit(BROKEN_PIPE)  # SIGPIPE blocked by whoever started us: the same status as a shell would show


def entry() -> None:
    """The `forktool` console script and `python -m forktool`: main(), then the process exits.

    Ctrl-C at any moment from here on, imports included, is exit 130 with one line on stderr.

    After the everyday tree commands (cli_spec's `quick`), the process runs without the cyclic garbage collector
    and leaves with os._exit once stdout and stderr are flushed. In these short commands the collector found next
    to nothing to free (none of the objects of an `unapply`, 33 of an `apply`) but ran up to 19 times, walking the
    young objects (the manifests' thousands of tuples): up to 4.6 ms. os._exit skips the interpreter's teardown
    (module and object finalisation, about 6 ms). Nothing on those paths needs it: every file they write is closed
    (and the journal, state and backups fsynced) before main() returns, the threads they wait on have finished,
    and nothing registers an atexit handler. An interrupted command (exit 130) leaves the same way, once it has
    unwound through its clean-up.
    """
    import signal

    interrupt = _Interrupt()
    signal.signal(signal.SIGINT, interrupt)
    quick = False
    try:
        _streams()
        from forktool import cli_spec

        command = cli_spec.find(sys.argv[1:])
        quick = command is not None and command.quick
        if quick:
            import gc

            gc.disable()
        code = main()
        try:
            sys.stdout.flush()
        except OSError as e:
            from forktool.errors import OutputError

            code = unwritten(OutputError(e, code), None)
    except KeyboardInterrupt:
        code = INTERRUPTED
    interrupt.finished = True
    if code == BROKEN_PIPE:
        _die_by_sigpipe()
    if quick or code == INTERRUPTED:
        # an interrupted command has unwound through its clean-up: leaving without the interpreter's teardown
        # means a second Ctrl-C cannot land there, after Python has put SIGINT's default action back (which
        # would end the process by the signal instead of exit 130)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    entry()
