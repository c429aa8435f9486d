"""backup create / list / restore / prune: checksummed, cheap, byte-identical."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from forktool.tree import digest, scan
from tests.helpers.cli import run_cli, signal_at
from tests.helpers.project import Proj
from tests.helpers.series import three_patches


def test_backups_store_only_what_differs_from_pristine(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    b = proj.json("backup", "create", "before-experiment")
    assert b["name"].endswith("-before-experiment")
    assert b["stored"] == 3  # a.c, b.c, new.c: the rest is in the pristine cache
    assert b["files"] == len(list(p for p in proj.tree.rglob("*") if p.is_file()))


def test_restore_returns_tree_byte_identical(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    before = proj.state_digest()
    name = proj.json("backup", "create", "snap")["name"]
    proj.run("unapply")
    proj.edit("up/src/a.c", "int tail", "int changed")
    (proj.tree / "up/src/extra.c").write_text("stray\n")
    res = proj.json("backup", "restore", name)
    assert res["backup"]  # the tree being replaced was backed up first
    assert proj.state_digest() == before
    proj.run("verify")


def test_tampered_backup_is_refused_and_tree_untouched(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    name = proj.json("backup", "create", "snap")["name"]
    objs = [p for p in (proj.root / ".opencoti/vendor-backups" / name / "objects").rglob("*") if p.is_file()]
    data = bytearray(objs[0].read_bytes())
    data[0] ^= 1
    objs[0].write_bytes(bytes(data))
    proj.run("unapply")
    before = proj.state_digest()
    code, out, err = proj.run("backup", "restore", name, expect=1)
    assert "corrupt" in err or "sha256" in err
    assert proj.state_digest() == before


def test_tampered_manifest_is_refused(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    name = proj.json("backup", "create", "snap")["name"]
    mf = proj.root / ".opencoti/vendor-backups" / name / "manifest.json"
    m = json.loads(mf.read_text())
    first = sorted(m["files"])[0]
    m["files"][first][0] = "0" * 64
    mf.write_text(json.dumps(m))
    code, out, err = proj.run("backup", "restore", name, expect=1)
    assert "digest" in err


def test_list_and_prune_keep_newest(proj: Proj):
    three_patches(proj)
    names = [proj.json("backup", "create", f"b{i}")["name"] for i in range(4)]
    listed = [b["name"] for b in proj.json("backup", "list")["backups"]]
    assert listed == sorted(listed) and set(names) <= set(listed)
    res = proj.json("backup", "prune", "--keep", "2")
    left = [b["name"] for b in proj.json("backup", "list")["backups"]]
    assert left == listed[-2:] and sorted(res["removed"]) == sorted(listed[:-2])


def test_every_mutating_command_takes_a_named_backup(proj: Proj):
    three_patches(proj)
    proj.run("apply", "--upto", "0071")
    proj.run("apply")
    proj.run("unapply", "--to", "0070")
    names = [b["name"] for b in proj.json("backup", "list")["backups"]]
    assert [n[16:] for n in names] == ["apply-0071", "apply-0089", "unapply-to-0070"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_backup_killed_before_its_rename_leaves_nothing_behind(proj: Proj, sig: int):
    # SIGTERM and SIGHUP (and SIGKILL) run no clean-up: the next backup made there removes the work directory the
    # killed one left, once its process is gone; a live process's is left alone
    three_patches(proj)
    backups = proj.root / ".opencoti" / "vendor-backups"
    before = proj.state_digest()
    r = signal_at(proj.root, sig, "vendor-backups/.tmp-", ["apply"])
    assert r.returncode == -sig, r.stderr
    assert proj.state_digest() == before
    assert [p.name for p in backups.iterdir() if not p.name.startswith(".")] == []
    live = backups / f".tmp-{os.getpid()}-0123456789ab"
    live.mkdir()
    proj.run("apply")
    assert sorted(p.name for p in backups.iterdir()) == [live.name, *(b["name"] for b in
                                                                       proj.json("backup", "list")["backups"])]
    proj.run("verify")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_prune_cut_short_never_leaves_a_half_deleted_backup_listed(proj: Proj, sig: int):
    # before, a prune ended while it deleted a backup's objects left its manifest: `backup list` showed the backup
    # whole (its files and objects counted), and only `backup restore` found the objects missing
    three_patches(proj)
    proj.run("apply")
    proj.run("unapply")  # its backup stores the three patched files
    proj.run("apply")
    backups = proj.root / ".opencoti" / "vendor-backups"
    whole = {p.name: digest(scan(p)) for p in backups.iterdir()}
    r = signal_at(proj.root, sig, "vendor-backups/", ["backup", "prune", "--keep", "1"], event="os.rmdir")
    assert r.returncode == -sig, r.stderr
    listed = [b["name"] for b in proj.json("backup", "list")["backups"]]
    assert {n: digest(scan(backups / n)) for n in listed} == {n: whole[n] for n in listed}
    assert len(listed) < len(whole)  # it was cut short while deleting, so one backup is gone
    proj.run("backup", "create", "after")  # and the work directory the prune left goes with the next backup
    assert [p.name for p in backups.iterdir() if p.name.startswith(".")] == []


def test_unknown_backup_name(proj: Proj):
    code, out, err = proj.run("backup", "restore", "nope", expect=1)
    assert "backup list" in err


# ---------------------------------------------------------------- backups a sync needs


@pytest.fixture
def stopped(tmp_path: Path, cache: Path) -> Path:
    """A project whose sync to a newer upstream stopped at a conflict."""
    from tests import corpus
    return corpus.stopped_sync(tmp_path / "s")


def _sync_backups(root: Path) -> tuple[str, str]:
    st = json.loads((root / ".opencoti" / "sync" / "state.json").read_text())
    return st["backups"]["tree"], st["backups"]["project"]


def _before_start(root: Path) -> str:
    """The tree digest the sync recorded at its start: what --abort must give back."""
    return json.loads((root / ".opencoti" / "sync" / "state.json").read_text())["tree_digest_before"]


def test_prune_keeps_what_a_stopped_sync_needs(stopped: Path) -> None:
    tree_b, proj_b = _sync_backups(stopped)
    want = _before_start(stopped)
    code, out, err = run_cli(stopped, ["backup", "prune", "--keep", "0", "--json"])
    res = json.loads(out)
    assert f"sync/{proj_b}" in res["kept_for_sync"] and tree_b in res["kept_for_sync"]
    assert tree_b not in res["removed"] and f"sync/{proj_b}" not in res["removed"]
    assert (stopped / ".opencoti" / "vendor-backups" / tree_b).is_dir()
    assert (stopped / ".opencoti" / "sync-backups" / proj_b).is_dir()
    run_cli(stopped, ["sync", "--abort"])
    assert digest(scan(stopped / "vendor" / "llamafile")) == want
    # the sync is over: nothing needs them now
    res = json.loads(run_cli(stopped, ["backup", "prune", "--keep", "0", "--json"])[1])
    assert tree_b in res["removed"] and f"sync/{proj_b}" in res["removed"] and res["kept_for_sync"] == []


def test_prune_refuses_when_the_sync_state_cannot_be_read(stopped: Path) -> None:
    st = stopped / ".opencoti" / "sync" / "state.json"
    st.write_text("{not json")
    listing = sorted(p.name for p in (stopped / ".opencoti").glob("*backups/*"))
    code, out, err = run_cli(stopped, ["backup", "prune", "--keep", "0"], expect=1)
    assert "cannot tell which backups" in err and "nothing was removed" in err
    assert sorted(p.name for p in (stopped / ".opencoti").glob("*backups/*")) == listing


def test_sync_backups_as_a_symlink_out_of_the_project_are_not_restored_from(stopped: Path, tmp_path: Path) -> None:
    sb = stopped / ".opencoti" / "sync-backups"
    outside = tmp_path / "elsewhere"
    shutil.move(sb, outside)
    sb.symlink_to(outside)
    before = digest(scan(stopped / "vendor" / "llamafile"))
    lock = (stopped / "vendor" / "vendor.lock").read_bytes()
    for argv in (["sync", "--abort"], ["backup", "list"], ["backup", "prune", "--keep", "0"]):
        code, out, err = run_cli(stopped, argv, expect=None)
        assert code == 1 and "sync-backups is a symlink" in err and "Traceback" not in err, (argv, code, err)
    assert digest(scan(stopped / "vendor" / "llamafile")) == before
    assert (stopped / "vendor" / "vendor.lock").read_bytes() == lock
    assert sorted(os.listdir(outside))  # nothing under the link's target was removed


def test_backup_list_shows_sync_backups(stopped: Path) -> None:
    tree_b, proj_b = _sync_backups(stopped)
    res = json.loads(run_cli(stopped, ["backup", "list", "--json"])[1])
    assert [b["name"] for b in res["sync_backups"]] == [proj_b]
    assert tree_b in [b["name"] for b in res["backups"]]
    assert f"sync/{proj_b}" in run_cli(stopped, ["backup", "list"])[2]


def test_a_finished_sync_is_undone_by_restoring_its_backup(proj: Proj) -> None:
    from tests.helpers import sync as loop
    loop.loop_series(proj)
    before = loop.everything(proj)
    commit = loop.new_upstream(proj)
    proj.run("sync", "--to", commit, "--start", expect=1)
    tree_b, proj_b = _sync_backups(proj.root)
    loop.resolve(proj)
    proj.run("sync", "--continue")
    assert loop.everything(proj) != before
    # finished, it can still be undone: prune keeps its backups
    res = proj.json("backup", "prune", "--keep", "0")
    assert sorted(res["kept_for_sync"]) == sorted([tree_b, f"sync/{proj_b}"])
    res = proj.json("backup", "restore", f"sync/{proj_b}")
    assert res["restored"] == f"sync/{proj_b}" and res["backup"] and res["sync_backup"]
    assert loop.everything(proj) == before
    proj.run("verify")
    # the moved project was kept too: restoring that backup pair goes forward again
    res = proj.json("backup", "restore", f"sync/{res['sync_backup']}")
    assert commit in (proj.root / "vendor" / "vendor.yaml").read_text()
    proj.run("verify")


def test_a_sync_backup_is_not_restored_while_the_sync_is_stopped(stopped: Path) -> None:
    _, proj_b = _sync_backups(stopped)
    before = digest(scan(stopped / "vendor" / "llamafile"))
    lock = (stopped / "vendor" / "vendor.lock").read_bytes()
    code, out, err = run_cli(stopped, ["backup", "restore", f"sync/{proj_b}"], expect=1)
    assert "in progress" in err and "--abort" in err
    assert digest(scan(stopped / "vendor" / "llamafile")) == before
    assert (stopped / "vendor" / "vendor.lock").read_bytes() == lock


def test_a_backup_name_is_made_from_the_slug_as_its_help_says(proj: Proj):
    from forktool import cli_spec
    [create] = [c for c in cli_spec.COMMANDS if c.words == ("backup", "create")]
    assert "each run of characters other than a-z and 0-9 made one '-'" in create.params[0].help
    name = proj.json("backup", "create", "../Before the_Edit!.v2")["name"]
    assert name.endswith("-before-the-edit-v2") and "/" not in name
    proj.run("backup", "restore", name)


def test_a_backup_of_an_absent_tree_is_refused(proj: Proj):
    shutil.rmtree(proj.tree)
    code, out, err = proj.run("backup", "create", "x", expect=1)
    # it made a backup of 0 files, which would restore as an empty tree
    assert "the vendored tree is absent, so there is nothing to back up" in err
    assert not (proj.root / ".opencoti" / "vendor-backups").exists() or not any(
        (proj.root / ".opencoti" / "vendor-backups").iterdir())
