"""forktool recover: real journals left by a kill, spoiled, then rolled back from their backup or discarded."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests import corpus
from tests.helpers.cli import signal_at
from tests.helpers.project import Proj

POINTS = ["committed", "replacing", "state-written"]


@pytest.fixture
def series(proj: Proj) -> Proj:
    for name, text in corpus.SERIES.items():
        proj.write_patch(name, text)
    return proj


def _killed_apply(proj: Proj, point: str) -> Path:
    """apply killed at a fault point after its plan was committed: the journal it leaves."""
    r = proj.sub("apply", env={"FORKTOOL_FAULT": point})
    assert r.returncode == 137, r.stderr
    tdir = proj.root / ".opencoti" / "txn"
    assert (tdir / "plan.json").is_file()
    return tdir


def _spoil(tdir: Path, how: str) -> None:
    plan = tdir / "plan.json"
    if how == "garbage":
        plan.write_bytes(b"{not json")
    elif how == "staged-changed":
        staged = sorted((tdir / "new").iterdir())[-1]
        staged.write_bytes(staged.read_bytes() + b"tampered\n")
    elif how == "path-outside":
        doc = json.loads(plan.read_text())
        doc["entries"][-1]["path"] = "../../outside.txt"
        plan.write_text(json.dumps(doc))
    elif how == "foreign":
        plan.write_text(json.dumps({"entries": [], "state": {}, "written_by": "another tool"}))


def test_an_intact_journal_is_finished(series: Proj) -> None:
    _killed_apply(series, "committed")
    res = series.json("recover")
    [j] = res["journals"]
    assert j["kind"] == "tree" and j["damaged"] == "" and j["action"] == "finished (rolled forward)"
    assert res["check"]["clean"] and res["check"]["top"] == "0089"
    series.run("apply")  # nothing to move: it records the series' digest the killed apply did not reach
    series.run("verify")


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("how", ["garbage", "path-outside", "foreign"])
def test_a_damaged_journal_is_rolled_back_to_the_backup_taken_before_it(series: Proj, point: str, how: str) -> None:
    before = series.digest()  # pristine: apply's own backup holds this tree
    tdir = _killed_apply(series, point)
    _spoil(tdir, how)
    # every command refuses, pointing to recover rather than rm -rf
    code, out, err = series.run("status", expect=1)
    assert "damaged or not forktool's" in err and "forktool recover" in err and "rm -rf" not in err
    res = series.json("recover")
    [j] = res["journals"]
    assert j["damaged"] and j["action"].startswith("rolled back to backup ")
    assert series.digest() == before
    assert not tdir.exists() and res["check"]["clean"] and res["check"]["top"] is None
    # the half-written tree was kept too, and the project moves again
    assert j["saved_as"] or point == "committed"
    series.run("apply")
    series.run("verify")


def test_a_staged_file_that_changed_is_rolled_back_from_the_backup_the_plan_names(series: Proj) -> None:
    series.run("apply", "--upto", "0070")
    before = series.digest()
    tdir = _killed_apply(series, "committed")
    named = json.loads((tdir / "plan.json").read_text())["backup"]
    _spoil(tdir, "staged-changed")
    # a newer backup (of the tree with 0070 applied) is not the one to roll back to
    backups = series.root / ".opencoti" / "vendor-backups"
    shutil.copytree(backups / sorted(os.listdir(backups))[0], backups / "99991231-235959-newer")
    res = series.json("recover")
    assert res["journals"][0]["action"] == f"rolled back to backup {named}"
    assert series.digest() == before and res["check"]["clean"] and res["check"]["top"] == "0070"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_rollback_cut_short_by_a_signal_is_finished_by_the_next_command(series: Proj, sig: int) -> None:
    # the rollback's own journal replaces the damaged one: a signal between the damaged journal's removal and the
    # new plan's commit waits for that commit, so a journal always says what the tree must become; before, the
    # next command discarded the plan-less one as "never started" and the half-moved tree was left to guess at
    before = series.digest()
    tdir = _killed_apply(series, "replacing")  # the first file already moved
    _spoil(tdir, "staged-changed")
    r = signal_at(series.root, sig, ".opencoti/txn/new/0", ["recover"])  # staging the rollback's first file
    assert r.returncode == (130 if sig == signal.SIGINT else -sig), r.stderr
    res = series.json("recover")
    [j] = res["journals"]
    assert (j["damaged"], j["action"]) == ("", "finished (rolled forward)")
    assert series.digest() == before and res["check"]["clean"] and res["check"]["top"] is None
    series.run("apply")
    series.run("verify")


def test_discard_keeps_the_tree_and_says_what_differs(series: Proj) -> None:
    tdir = _killed_apply(series, "replacing")  # the first file already moved
    _spoil(tdir, "garbage")
    moved = series.digest()
    code, out, err = series.run("recover", "--discard", expect=1)
    assert "discarded" in err and "change(s) no patch explains" in err and "apply --force" in err
    assert not tdir.exists() and series.digest() == moved
    series.run("apply", "--force")
    series.run("verify")


def test_discard_of_a_journal_that_never_moved_a_file_leaves_a_clean_tree(series: Proj) -> None:
    before = series.digest()
    tdir = _killed_apply(series, "committed")
    _spoil(tdir, "path-outside")
    res = series.json("recover", "--discard")
    assert res["journals"][0]["action"] == "discarded" and res["check"]["clean"]
    assert series.digest() == before


def test_a_journal_that_is_a_symlink_out_is_discarded_without_following_it(series: Proj, tmp_path: Path) -> None:
    outside = tmp_path / "outside-txn"
    (outside / "new").mkdir(parents=True)
    (outside / "plan.json").write_text(json.dumps({"entries": [], "state": {}}))
    (series.root / ".opencoti" / "txn").symlink_to(outside)
    before = series.digest()
    res = series.json("recover", "--discard")
    assert res["journals"][0]["damaged"] and res["journals"][0]["action"] == "discarded"
    assert sorted(os.listdir(outside)) == ["new", "plan.json"] and series.digest() == before


def test_nothing_to_recover(series: Proj) -> None:
    code, out, err = series.run("recover")
    assert "nothing to recover" in err
    code, out, err = series.run("recover", "--discard", "--backup", "x", expect=2)
    assert "exclude each other" in err


def test_the_temporary_files_of_writes_cut_short_are_removed_and_named(series: Proj, cache: Path) -> None:
    """A kill between a write's temporary file and its rename leaves `.forktool-RANDOM.tmp` beside the target;
    recover removes those untouched for 10 min (in the project's records, patches, registry and pin, and the
    shared cache), never a fresh one (a write of another command may own it), a link, a directory, a file
    otherwise named, one in a backup or journal, or one in the vendored tree (which verify names)."""
    series.run("apply")
    before = series.digest()
    old = 1_000_000_000.0  # 2001
    root = series.root
    (cache / "objects" / "ab").mkdir(parents=True)
    stale = [root / ".opencoti" / ".forktool-0123456789ab.tmp", root / ".opencoti" / "sync" / ".forktool-a1.tmp",
             root / "patches" / ".forktool-b2.tmp", root / "vendor" / ".forktool-c3.tmp",
             cache / "objects" / "ab" / ".forktool-d4.tmp"]
    backup = next((root / ".opencoti" / "vendor-backups").iterdir())
    kept = [root / ".opencoti" / ".forktool-fresh.tmp", root / "patches" / ".forktool-notes.txt",
            backup / ".forktool-e5.tmp", series.tree / ".forktool-f6.tmp"]
    for p in stale + kept:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"half a record")
    link = root / "patches" / ".forktool-link.tmp"
    link.symlink_to(root / "patches" / "series")
    folder = root / "registry" / ".forktool-dir.tmp"
    folder.mkdir(parents=True)
    for p in [*stale, *kept[1:], link, folder]:
        os.utime(p, (old, old), follow_symlinks=False)
    res = series.json("recover")
    assert sorted(t["path"] for t in res["temps"]) == sorted(str(p) for p in stale)
    assert all(t["removed"] for t in res["temps"]) and res["journals"] == []
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
    assert link.is_symlink() and folder.is_dir()
    code, out, err = series.run("recover")
    assert "nothing to recover" in err
    kept[-1].unlink()
    assert series.digest() == before


def test_a_temporary_file_that_cannot_be_removed_is_named_and_the_exit_is_1(series: Proj,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from forktool.commands.recover_cmds import recover
    from forktool.project import Project
    series.run("apply")
    tmp = series.root / "patches" / ".forktool-0a.tmp"
    tmp.write_bytes(b"x")
    os.utime(tmp, (1e9, 1e9))

    def refuse(path: object) -> None:  # what a read-only directory answers (root is not refused by one)
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(os, "unlink", refuse)
    report = recover(Project(series.root), discard=False, backup=None)
    assert report.exit_code == 1 and tmp.exists()
    assert report.data["temps"] == [{"path": str(tmp), "removed": False, "why": "Permission denied"}]
    assert any(f"could not remove {tmp}: Permission denied" in line and "`rm` it" in line for line in report.lines)


def test_a_damaged_sync_journal_is_discarded_then_the_sync_aborted(tmp_path: Path, cache: Path) -> None:
    from forktool.tree import digest, scan
    from tests.helpers.cli import run_cli
    root = corpus.stopped_sync(tmp_path / "s")
    want = json.loads((root / ".opencoti" / "sync" / "state.json").read_text())["tree_digest_before"]
    tdir = root / ".opencoti" / "sync" / "txn"
    (tdir / "new").mkdir(parents=True)
    (tdir / "plan.json").write_text("{not json")
    code, out, err = run_cli(root, ["sync", "--abort"], expect=1)
    assert "forktool recover" in err
    code, out, err = run_cli(root, ["recover"], expect=1)
    assert "the sync journal is damaged" in err and "recover --discard" in err and "sync --abort" in err
    assert tdir.exists()
    res = json.loads(run_cli(root, ["recover", "--discard", "--json"])[1])
    assert res["journals"][0]["kind"] == "sync" and res["journals"][0]["action"] == "discarded"
    assert res["check"]["checked"] is False and "in progress" in res["check"]["why"]
    assert not tdir.exists()
    run_cli(root, ["sync", "--abort"])
    assert digest(scan(root / "vendor" / "llamafile")) == want
    run_cli(root, ["verify"])
