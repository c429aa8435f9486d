"""forktool recover: real journals left by a kill, spoiled, then rolled back from their backup or discarded."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests import corpus
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
