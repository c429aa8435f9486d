"""The sync loop on a small synthetic upstream: stop at a conflict, continue, skip, abort, crash at every step."""

from __future__ import annotations

import json

import pytest

from forktool import backup as bk
from tests.helpers.project import UPSTREAM, Proj, git
from tests.helpers.sync import (
    A_PATCHED,
    NEW,
    everything,
    loop_series,
    new_upstream,
    pushed_copy,
    resolve,
    sync_patch,
)


@pytest.fixture
def moved(proj: Proj) -> tuple[Proj, str, dict[str, str]]:
    loop_series(proj)
    before = everything(proj)
    return proj, new_upstream(proj), before


def test_stop_then_continue_finishes(moved):
    proj, commit, _ = moved
    code, out, err = proj.run("sync", "--to", commit, "--start", "--json", expect=1)
    data = json.loads(out)
    assert data["stage"] == "stopped" and data["stop"]["id"] == "0002"
    assert [(d["id"], d["status"]) for d in data["done"]] == [("0001", "offset")]
    [f] = data["stop"]["files"]
    assert f["file"] == "up/src/a.c" and f["status"] == "conflict" and f["blocks"] == [3]
    text = (proj.tree / "up/src/a.c").read_text()
    # diff3 blocks naming both sides and the base
    for label in ("<<<<<<< patch (on the pinned upstream)", "||||||| pinned upstream", "=======",
                  ">>>>>>> new upstream"):
        assert label in text
    assert "return 10;" in text and "return 2; /* upstream */" in text
    assert (proj.tree / "up/src/b.c").read_text().startswith("new 0\n")  # the new upstream is the tree
    # the human view names the file, the hunk and what to run next
    _, _, err = proj.run("sync", "--to", commit, "--start", expect=1) if False else proj.run("status")
    assert "stopped" in err and "up/src/a.c" in err and "--continue" in err
    # the tree belongs to the sync: moving it otherwise is refused
    _, _, err = proj.run("apply", expect=1)
    assert "sync" in err and "in progress" in err
    # continue refuses while conflict blocks remain, naming file and line
    _, _, err = proj.run("sync", "--continue", expect=1)
    assert "vendor/llamafile/up/src/a.c:3" in err and "conflict-block" in err
    resolve(proj)
    code, out, err = proj.run("sync", "--continue", "--json", expect=0)
    data = json.loads(out)
    assert [(d["id"], d["status"]) for d in data["done"]] == [
        ("0001", "offset"), ("0002", "resolved"), ("0003", "clean"), ("0004", "clean")]
    assert data["verify"]["ok"] is True
    assert commit in (proj.root / "vendor" / "vendor.yaml").read_text()
    patch = (proj.root / "patches" / "0002-a.patch").read_text()
    assert "Subject: [PATCH] a: return ten" in patch and "+    return 20; // opencoti-hook: a-ten" in patch
    assert "-    return 2; /* upstream */" in patch
    # the moved project is an ordinary one again: status, verify, and a trial to the same upstream is all clean
    proj.run("verify")
    _, _, err = proj.run("status")
    assert "4/4 applied" in err
    rep = proj.json("sync", "--to", commit, "--out", str(proj.root / "dist" / "again"))
    assert {p["status"] for p in rep["patches"]} == {"clean"}


def test_skip_drops_the_patch(moved):
    proj, commit, _ = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    code, out, err = proj.run("sync", "--skip", "--json", expect=0)
    data = json.loads(out)
    assert [(d["id"], d["status"]) for d in data["done"]] == [
        ("0001", "offset"), ("0002", "skipped"), ("0003", "clean"), ("0004", "clean")]
    series_text = (proj.root / "patches" / "series").read_text()
    assert "# 0002-a.patch  # skipped in the sync to" in series_text
    assert (proj.root / "patches" / "0002-a.patch").is_file()  # the file is kept
    a = (proj.tree / "up/src/a.c").read_text()
    assert "return 2; /* upstream */" in a and "return 3; }" in a and "<<<<<<<" not in a
    proj.run("verify")


