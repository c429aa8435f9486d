"""The forktool CLI run in-process, capturing its stdout and stderr."""

from __future__ import annotations

import os
from pathlib import Path

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
