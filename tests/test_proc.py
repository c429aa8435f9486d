"""A child process ended by a signal is reported as killed, by its signal's name, never as an exit code or a refusal
of the inputs; the command that ran it fails (exit 1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from forktool import git as fgit
from forktool import proc
from forktool.errors import ForktoolError
from tests.helpers.cli import tool_that_dies
from tests.helpers.project import Proj

SUICIDE = "import os, signal; os.kill(os.getpid(), signal.{})"


def test_a_child_killed_by_a_signal_is_named_so() -> None:
    with pytest.raises(proc.CalledProcessError) as e:
        proc.run([sys.executable, "-c", SUICIDE.format("SIGKILL")])
    assert e.value.what.startswith("command was killed by SIGKILL: ")
    with pytest.raises(proc.CalledProcessError) as e:
        proc.stream([sys.executable, "-c", SUICIDE.format("SIGSEGV")])
    assert e.value.what.startswith("command was killed by SIGSEGV: ")
    with pytest.raises(proc.CalledProcessError) as e:
        proc.run([sys.executable, "-c", "raise SystemExit(3)"])
    assert e.value.what.startswith("command failed with exit code 3: ")


def test_git_merge_file_killed_is_not_taken_for_bad_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool_that_dies(tmp_path / "bin", monkeypatch, "git", "*merge-file*", "SEGV")
    with pytest.raises(ForktoolError) as e:
        fgit.merge_file(b"a\n", b"b\n", b"c\n", ("ours", "base", "theirs"))
    assert e.value.what == "git merge-file was killed by SIGSEGV" and "run the command again" in (e.value.hint or "")


def test_a_fetch_whose_git_is_killed_fails_naming_the_signal(proj: Proj, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_CACHE", str(tmp_path / "empty-cache"))  # nothing cached: git must clone
    tool_that_dies(tmp_path / "bin", monkeypatch, "git", "*clone*", "KILL")
    before = proj.state_digest()
    code, out, err = proj.run("vendor", "fetch", expect=1)
    assert "git was killed by SIGKILL" in err and "Traceback" not in err
    assert proj.state_digest() == before


def test_a_mirror_left_empty_by_a_killed_clone_is_cloned_again(proj: Proj, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # a clone SIGKILLed after making its directory and before `git init` there leaves it empty: gitpython refuses to
    # open it, which was an internal error (exit 3) at every later fetch until the cache was cleaned by hand
    import hashlib

    cache = tmp_path / "killed-clone-cache"
    monkeypatch.setenv("FORKTOOL_CACHE", str(cache))
    (cache / "git" / hashlib.sha256(str(proj.upstream).encode()).hexdigest()[:16]).mkdir(parents=True)
    before = proj.state_digest()
    proj.run("vendor", "fetch")
    assert proj.state_digest() == before