def test_skip_refuses_to_throw_away_edits_outside_the_stopped_patch(moved):
    """--skip puts the stopped patch's files back; an edit or a new file elsewhere in the tree would go with them."""
    proj, commit, before = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    proj.edit("up/src/b.c", "line 3\n", "line three\n")
    (proj.tree / "up/src/mine.c").write_text("mine\n")
    stopped = everything(proj)
    _, out, err = proj.run("sync", "--skip", "--json", expect=1)
    data = json.loads(out)
    assert data["error"] == "2 file(s) outside 0002 changed since the stop; --skip would throw them away"
    assert data["details"] == ["vendor/llamafile/up/src/b.c", "vendor/llamafile/up/src/mine.c"]
    assert "--continue" in data["hint"] and "--abort" in data["hint"]
    assert everything(proj) == stopped  # nothing touched
    proj.edit("up/src/b.c", "line three\n", "line 3\n")
    (proj.tree / "up/src/mine.c").unlink()
    proj.edit("up/src/a.c", "<<<<<<<", "<<<<<<< (half edited)")  # the stopped patch's own file: skip drops it
    proj.run("sync", "--skip")
    assert "line 3\n" in (proj.tree / "up/src/b.c").read_text() and "<<<<<<<" not in (proj.tree / "up/src/a.c").read_text()
    proj.run("verify")


def test_continue_refuses_a_stopped_file_deleted_from_the_tree(moved):
    """A file of the stopped patch removed by hand is not taken for the patch deleting it."""
    proj, commit, before = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    (proj.tree / "up/src/a.c").unlink()
    stopped = everything(proj)
    _, out, _ = proj.run("sync", "--continue", "--json", expect=1)
    data = json.loads(out)
    assert data["error"] == "up/src/a.c, a file 0002 changes, is gone from the tree; taken so, 0002 would delete it"
    assert data["where"] == "vendor/llamafile/up/src/a.c" and "--skip" in data["hint"] and "--abort" in data["hint"]
    assert everything(proj) == stopped  # nothing touched: patches, series, state and tree as the stop left them
    proj.run("sync", "--abort")
    assert everything(proj) == before
    proj.run("sync", "--to", commit, "--start", expect=1)  # the same stop, the file as the stop writes it
    assert "<<<<<<< " in (proj.tree / "up/src/a.c").read_text()


def test_continue_refuses_a_symlink_naming_where_and_what_to_do(moved):
    import os

    proj, commit, _ = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    os.symlink("b.c", proj.tree / "up/src/link.c")
    stopped = everything(proj)
    _, out, _ = proj.run("sync", "--continue", "--json", expect=1)
    data = json.loads(out)
    assert data["error"] == "up/src/link.c is a symlink; patches carry regular files only"
    assert data["where"] == "vendor/llamafile/up/src/link.c" and "regular file" in data["hint"]
    assert everything(proj) == stopped
    (proj.tree / "up/src/link.c").unlink()
    proj.run("sync", "--continue")


def test_a_marker_like_line_upstream_has_does_not_block_continue(moved):
    """A lone `=======` line (a comment rule, a heading underline) that the new upstream itself holds is its text,
    not a conflict marker left behind; one a block leaves is still refused."""
    proj, _, _ = moved
    a = proj.upstream / "src" / "a.c"
    a.write_text(a.read_text().replace("// filler 20\n", "// filler 20\n/*\n=======\n*/\n"))
    git(proj.upstream, "commit", "-qam", "a rule in a comment")
    commit = git(proj.upstream, "rev-parse", "HEAD")
    proj.run("sync", "--to", commit, "--start", expect=1)
    text = (proj.tree / "up/src/a.c").read_text()
    # a half-made resolution: the block's other markers gone, its `=======` left
    half = "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith(("<<<<<<< ", "||||||| ", ">>>>>>> ")))
    (proj.tree / "up/src/a.c").write_text(half)
    _, _, err = proj.run("sync", "--continue", expect=1)
    assert "conflict-block line(s) remain" in err and "up/src/a.c:" in err
    (proj.tree / "up/src/a.c").write_text(text)
    resolve(proj)
    assert "\n=======\n" in (proj.tree / "up/src/a.c").read_text()
    proj.run("sync", "--continue")
    proj.run("verify")


