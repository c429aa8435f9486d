"""Refusals that leave everything as it was: each bad input is an exit-1 (or usage) error and the tree's digest holds."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import corpus
from tests.helpers.project import UPSTREAM, Proj, bare_project, make_project
from tests.helpers.pypi import local_sdist, sdist_pin


@pytest.fixture
def applied(tmp_path: Path, cache: Path) -> Proj:
    proj = make_project(tmp_path, UPSTREAM)
    for name, text in corpus.SERIES.items():
        proj.write_patch(name, text)
    proj.run("apply")
    return proj


def _files(root: Path) -> dict[str, bytes]:
    """Every file under root by its bytes (links by their target): what 'nothing changed' means for a project."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = os.readlink(p).encode()
        elif p.is_file():
            out[rel] = p.read_bytes()
    return out


def _project_files(proj: Proj) -> dict[str, bytes]:
    """The project minus the caches forktool may refresh while refusing (never the tree, patches or state)."""
    return {k: v for k, v in _files(proj.root).items() if not k.startswith((".opencoti/cache/", ".opencoti/index"))}


def test_a_file_that_is_also_the_directory_of_another_new_file_is_refused_before_commit(applied: Proj) -> None:
    extra = corpus.make_patch("x.patch", {"up/src/d": (None, "a\n"), "up/src/d/e.c": (None, "b\n")})
    p = applied.root / "patches" / "0089-three.patch"
    p.write_bytes(p.read_bytes() + extra.split("\n---\n", 1)[1].encode())
    before, backups = applied.digest(), sorted(os.listdir(applied.root / ".opencoti" / "vendor-backups"))
    code, out, err = applied.run("apply", expect=1)
    assert "up/src/d is written as a file and as the directory of up/src/d/e.c" in err and "nothing was changed" in err
    assert applied.digest() == before
    assert not (applied.root / ".opencoti" / "txn").exists()
    # refused before the backup: nothing is left behind to prune
    assert sorted(os.listdir(applied.root / ".opencoti" / "vendor-backups")) == backups
    applied.run("status")


def test_the_vendored_root_as_a_regular_file_is_refused(applied: Proj) -> None:
    shutil.rmtree(applied.tree)
    applied.tree.write_text("not a tree\n")
    before = _project_files(applied)
    for argv in (["apply"], ["unapply"], ["status"], ["verify"]):
        code, out, err = applied.run(*argv, expect=1)
        assert "is not a directory; the vendored tree must be a real directory" in err, err
        assert "Traceback" not in err
    assert _project_files(applied) == before


