"""The only place that runs subprocesses: argv lists, captured output, clear failures."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from forktool.errors import ForktoolError


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")


class CalledProcessError(ForktoolError):
    """A subprocess exited non-zero; the message carries command, code and output."""


def ended(code: int) -> str:
    """How a process that did not succeed ended, for a message: `failed with exit code N`, or `was killed by SIGNAME`
    for a negative return code (a signal ended it: it has no exit code, and a crash or an OOM kill is named so)."""
    if code >= 0:
        return f"failed with exit code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def _not_found(args: tuple[str, ...]) -> ForktoolError:
    return ForktoolError(f"command not found: {args[0]}", where=" ".join(args),
                         hint=f"install {args[0]} or put it on PATH")


def _clean_env(env: Mapping[str, str] | None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    # git must not pick up a user's pager, editor or locale-dependent output
    base.update({"LC_ALL": "C", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0"})
    if env:
        base.update(env)
    return base


def run(argv: Sequence[str | os.PathLike[str]], *, cwd: Path | None = None, check: bool = True,
        env: Mapping[str, str] | None = None, input: bytes | None = None,
        capture: bool = True, timeout: float | None = None) -> Result:
    args = tuple(os.fspath(a) for a in argv)
    try:
        cp = subprocess.run(args, cwd=cwd, env=_clean_env(env), input=input, timeout=timeout,
                            stdout=subprocess.PIPE if capture else None,
                            stderr=subprocess.PIPE if capture else None)
    except FileNotFoundError as e:
        raise _not_found(args) from e
    except subprocess.TimeoutExpired as e:
        raise ForktoolError(f"command timed out after {timeout} s: {' '.join(args)}", where=str(cwd or Path.cwd()),
                            details=[f"stderr: {_tail(e.stderr or b'')}"],
                            hint="run that command by hand there to see where it stops, then run forktool again") \
            from e
    res = Result(args, cp.returncode, cp.stdout or b"", cp.stderr or b"")
    if check and cp.returncode != 0:
        raise CalledProcessError(
            f"command {ended(cp.returncode)}: {' '.join(args)}",
            where=str(cwd or Path.cwd()),
            details=[f"stdout: {_tail(res.stdout)}", f"stderr: {_tail(res.stderr)}"],
        )
    return res


def stream(argv: Sequence[str | os.PathLike[str]], *, cwd: Path | None = None, check: bool = True,
           env: Mapping[str, str] | None = None, on_line: Callable[[str], None] | None = None) -> Result:
    """Like run, but hands each output line (stdout and stderr merged) to on_line as it arrives."""
    args = tuple(os.fspath(a) for a in argv)
    lines: list[bytes] = []
    try:
        p = subprocess.Popen(args, cwd=cwd, env=_clean_env(env), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError as e:
        raise _not_found(args) from e
    assert p.stdout is not None
    with p:
        for raw in p.stdout:
            lines.append(raw)
            if on_line is not None:
                on_line(raw.decode("utf-8", "replace").rstrip("\n"))
    res = Result(args, p.returncode, b"".join(lines), b"")
    if check and p.returncode != 0:
        raise CalledProcessError(f"command {ended(p.returncode)}: {' '.join(args)}",
                                 where=str(cwd or Path.cwd()), details=[f"output: {_tail(res.stdout)}"])
    return res


def run_session(argv: Sequence[str | os.PathLike[str]], *, cwd: Path | None = None, timeout: float | None = None,
                env: Mapping[str, str] | None = None, grace: float = 5.0) -> tuple[Result, bool]:
    """Run a long command (a gate) in a session of its own: (result, timed_out).

    Everything it starts shares its process group, so a timeout, an interrupt or a termination stops all of it, not
    only the first process: SIGTERM to the group, SIGKILL to what is left after `grace` seconds. On a timeout the
    output it wrote so far is returned. A Ctrl-C (SIGINT) sends the group its SIGTERM in the signal handler itself,
    before the process's own handler runs (a second Ctrl-C ends forktool at once), and is re-raised once the group
    is stopped. A SIGTERM or SIGHUP to forktool (`timeout`, a closed terminal, a CI job cancelled), which the session
    does not receive, stops the group and then ends forktool by that signal.
    """
    args = tuple(os.fspath(a) for a in argv)
    started: list[subprocess.Popen] = []
    pending: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not started:  # Popen is starting it: hold the signal until there is a group to stop
            pending.append(signum)
            return
        if signum != signal.SIGINT:
            stop_group(started[0], grace)
            # the last word before dying by the signal: what was stopped, and that it did not finish (os.write: no
            # buffered stream is entered from a signal handler); a full or broken stderr must not keep forktool from
            # dying by the signal (an OSError here would be reported as a full disk or an internal error)
            try:
                os.write(2, f"forktool: {signal.Signals(signum).name} received: stopped `{' '.join(args)[:200]}` and "
                            f"everything it started; it did not finish, so nothing it checks was checked\n"
                            .encode("utf-8", "replace"))
            except OSError:
                pass
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        _signal_group(started[0].pid, signal.SIGTERM)
        handler = prev.get(signum)
        if callable(handler):
            handler(signum, frame)
        raise KeyboardInterrupt

    prev: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for caught in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            prev[caught] = signal.signal(caught, on_signal)
    try:
        try:
            p = subprocess.Popen(args, cwd=cwd, env=_clean_env(env), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except FileNotFoundError as e:
            raise _not_found(args) from e
        started.append(p)
        timed_out = False
        with p:
            try:
                for held in sorted(set(pending), reverse=True):  # SIGTERM (15) before SIGINT (2)
                    on_signal(held, None)
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                stop_group(p, grace)
                try:
                    out, err = p.communicate(timeout=grace)
                except subprocess.TimeoutExpired:  # a process that left the group still holds the pipes
                    out, err = b"", b""
            except BaseException:
                stop_group(p, grace)
                raise
    finally:
        for restored, handler in prev.items():
            signal.signal(restored, handler)  # type: ignore[arg-type]
    return Result(args, p.returncode if p.returncode is not None else -9, out or b"", err or b""), timed_out


def _signal_group(pgid: int, sig: int) -> bool:
    """Send sig to a process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def stop_group(p: subprocess.Popen, grace: float) -> None:
    """SIGTERM to p's process group, then SIGKILL to whatever of it is still there after grace seconds."""
    if not _signal_group(p.pid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    try:
        while time.monotonic() < deadline:
            p.poll()  # reap the leader, so that the group is empty once its last member is gone
            if not _signal_group(p.pid, 0):
                return
            time.sleep(0.05)
    finally:  # also when a second Ctrl-C cuts the wait short
        _signal_group(p.pid, signal.SIGKILL)
        p.poll()


def _tail(data: bytes, limit: int = 2000) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else "…" + text[-limit:]