def test_continue_with_the_stopped_patch_file_removed_is_refused_not_a_crash(moved):
    proj, commit, _ = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    patch = proj.root / "patches" / "0002-a.patch"
    kept = patch.read_bytes()
    patch.unlink()
    stopped = everything(proj)
    code, out, _ = proj.run("sync", "--continue", "--json", expect=None)
    assert code == 1, out  # was an internal error (exit 3, FileNotFoundError)
    data = json.loads(out)
    assert data["error"] == "patches/0002-a.patch is gone, and the sync in progress carries it"
    assert data["where"] == "patches/0002-a.patch" and "--skip" in data["hint"] and "--abort" in data["hint"]
    assert everything(proj) == stopped
    patch.write_bytes(kept)
    proj.run("sync", "--continue")


def test_a_continue_that_fails_past_its_checks_says_where_the_sync_stands(moved):
    """A series line added during the stop fails the finish's verify: the error says the sync is in progress at
    its stage and that `--continue` goes on from there; it does, once the line is gone."""
    proj, commit, _ = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    series = proj.root / "patches" / "series"
    text = series.read_text()
    series.write_text(text + "0005-x.patch\n")
    _, out, err = proj.run("sync", "--continue", "--json", expect=1)
    data = json.loads(out)
    assert "0005-x.patch not found" in data["error"] and "is in progress, at stage finished" in data["error"]
    assert data["sync"]["stage"] == "finished" and "`forktool sync --continue` goes on" in data["hint"]
    assert data["details"] == ["about the failure: add the file or remove the line from patches/series"]
    series.write_text(text)
    proj.run("sync", "--continue")
    proj.run("verify")


def test_a_backup_removed_by_hand_is_not_taken_for_a_stop_recorded_elsewhere(moved, tmp_path):
    """One of the start's two backups gone from the checkout that made them: said so (the other is here), not
    'recorded elsewhere' with a `--start` that cannot reach the stop; put back, --abort restores everything."""
    import shutil

    proj, commit, before = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    [tree_backup] = (proj.root / ".opencoti" / "vendor-backups").glob("*-sync-start-*")
    shutil.move(tree_backup, tmp_path / "aside")
    stopped = everything(proj)
    for action in ("--abort", "--continue", "--skip"):
        _, out, _ = proj.run("sync", action, "--json", expect=1)
        data = json.loads(out)
        assert data["error"].startswith("a backup of the sync to ") and "is gone from this checkout" in data["error"]
        assert data["details"] == [f".opencoti/vendor-backups/{tree_backup.name}"]
        assert f"`forktool sync {action}` needs the start's backups" in data["hint"]
    _, _, err = proj.run("status")
    assert "a backup of this sync is gone" in err and "recorded elsewhere" not in err
    assert everything(proj) == stopped
    shutil.move(tmp_path / "aside", tree_backup)
    proj.run("sync", "--abort")
    assert everything(proj) == before


def test_a_resolution_that_leaves_the_patch_empty_is_refused(moved):
    """Every block resolved to the new upstream's side: the patch would be carried as an empty one, `resolved`."""
    proj, commit, _ = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    text = (proj.tree / "up/src/a.c").read_text()
    start, end = text.index("<<<<<<< "), text.index(">>>>>>> ")
    (proj.tree / "up/src/a.c").write_text(text[:start] + "    return 2; /* upstream */\n"
                                          + text[text.index("\n", end) + 1:])
    stopped = everything(proj)
    _, out, _ = proj.run("sync", "--continue", "--json", expect=1)
    data = json.loads(out)
    assert data["error"].startswith("resolved as the tree stands, 0002 changes nothing")
    assert data["where"] == "patches/0002-a.patch" and "--skip" in data["hint"]
    assert everything(proj) == stopped
    _, out, _ = proj.run("sync", "--skip", "--json")
    assert [d["status"] for d in json.loads(out)["done"]] == ["offset", "skipped", "clean", "clean"]


def test_continue_says_which_files_outside_the_patch_it_took_in(moved):
    proj, commit, _ = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    proj.edit("up/src/b.c", "line 3\n", "line three\n")
    _, out, _ = proj.run("sync", "--continue", "--json")
    assert json.loads(out)["joined"] == {"id": "0002", "files": ["up/src/b.c"]}
    assert "up/src/b.c" in (proj.root / "patches" / "0002-a.patch").read_text()
    proj.run("sync", "--undo")
    proj.run("sync", "--to", commit, "--start", expect=1)  # the same stop: block and b.c put back from memory
    assert "line three" in (proj.tree / "up/src/b.c").read_text()
    _, _, err = proj.run("sync", "--continue")
    assert "0002 took in 1 file(s) outside it that changed during the stop (as `refresh` would): up/src/b.c" in err