def test_forktool_root_longer_than_a_path_may_be_is_refused(applied: Proj, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from forktool import cli
    before = applied.digest()
    monkeypatch.setenv("FORKTOOL_ROOT", "/" + "a" * 5000)
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert "FORKTOOL_ROOT cannot be used as a project directory: File name too long" in err
    assert "Traceback" not in err and len(err) < 1000
    assert applied.digest() == before


def test_forktool_cache_as_a_regular_file_is_refused_and_nothing_downloads(applied: Proj, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    bogus = tmp_path / "cache-file"
    bogus.write_text("x")
    monkeypatch.setenv("FORKTOOL_CACHE", str(bogus))
    before = _project_files(applied)
    for argv in (["status"], ["verify"], ["apply"], ["vendor", "fetch"]):
        code, out, err = applied.run(*argv, expect=1)
        assert f"FORKTOOL_CACHE ({bogus}) is not a directory" in err, err
    assert bogus.read_text() == "x"
    assert _project_files(applied) == before


def test_opening_a_workspace_never_downloads(applied: Proj, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-cache"
    monkeypatch.setenv("FORKTOOL_CACHE", str(empty))
    before = _project_files(applied)
    for argv in (["status"], ["verify"], ["apply"], ["unapply"]):
        code, out, err = applied.run(*argv, expect=1)
        assert "is not in the cache" in err and "forktool vendor fetch" in err, err
    # nothing fetched, archived or written: no git mirror, no pristine, vendor.lock as it was
    assert not any((empty / d).exists() for d in ("git", "sdist", "objects", "pristine"))
    assert _project_files(applied) == before
    # `vendor fetch` is the one command that downloads; after it the workspace opens again
    applied.run("vendor", "fetch")
    applied.run("verify")


def test_vendor_fetch_with_a_missing_sdist_names_it(applied: Proj) -> None:
    before = _project_files(applied)
    code, out, err = applied.run("vendor", "fetch", "--sdist", "/nonexistent", expect=1)
    assert "--sdist /nonexistent: No such file or directory" in err
    assert _project_files(applied) == before


def test_vendor_fetch_with_an_sdist_for_a_project_without_one_is_refused(applied: Proj, tmp_path: Path) -> None:
    sd = tmp_path / "x.tar.gz"
    sd.write_bytes(b"x")
    before = _project_files(applied)
    code, out, err = applied.run("vendor", "fetch", "--sdist", str(sd), expect=1)
    assert "0 sdist component(s)" in err
    assert _project_files(applied) == before


def test_a_patch_whose_subject_is_not_utf8_is_refused_by_every_command_that_reads_it(applied: Proj) -> None:
    p = applied.root / "patches" / "0070-one.patch"
    p.write_bytes(p.read_bytes().replace(b"Subject: [PATCH] one", b"Subject: [PATCH] on\xffe"))
    applied.edit("up/src/a.c", "return 2;", "return 3;")
    before = _project_files(applied)
    for argv in (["refresh", "0070"], ["verify"], ["verify", "--no-cache"], ["apply"], ["unapply"]):
        code, out, err = applied.run(*argv, expect=1)
        assert "the patch message is not UTF-8 (byte 0xff on line 4)" in err, (argv, err)
        assert "patches/0070-one.patch:4" in err and "OK" not in out
        assert _project_files(applied) == before


@pytest.mark.parametrize("spoil", [
    lambda b: b[:-1],  # truncated: no final newline
    lambda b: b"",  # emptied
    lambda b: b.replace(b"\n", b"\r\n", 3),  # CRLF
    lambda b: b + b"x\0y\n",  # NUL bytes
])
def test_the_hint_for_a_patch_forktool_cannot_read_is_one_that_works(applied: Proj, spoil) -> None:
    p = applied.root / "patches" / "0089-three.patch"
    p.write_bytes(spoil(p.read_bytes()))
    before = _project_files(applied)
    code, out, err = applied.run("status", expect=1)
    assert "git checkout -- patches/0089-three.patch" in err
    # what the hint once said to do: refresh refuses the same file, so it is no way out
    assert "forktool refresh ID" not in err and "regenerate with refresh" not in err
    code, out, err2 = applied.run("refresh", "0089", expect=1)
    assert err2 == err
    assert _project_files(applied) == before


def test_a_tree_without_its_state_file_says_so_and_the_way_it_names_works(applied: Proj) -> None:
    (applied.root / ".opencoti" / "state.json").unlink()
    before = _project_files(applied)
    code, out, err = applied.run("apply", expect=1)
    # it named only `forktool new SLUG` + `forktool refresh ID` for what are the series' own changes
    assert "there is no .opencoti/state.json" in err and "`forktool apply --force` backs it up" in err
    code, out, err = applied.run("status")
    assert "note: there is no .opencoti/state.json" in err
    assert _project_files(applied) == before
    applied.run("apply", "--force")
    applied.run("verify")


@pytest.mark.parametrize("pid", ["0089", "0071"])
def test_refresh_without_a_vendored_tree_is_refused_and_the_patch_kept(applied: Proj, pid: str) -> None:
    shutil.rmtree(applied.tree)
    before = _project_files(applied)
    code, out, err = applied.run("refresh", pid, expect=1)
    # it rewrote the patch as the deletion of every upstream file, exit 0
    assert f"the vendored tree is absent, so there is nothing to refresh patch {pid} from" in err
    assert f"`forktool apply --upto {pid}`" in err
    assert _project_files(applied) == before
    applied.run("apply", "--upto", pid)  # the way it names works
    code, out, err = applied.run("refresh", pid)
    assert "(966 file(s)" not in err and "hooks: none" not in err


def test_refresh_of_an_id_the_series_does_not_name_says_so(applied: Proj) -> None:
    before = _project_files(applied)
    code, out, err = applied.run("refresh", "0099", expect=2)
    assert "no patch 0099 in patches/series" in err and "apply --upto 0099" not in err
    assert _project_files(applied) == before


def _json_error(proj: Proj, *argv: str) -> dict:
    import json
    code, out, err = proj.run(*argv, "--json", expect=1)
    return json.loads(out)


def test_every_unexplained_change_is_one_error_kind(applied: Proj) -> None:
    """Changes no patch explains, in the tree or in an applied patch's file, are refused the same way by every
    command that checks them: exit 1, kind DirtyTreeError."""
    edited = _project_files(applied)
    applied.edit("up/src/b.c", "line 3\n", "line three\n")
    for argv in (["apply", "--upto", "0070"], ["apply", "--reanchor"], ["package"],
                 ["sync", "--to", applied.upstream.as_posix() + "@HEAD", "--start"]):
        err = _json_error(applied, *argv)
        assert err["kind"] == "DirtyTreeError" and "no patch explains" in err["error"], (argv, err)
    applied.edit("up/src/b.c", "line three\n", "line 3\n")
    assert _project_files(applied) == edited
    p = applied.root / "patches" / "0071-two.patch"
    p.write_text(p.read_text().replace("+// opencoti-hook: two", "+// opencoti-hook: two\n+// more"))
    p.write_text(p.read_text().replace("@@ -8,6 +8,7 @@", "@@ -8,6 +8,8 @@"))
    before = _project_files(applied)
    for argv in (["refresh", "0089"], ["build", "--plan"], ["package"]):
        err = _json_error(applied, *argv)
        assert err["kind"] == "DirtyTreeError" and "0071 changed on disk" in err["error"], (argv, err)
    assert _project_files(applied) == before


KILL_AFTER_MERGE = """
import os, signal, sys
import git
from forktool import cli
real = git.Git.execute
def execute(self, argv, *a, **k):
    out = real(self, argv, *a, **k)
    if "merge-file" in argv:
        os.kill(os.getpid(), signal.SIGKILL)  # killed while the merge's inputs exist
    return out
git.Git.execute = execute
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_sync_killed_during_a_merge_leaves_no_temporary_files(tmp_path: Path, cache: Path) -> None:
    import subprocess
    import sys

    from tests.helpers import sync as loop
    proj = make_project(tmp_path, UPSTREAM)
    loop.loop_series(proj)
    commit = loop.new_upstream(proj)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    env = dict(os.environ, FORKTOOL_ROOT=str(proj.root), TMPDIR=str(tmpdir))
    r = subprocess.run([sys.executable, "-c", KILL_AFTER_MERGE, "sync", "--to", commit, "--start"], env=env,
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == -9, r.stderr  # it did reach a merge
    assert sorted(os.listdir(tmpdir)) == []
    assert not [p for p in (proj.root / ".opencoti").rglob("*") if "merge" in p.name]
    # the killed start is undone by --abort as any other stop
    code, out, err = proj.run("sync", "--abort", expect=None)
    assert code == 0, err


def test_only_vendor_fetch_downloads_and_it_shows_pip_as_it_goes(tmp_path: Path, cache: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sha = local_sdist(tmp_path / "links", "1.0", b"int a;\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "links"))
    root = bare_project(tmp_path / "proj", sdist_pin(sha))
    from tests.helpers.cli import run_cli
    code, out, err = run_cli(root, ["vendor", "fetch"])
    assert "downloading pkg==1.0 with pip" in err and "pip: Saved" in err
    assert (root / "vendor" / "llamafile" / "up" / "src" / "a.c").read_text() == "int a;\n"
    run_cli(root, ["status"])
    # a fresh cache: status names what is missing and the command that fetches it; pip never runs
    fresh = tmp_path / "fresh-cache"
    monkeypatch.setenv("FORKTOOL_CACHE", str(fresh))
    lock = (root / "vendor" / "vendor.lock").read_bytes()
    for argv in (["status"], ["verify"], ["apply"]):
        code, out, err = run_cli(root, argv, expect=1)
        assert "is not in the cache" in err and "forktool vendor fetch" in err and "pip" not in err
    assert not (fresh / "sdist").exists() and (root / "vendor" / "vendor.lock").read_bytes() == lock


def _read_only(d: Path) -> Callable[[], None] | None:
    """Make the directory d one this process may not change (chmod a-w; as root, whom modes do not stop, the
    immutable attribute); returns how to undo it, or None where neither is possible."""
    d.chmod(0o555)
    if not os.access(d, os.W_OK):
        return lambda: d.chmod(0o755)
    d.chmod(0o755)
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0:
        return lambda: subprocess.run(["chattr", "-i", str(d)], check=True)
    return None


def test_a_read_only_directory_in_the_tree_is_refused_before_the_plan_is_committed(applied: Proj) -> None:
    # the rename into a directory the process may not change failed after the plan was committed: the tree was
    # left half moved, behind a journal that blocked every command until the directory was made writable
    undo = _read_only(applied.tree / "up" / "src")
    if undo is None:
        pytest.skip("cannot make a directory read-only here (root without chattr)")
    before = _project_files(applied)
    backups = sorted(os.listdir(applied.root / ".opencoti" / "vendor-backups"))
    try:
        for argv in (["unapply"], ["unapply", "--force"], ["apply", "--upto", "0070"]):
            code, out, err = applied.run(*argv, expect=1)
            assert "the directory up/src of the vendored tree is not writable" in err
            assert "nothing was changed" in err and "chmod u+w" in err
            assert _project_files(applied) == before
            assert not (applied.root / ".opencoti" / "txn").exists()
            assert sorted(os.listdir(applied.root / ".opencoti" / "vendor-backups")) == backups
        applied.run("status")
    finally:
        undo()
    applied.run("unapply")
    applied.run("verify")
