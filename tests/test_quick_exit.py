"""`python -m forktool` (and the console script) leave without the interpreter's teardown after the everyday tree
commands: the output is complete, the exit code is the command's, and a closed pipe still ends cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.project import Proj
from tests.helpers.series import drifting_patches


def _sub(p: Proj, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FORKTOOL_ROOT=str(p.root))
    return subprocess.run([sys.executable, "-m", "forktool", *args], env=env, capture_output=True, text=True)


def test_quick_exit_keeps_output_and_exit_codes(proj: Proj):
    drifting_patches(proj)
    r = _sub(proj, "apply", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["top"] == "0071"  # the whole document arrived
    status = _sub(proj, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout) == proj.json("status")
    typer_status = _sub(proj, "status", "--json", "--json")  # the typer dispatch leaves by the same quick exit
    assert typer_status.returncode == 0 and json.loads(typer_status.stdout) == proj.json("status")
    proj.edit("up/src/b.c", "line 3\n", "mine\n")
    r = _sub(proj, "unapply")
    assert r.returncode == 1 and "modified: up/src/b.c" in r.stderr and "--force" in r.stderr
    r = _sub(proj, "unapply", "--force")
    assert r.returncode == 0 and "backed up and overwrote 1" in r.stderr
    assert _sub(proj, "apply", "--upto", "nope").returncode == 2


def test_quick_exit_into_a_closed_pipe(proj: Proj):
    drifting_patches(proj)
    proj.run("apply")
    env = dict(os.environ, FORKTOOL_ROOT=str(proj.root))
    r = subprocess.run(f"{sys.executable} -m forktool status --json | head -c 1", shell=True, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "{"
    assert "Traceback" not in r.stderr


def test_in_process_callers_keep_the_collector(proj: Proj):
    import gc

    drifting_patches(proj)
    proj.run("apply")
    proj.run("status")
    assert gc.isenabled()  # only the console script's entry() turns it off, for the process it ends