def test_a_stop_at_a_file_gone_upstream_says_so_and_not_to_edit_blocks(moved):
    proj, _, before = moved
    git(proj.upstream, "rm", "-q", "src/a.c")
    git(proj.upstream, "commit", "-qm", "a.c gone")
    commit = git(proj.upstream, "rev-parse", "HEAD")
    _, _, err = proj.run("sync", "--to", commit, "--start", expect=1)
    assert "vendor/llamafile/up/src/a.c: conflict, hunks #1 changed; the new upstream has no such file" in err
    assert "no conflict block to edit" in err and "each `<<<<<<< patch`" not in err
    _, _, err = proj.run("status")
    assert "the new upstream has no such file" in err and "no conflict block to edit" in err
    proj.run("sync", "--abort")
    assert everything(proj) == before


def test_accept_is_refused_while_a_sync_is_stopped(moved, tmp_path):
    """The trial reads patches/ as the stopped loop left them; --accept would rewrite them (and the pin) under it."""
    proj, commit, before = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    stopped = everything(proj)
    pinned = git(proj.upstream, "rev-parse", "HEAD~1")  # every patch applies there: a trial --accept would take
    _, out, _ = proj.run("sync", "--to", pinned, "--accept", "--out", str(tmp_path / "o"), "--json", expect=1)
    data = json.loads(out)
    assert data["error"].startswith("--accept refused: a sync to ") and "is in progress (stopped)" in data["error"]
    assert "--abort" in data["hint"] and "nothing was changed" in data["hint"]
    assert everything(proj) == stopped
    proj.run("sync", "--abort")
    assert everything(proj) == before


def test_abort_restores_everything_byte_identical(moved):
    proj, commit, before = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)  # a half-done resolution is thrown away too
    assert everything(proj) != before
    code, out, err = proj.run("sync", "--abort", "--json", expect=0)
    data = json.loads(out)
    assert data["tree_digest"] == data["tree_digest_before"] == before["tree"]
    assert everything(proj) == before
    assert not (proj.root / ".opencoti" / "sync" / "state.json").exists()
    proj.run("verify")
    _, _, err = proj.run("sync", "--abort", expect=1)
    assert "no sync in progress" in err


def test_a_spoiled_state_is_refused_and_the_way_it_names_works(moved):
    proj, commit, before = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    path = proj.root / ".opencoti" / "sync" / "state.json"
    st = json.loads(path.read_text())
    stopped = everything(proj)
    path.write_text(json.dumps(dict(st, backups=dict(st["backups"], tree="../../../elsewhere"))))
    for argv in (["sync", "--abort"], ["sync", "--continue"], ["apply"]):
        code, out, err = proj.run(*argv, expect=1)
        assert "sync/state.json: backups.tree" in err and "Traceback" not in err, err
        assert f"mv {path} {path}.bad" in err, err
    assert everything(proj) == stopped
    # following the hint: the file set aside, the start's backups put the tree, pin, lock and patches back
    path.rename(path.with_name("state.json.bad"))
    manifest, content, _ = bk.load_for_restore(proj.root / ".opencoti" / "sync-backups" / st["backups"]["project"],
                                               lambda _sha: None)
    for rel in manifest:
        if rel != ".opencoti/state.json":
            (proj.root / rel).write_bytes(content[rel])
    proj.run("backup", "restore", st["backups"]["tree"])
    assert everything(proj) == before
    proj.run("verify")


def test_abort_after_a_continue(moved):
    proj, commit, before = moved
    new = dict(NEW)
    new["src/a.c"] = NEW["src/a.c"].replace("int tail(void) { return 0; }", "int tail(void) { return 9; }")
    (proj.upstream / "src/a.c").write_text(new["src/a.c"])
    git(proj.upstream, "commit", "-qam", "tail changed too")
    commit = git(proj.upstream, "rev-parse", "HEAD")
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    data = json.loads(proj.run("sync", "--continue", "--json", expect=1)[1])
    assert data["stop"]["id"] == "0003"  # the second conflict stops again
    proj.run("sync", "--abort")
    assert everything(proj) == before


