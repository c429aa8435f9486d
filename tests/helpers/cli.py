"""The forktool CLI run in-process, capturing its stdout and stderr."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from forktool import cli


def run_cli(root: Path, args: list[str], expect: int | None = 0) -> tuple[int, str, str]:
    import contextlib
    import io

    from forktool import output
    out, err = io.StringIO(), io.StringIO()
    old_env = os.environ.get("FORKTOOL_ROOT")
    os.environ["FORKTOOL_ROOT"] = str(root)
    try:
        with contextlib.redirect_stdout(out), output.capture(err):
            code = cli.main(args)
    finally:
        if old_env is None:
            os.environ.pop("FORKTOOL_ROOT", None)
        else:
            os.environ["FORKTOOL_ROOT"] = old_env
    if expect is not None:
        assert code == expect, f"forktool {' '.join(args)} exited {code}, expected {expect}\n{err.getvalue()}\n{out.getvalue()}"
    return code, out.getvalue(), err.getvalue()


# forktool in a process that sends itself a signal when it first raises an audit event (by default "open") whose first
# argument is a path holding a given text: a real SIGTERM or SIGHUP at a named moment, never a race with a timer
_SIGNAL_AT = r"""
import os, sys
sig, event, what = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def hook(name, args):
    if name == event and args and isinstance(args[0], (str, bytes, os.PathLike)) and what in os.fsdecode(args[0]):
        os.kill(os.getpid(), sig)
sys.addaudithook(hook)
sys.argv = ["forktool", *sys.argv[4:]]
import runpy
runpy.run_module("forktool", run_name="__main__", alter_sys=True)
"""


def signal_at(root: Path, sig: int, what: str, args: list[str], env: dict[str, str] | None = None,
              event: str = "open") -> subprocess.CompletedProcess:
    """`forktool ARGS` in a process of its own, sent `sig` at its first audit `event` on a path holding `what` (an
    "open" is seen before the file exists; "os.rename" once the file renamed is whole)."""
    return subprocess.run([sys.executable, "-c", _SIGNAL_AT, str(int(sig)), event, what, *args],
                          env=dict(os.environ, FORKTOOL_ROOT=str(root), **(env or {})), capture_output=True, text=True)


def tool_that_dies(bin_dir: Path, monkeypatch: Any, tool: str, when: str, sig: str) -> None:
    """PATH gets, first, a `tool` (in bin_dir) that kills itself with sig when its arguments match the shell case
    pattern `when` (the arguments joined by spaces, a space either side), and else runs the real one."""
    real = shutil.which(tool)
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / tool).write_text(f'#!/bin/sh\ncase " $* " in {when}) kill -{sig} $$ ;; esac\nexec {real} "$@"\n')
    (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
