"""The only place that runs subprocesses: argv lists, captured output, clear failures."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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
        raise ForktoolError(f"command not found: {args[0]}", where=" ".join(args),
                            hint=f"install {args[0]} or put it on PATH") from e
    except subprocess.TimeoutExpired as e:
        raise ForktoolError(f"command timed out after {timeout} s: {' '.join(args)}", where=str(cwd or Path.cwd()),
                            details=[f"stderr: {_tail(e.stderr or b'')}"]) from e
    res = Result(args, cp.returncode, cp.stdout or b"", cp.stderr or b"")
    if check and cp.returncode != 0:
        raise CalledProcessError(
            f"command failed with exit code {cp.returncode}: {' '.join(args)}",
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
        raise ForktoolError(f"command not found: {args[0]}", where=" ".join(args),
                            hint=f"install {args[0]} or put it on PATH") from e
    assert p.stdout is not None
    with p:
        for raw in p.stdout:
            lines.append(raw)
            if on_line is not None:
                on_line(raw.decode("utf-8", "replace").rstrip("\n"))
    res = Result(args, p.returncode, b"".join(lines), b"")
    if check and p.returncode != 0:
        raise CalledProcessError(f"command failed with exit code {p.returncode}: {' '.join(args)}",
                                 where=str(cwd or Path.cwd()), details=[f"output: {_tail(res.stdout)}"])
    return res


def _tail(data: bytes, limit: int = 2000) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else "…" + text[-limit:]