def test_usage_errors(moved):
    proj, commit, before = moved
    proj.run("sync", "--continue", expect=1)
    proj.run("sync", "--start", expect=2)
    proj.run("sync", "--start", "--abort", expect=2)
    proj.run("sync", "--to", commit, "--continue", expect=2)
    proj.run("sync", "--to", commit, "--start", "--accept", expect=2)
    proj.run("sync", "--to", commit, "--start", expect=1)
    _, _, err = proj.run("sync", "--to", commit, "--start", expect=1)
    assert "already in progress" in err
    proj.run("sync", "--abort")
    assert everything(proj) == before


def test_dirty_tree_is_refused(moved):
    proj, commit, before = moved
    proj.edit("up/src/b.c", "line 20\n", "line 20 local\n")
    dirty = everything(proj)
    _, _, err = proj.run("sync", "--to", commit, "--start", expect=1)
    assert "no patch explains" in err
    assert everything(proj) == dirty and not (proj.root / ".opencoti" / "sync" / "state.json").exists()


START_POINTS = ["sync-started", "sync-backed-up", "staging", "committed", "replacing", "state-written",
                "sync-before-stop-compile"]


@pytest.mark.parametrize("then", ["--abort", "--continue"])
@pytest.mark.parametrize("point", START_POINTS)
def test_kill_inside_start(moved, point, then):
    proj, commit, before = moved
    r = proj.sub("sync", "--to", commit, "--start", env={"FORKTOOL_FAULT": point})
    assert r.returncode == 137, r.stderr
    st = proj.sub("status")
    assert st.returncode == 0 and "sync" in st.stderr, st.stderr
    r = proj.sub("sync", then)
    if then == "--abort":
        assert r.returncode == 0, r.stderr
        assert everything(proj) == before
    else:
        # the same stop as an unbroken start: reached now, or already reached and its blocks still there
        assert r.returncode == 1, r.stderr
        assert "stopped" in r.stderr or "vendor/llamafile/up/src/a.c:3" in r.stderr, r.stderr
        assert "<<<<<<< " in (proj.tree / "up/src/a.c").read_text()
        assert "stopped" in proj.sub("status").stderr
        resolve(proj)
        assert proj.sub("sync", "--continue").returncode == 0
        assert proj.sub("verify").returncode == 0


