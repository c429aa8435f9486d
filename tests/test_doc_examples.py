"""The console examples of the manual pages print what they show: each is run on a copy of this project (the
README's own session is tests/test_readme.py's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.project import REPO, copy_real_project

# a backup's time stamp differs from run to run
TIME = re.compile(r"\b\d{8}-\d{6}\b")


def shown_session(page: str, first: str) -> list[tuple[str, list[str]]]:
    """(command, output lines) of the fenced block of PAGE whose first line is FIRST."""
    text = (REPO / page).read_text()
    start = text.index(f"```\n{first}\n") + 4
    block = text[start:text.index("\n```", start)].split("\n")
    steps: list[tuple[str, list[str]]] = []
    for line in block:
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def run(root: Path, env: dict[str, str], command: str, extra: dict[str, str] | None = None):
    return subprocess.run(["bash", "-c", command], cwd=root, env={**env, **(extra or {})}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


@pytest.mark.integration
def test_safety_md_recover_example_runs_as_shown(tmp_path: Path, session_cache: Path):
    root = copy_real_project(tmp_path / "p")
    env = {k: v for k, v in os.environ.items() if k not in ("FORKTOOL_ROOT", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(FORKTOOL_CACHE=str(session_cache), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
               COLUMNS="1000")
    # the state the example starts from: an apply from 0071 to the top killed while replacing files, then one of
    # its staged files spoiled
    for setup in ("forktool vendor fetch", "forktool apply --upto 0071"):
        assert run(root, env, setup).returncode == 0, setup
    assert run(root, env, "forktool apply", {"FORKTOOL_FAULT": "replacing"}).returncode != 0
    with open(root / ".opencoti" / "txn" / "new" / "1", "ab") as f:
        f.write(b"spoiled\n")
    steps = shown_session("docs/safety.md", "$ forktool status")
    assert [c for c, _ in steps] == ["forktool status", "forktool recover"]
    for command, expected in steps:
        proc = run(root, env, command)
        got = [TIME.sub("<time>", ln.replace(str(root), "/p")).rstrip() for ln in proc.stdout.rstrip("\n").split("\n")]
        assert got == [TIME.sub("<time>", ln) for ln in expected], f"$ {command}\n{proc.stdout}"
