"""Download temporary directories live under .opencoti/tmp/: a fetch killed with SIGKILL leaves nothing in $TMPDIR,
and what it leaves there is removed by the next forktool that fetches or starts a sync."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli, signal_at
from tests.helpers.project import Proj, bare_project
from tests.helpers.pypi import local_sdist, sdist_pin
from tests.helpers.sync import loop_series, new_upstream

KILL_AFTER_PIP = """
import os, signal, sys
from forktool import cli, vendor
real = vendor.pip_download
def pip_download(*a, **k):
    out = real(*a, **k)
    os.kill(os.getpid(), signal.SIGKILL)  # killed while the download's temporary directory holds the sdist
    return out
vendor.pip_download = pip_download
sys.exit(cli.main(sys.argv[1:]))
"""

def _killed(root: Path, tmpdir: Path, *argv: str) -> None:
    env = dict(os.environ, FORKTOOL_ROOT=str(root), TMPDIR=str(tmpdir))
    r = subprocess.run([sys.executable, "-c", KILL_AFTER_PIP, *argv], env=env, capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == -9, r.stderr  # it did reach the download


def test_a_fetch_killed_mid_download_leaves_nothing_in_tmpdir(tmp_path: Path, cache: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    links = tmp_path / "links"
    sha = local_sdist(links, "1.0", b"int a;\n")
    local_sdist(links, "2.0", b"int a;\nint b;\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    root = bare_project(tmp_path / "proj", sdist_pin(sha))
    tmp = root / ".opencoti" / "tmp"
    # vendor fetch killed once pip has saved the sdist: its directory is under .opencoti/tmp, $TMPDIR is empty
    _killed(root, tmpdir, "vendor", "fetch")
    assert os.listdir(tmpdir) == []
    [left] = os.listdir(tmp)
    assert left.startswith("forktool-dl-") and (tmp / left / "pkg-1.0.tar.gz").is_file()
    run_cli(root, ["vendor", "fetch"])
    assert os.listdir(tmp) == [] and os.listdir(tmpdir) == []  # the next fetch removed the killed one's
    assert (root / "vendor" / "llamafile" / "up" / "src" / "a.c").read_text() == "int a;\n"
    # a sync killed while it downloads its target: the same, and the next start removes what it left
    pin = (root / "vendor" / "vendor.yaml").read_bytes()
    _killed(root, tmpdir, "sync", "--to", "pkg==2.0", "--start")
    assert os.listdir(tmpdir) == []
    [left] = os.listdir(tmp)
    assert left.startswith("forktool-sync-dl-") and (tmp / left / "pkg-2.0.tar.gz").is_file()
    assert (root / "vendor" / "vendor.yaml").read_bytes() == pin
    code, out, err = run_cli(root, ["sync", "--to", "pkg==2.0", "--start"], expect=None)
    assert code == 0, err
    assert os.listdir(tmp) == [] and os.listdir(tmpdir) == []
    assert (root / "vendor" / "llamafile" / "up" / "src" / "a.c").read_text() == "int a;\nint b;\n"
    assert 'version: "2.0"' in (root / "vendor" / "vendor.yaml").read_text()


def test_a_live_process_keeps_its_temporary_directory(tmp_path: Path) -> None:
    from forktool import vendor
    from forktool.project import Project

    root = tmp_path / "proj"
    (root / "vendor").mkdir(parents=True)
    project = Project(root)
    tmp = root / ".opencoti" / "tmp"
    with vendor.temp_dir(project, "forktool-dl-") as mine:
        (mine / "x").write_bytes(b"x")
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
        (tmp / f"forktool-sync-dl-{dead}-abc").mkdir()
        (tmp / f"forktool-sync-dl-{dead}-abc" / "f").write_bytes(b"y")
        assert vendor.clean_temp(project) == [f"forktool-sync-dl-{dead}-abc"]
        assert (mine / "x").read_bytes() == b"x"  # this process is alive: its directory stays
    assert os.listdir(tmp) == []


def test_only_the_work_directories_of_dead_processes_are_removed(tmp_path: Path) -> None:
    # the one cleaner of backups' .tmp-PID-, releases' .NAME.PID-, trials' .patches-PID- and materialisations'
    # .NAME-PID- work directories: a live process's, a link, a file or another name stays
    import re

    from forktool.tree import remove_dead_work_dirs

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (tmp_path / f".w-{dead}-a" / "sub").mkdir(parents=True)
    (tmp_path / f".w-{dead}-a" / "sub" / "f").write_bytes(b"x")
    (tmp_path / f".w-{os.getpid()}-b").mkdir()
    (tmp_path / "kept").mkdir()
    (tmp_path / f".w-{dead}-link").symlink_to(tmp_path / "kept")
    (tmp_path / f".w-{dead}-file").write_bytes(b"y")
    (tmp_path / "other").mkdir()
    assert remove_dead_work_dirs(tmp_path, re.compile(r"^\.w-(\d+)-")) == [f".w-{dead}-a"]
    assert sorted(os.listdir(tmp_path)) == sorted([f".w-{os.getpid()}-b", "kept", f".w-{dead}-link",
                                                   f".w-{dead}-file", "other"])
    assert remove_dead_work_dirs(tmp_path / "absent", re.compile(r"^\.w-(\d+)-")) == []


@pytest.mark.parametrize("moment", ["forktool-drift-", "/.patches-"])
def test_a_trial_ended_by_sigterm_leaves_nothing_in_tmpdir_or_its_out(proj: Proj, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      moment: str) -> None:
    # SIGTERM (a cancelled CI job, `timeout`) runs no clean-up: the trees a trial configures for the build-file
    # drift live under .opencoti/tmp/, and the patches/ it was writing carries its process id, so the next trial
    # removes both; $TMPDIR is never written
    loop_series(proj)
    commit = new_upstream(proj)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    out = proj.root / "dist" / "sync"
    r = signal_at(proj.root, signal.SIGTERM, moment, ["sync", "--to", commit])
    assert r.returncode == -signal.SIGTERM, r.stderr
    assert os.listdir(tmpdir) == []
    code, _, err = proj.run("sync", "--to", commit, expect=1)  # 1: 0002 conflicts there
    assert "report.md" in err
    assert os.listdir(tmpdir) == [] and os.listdir(proj.root / ".opencoti" / "tmp") == []
    assert sorted(os.listdir(out)) == ["patches", "report.json", "report.md"]


@pytest.mark.parametrize("event,moment", [("os.rename", "/.patches-"), ("open", "/dist/sync/.forktool-")])
def test_a_trial_ended_by_sigterm_never_leaves_a_report_of_another_run(proj: Proj, event: str, moment: str) -> None:
    # a second trial into the same --out, ended between putting its patches/ in place and writing its reports
    # (the old patches/ moved out, the new one not yet in; the new patches in, the reports not yet all written):
    # every report DIR holds describes the patches beside it, and none is the first trial's
    from tests.helpers.project import git

    loop_series(proj)
    first = new_upstream(proj)
    out = proj.root / "dist" / "sync"
    proj.run("sync", "--to", first, expect=1)
    old = {n: (out / n).read_bytes() for n in ("report.json", "report.md")}
    b = proj.upstream / "src" / "b.c"
    b.write_text("newer\n" + b.read_text())  # 0001 moves by one more line: another refreshed patch
    git(proj.upstream, "commit", "-qam", "newer still")
    second = git(proj.upstream, "rev-parse", "HEAD")
    r = signal_at(proj.root, signal.SIGTERM, moment, ["sync", "--to", second], event=event)
    assert r.returncode == -signal.SIGTERM, r.stderr
    left = {n: (out / n).read_bytes() for n in ("report.json", "report.md") if (out / n).exists()}
    patches = {p.name: p.read_bytes() for p in (out / "patches").iterdir()} if (out / "patches").is_dir() else None
    assert not any(left[n] == old[n] for n in left), "a report of the first trial is left beside other patches"
    proj.run("sync", "--to", second, expect=1)
    assert sorted(os.listdir(out)) == ["patches", "report.json", "report.md"]
    for n, data in left.items():  # a report left by the killed trial is the one a whole run writes
        assert data == (out / n).read_bytes()
        assert patches == {p.name: p.read_bytes() for p in (out / "patches").iterdir()}


def test_a_trial_with_build_retires_the_reports_before_its_build(proj: Proj, monkeypatch: pytest.MonkeyPatch) -> None:
    # --build fills DIR/build-project/ before the reports are written: the reports of the trial before are gone by
    # then, so a trial cut short during its build leaves no report of another build beside it
    from forktool.sync import job
    from tests.helpers.project import git

    loop_series(proj)
    out = proj.root / "dist" / "sync"
    b = proj.upstream / "src" / "b.c"
    b.write_text("newer\n" + b.read_text())  # every patch applies (0001 at an offset): the build is tried
    git(proj.upstream, "commit", "-qam", "newer")
    commit = git(proj.upstream, "rev-parse", "HEAD")
    proj.run("sync", "--to", commit, expect=0)
    assert (out / "report.json").is_file()
    seen = []

    def build(project: object, scratch: Path, *a: object) -> dict:
        seen.append(sorted(n for n in ("report.json", "report.md") if (out / n).exists()))
        return {"status": "failed", "step": "build", "exit_code": 1, "log_tail": [], "seconds": 0.0}

    monkeypatch.setattr(job, "run_build", build)
    proj.run("sync", "--to", commit, "--build", expect=1)
    assert seen == [[]]
    assert json.loads((out / "report.json").read_text())["build"]["status"] == "failed"