@pytest.mark.parametrize("then", ["--abort", "--continue"])
def test_a_start_that_fails_says_the_sync_is_in_progress(moved, tmp_path, monkeypatch, then):
    """An error after the start recorded the sync (here `git merge-file` killed at 0002) leaves the sync in
    progress: the error says so, at which stage, and what to run; the text and --json agree with `status`."""
    import os
    import shutil

    proj, commit, before = moved
    real = shutil.which("git")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "git").write_text(f'#!/bin/sh\ncase "$*" in *merge-file*) kill -SEGV $$ ;; esac\n'
                                          f'exec {real} "$@"\n')
    (tmp_path / "bin" / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    _, out, err = proj.run("sync", "--to", commit, "--start", "--json", expect=1)
    data = json.loads(out)
    assert data["error"].startswith("git merge-file was killed by SIGSEGV; ")
    to = f"{proj.upstream}@{commit}"
    assert f"the sync to {to} is in progress, at stage starting" in data["error"]
    assert data["sync"] == {"in_progress": True, "to": to, "stage": "starting", "position": 0,
                            "next": ["forktool sync --continue", "forktool sync --abort"]}
    assert "`forktool sync --continue` goes on" in data["hint"] and "`forktool sync --abort` puts" in data["hint"]
    assert "run the command again" in data["details"][0]  # the failure's own hint is kept
    assert "in progress, at stage starting" in err and "--continue" in err and "--abort" in err
    _, _, err = proj.run("status")
    assert ": starting" in err and "`forktool sync --continue`" in err and "--abort" in err
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
    if then == "--abort":
        proj.run("sync", "--abort")
        assert everything(proj) == before
    else:
        _, _, err = proj.run("sync", "--continue", expect=1)
        assert "stopped" in err and "up/src/a.c" in err


@pytest.mark.parametrize("then", ["--abort", "--continue"])
@pytest.mark.parametrize("point", ["staging", "committed", "replacing", "state-written"])
def test_kill_inside_continue(moved, point, then):
    proj, commit, before = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    r = proj.sub("sync", "--continue", env={"FORKTOOL_FAULT": point})
    assert r.returncode == 137, r.stderr
    r = proj.sub("sync", then)
    assert r.returncode == 0, r.stderr
    if then == "--abort":
        assert everything(proj) == before
    else:
        assert commit in (proj.root / "vendor" / "vendor.yaml").read_text()
        assert proj.sub("verify").returncode == 0


def test_a_recorded_stop_is_reached_again_on_a_fresh_checkout(moved, tmp_path):
    """What the CI job pushes (pin, patches carried so far, the state file) gives the same stop elsewhere."""
    proj, commit, _ = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    stopped = (proj.tree / "up/src/a.c").read_bytes()
    other = pushed_copy(proj, tmp_path / "clone")
    _, _, err = other.run("status")
    assert "forktool sync --start" in err  # recorded elsewhere: says how to reach it
    other.run("sync", "--continue", expect=1)
    code, out, _ = other.run("sync", "--start", "--json", expect=1)
    data = json.loads(out)
    assert data["stop"]["id"] == "0002" and (other.tree / "up/src/a.c").read_bytes() == stopped
    resolve(other)
    other.run("sync", "--continue")
    other.run("verify")


def test_a_recorded_stop_is_reached_again_with_the_same_to_and_its_options(moved, tmp_path):
    """`--to X --upstream-commit C` names the stop recorded by the same command elsewhere (the state records the
    target without its #options); another target, or another option value, is still refused."""
    proj, commit, _ = moved
    upstream = "c" * 40
    proj.run("sync", "--to", commit, "--upstream-commit", upstream, "--start", expect=1)
    clone = tmp_path / "clone"
    other = pushed_copy(proj, clone)
    state = (clone / ".opencoti/sync/state.json").read_bytes()
    _, _, err = other.run("sync", "--to", commit, "--upstream-commit", "d" * 40, "--start", expect=2)
    assert "records a stopped sync to" in err
    _, _, err = other.run("sync", "--to", "e" * 40, "--start", expect=2)
    assert "records a stopped sync to" in err
    assert (clone / ".opencoti/sync/state.json").read_bytes() == state  # refused: nothing moved
    _, out, _ = other.run("sync", "--to", commit, "--upstream-commit", upstream, "--start", "--json", expect=1)
    data = json.loads(out)
    assert data["stop"]["id"] == "0002"
    assert data["stop"]["files"][0]["blocks"] == [3]
    resolve(other)
    other.run("sync", "--continue")
    assert upstream in (clone / "vendor" / "vendor.yaml").read_text()


def test_registry_sites_are_rewritten_in_place(tmp_path):
    """The finish rewrites only the sites: lists, so the registry keeps its comments and layout."""
    import dataclasses

    from forktool import registry as rg
    from forktool.regfile import update_text
    text = ("# the registry\nschema: 1\npatches:\n- id: '0001'\n  file: 0001-a.patch\n  title: a\n  bug: ''\n"
            "  status: shipped\n  build_impact:\n  - host\n  files:\n  - up/src/a.c\n  hooks:\n  - a\n"
            "hooks:\n  # the only hook\n  a:\n    patch: '0001'\n    sites:\n    - file: up/src/a.c\n"
            "      symbol: a\n      line: 1\n")
    path = tmp_path / "UPSTREAM_SYNC.yaml"
    path.write_text(text)
    reg = rg.load(path)
    moved = dataclasses.replace(reg.hooks["a"], sites=(rg.Site("up/src/a.c", "a", 7), rg.Site("up/src/b.c", "b", 2)))
    reg.hooks["a"] = moved
    out = update_text(text, reg)
    assert out.startswith("# the registry\n") and "  # the only hook\n" in out and "  bug: ''\n" in out
    assert "      line: 7\n    - file: up/src/b.c\n      symbol: b\n      line: 2" in out
    path.write_text(out)
    assert rg.dump(rg.load(path)) == rg.dump(reg)


def test_a_finish_that_carried_no_patch_says_nothing_was_compiled(proj: Proj):
    # every patch skipped: the compile gate has nothing to compile, and the finish says so for each profile instead
    # of printing no compile line above its verify OK
    p = sync_patch("0002-a.patch", "a: return ten", [("up/src/a.c", UPSTREAM["src/a.c"].encode(),
                                                        A_PATCHED.encode())])
    proj.write_patch(p.name, p.raw.decode())
    proj.run("apply")
    commit = new_upstream(proj)
    proj.run("sync", "--to", commit, "--start", expect=1)
    code, out, err = proj.run("sync", "--skip", "--json", expect=0)
    data = json.loads(out)
    assert [(d["id"], d["status"]) for d in data["done"]] == [("0002", "skipped")]
    assert [(c["profile"], c["status"]) for c in data["compile"]] == [("cpu", "not compiled"), ("cuda", "not compiled")]
    assert all("no patch was carried" in c["reason"] for c in data["compile"])


def test_a_full_disk_at_the_finish_report_does_not_hide_a_finished_move(moved, monkeypatch):
    # the finish is committed and verified (undo.json written, state.json gone) before report.md is written: a full
    # disk there said "free some space and run the command again", and that `--continue` found no sync at all
    import errno

    from forktool.sync import loop

    proj, commit, before = moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", str(proj.root / ".opencoti" / "sync" / "report.md"))

    written = loop.write_report
    monkeypatch.setattr(loop, "write_report", full)
    code, out, err = proj.run("sync", "--continue", expect=0)
    assert "verify: OK" in err and "details not written to .opencoti/sync/report.md (no space left on the device)" in err
    assert "`forktool sync --undo`" in err and "run the command again" not in err
    assert not (proj.root / ".opencoti" / "sync" / "state.json").exists()
    monkeypatch.setattr(loop, "write_report", written)  # the disk has room again
    proj.run("verify")
    proj.run("sync", "--undo")
    assert everything(proj) == before


def test_a_title_is_shown_as_written_in_the_trial_and_at_the_stop(proj: Proj):
    p = sync_patch("0002-a.patch", "a: [red]return[/red] ten", [("up/src/a.c", UPSTREAM["src/a.c"].encode(),
                                                                  A_PATCHED.encode())])
    proj.write_patch(p.name, p.raw.decode())
    proj.run("apply")
    commit = new_upstream(proj)
    code, out, err = proj.run("sync", "--to", commit, expect=1)
    # the title was read as markup: "conflict 0002 a: return ten"
    assert "0002 a: [red]return[/red] ten up/src/a.c: conflict" in err, err
    code, out, err = proj.run("sync", "--to", commit, "--start", expect=1)
    assert "conflict 0002 a: [red]return[/red] ten" in err, err
    proj.run("sync", "--abort")


@pytest.mark.parametrize("failure", ["disk full", "Ctrl-C"])
def test_a_failure_forktool_does_not_handle_still_says_the_sync_is_in_progress(moved, monkeypatch, failure):
    # a full disk or a Ctrl-C once --start has recorded the sync: the CLI names the failure, and the note under it
    # says the sync is in progress and what to run (before, only forktool's own errors said so)
    import errno

    from forktool.sync import loop

    proj, commit, before = moved
    fault = loop.txn.fault

    def failing(point: str) -> None:
        if point == "sync-started":
            if failure == "Ctrl-C":
                raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, "No space left on device")
        fault(point)

    monkeypatch.setattr(loop.txn, "fault", failing)
    to = f"{proj.upstream}@{commit}"
    code, out, err = proj.run("sync", "--to", commit, "--start", "--json", expect=130 if failure == "Ctrl-C" else 1)
    assert f"the sync to {to} is in progress, at stage starting: once the cause is fixed" in err, err
    assert "`forktool sync --continue`" in err and "`forktool sync --abort` removes its record" in err
    if failure == "disk full":
        data = json.loads(out)
        assert data["kind"] == "NoSpace" and data["notes"] == [err.split("error: ")[-1].strip()], (data, err)
        assert err.index("no space left") < err.index("is in progress")  # the failure first, then what it left
    monkeypatch.setattr(loop.txn, "fault", fault)
    _, _, err = proj.run("status")
    assert ": starting" in err
    proj.run("sync", "--abort")
    assert everything(proj) == before
