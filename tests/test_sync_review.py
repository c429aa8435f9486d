"""The sync loop's review stops, undo, failed final verify, remembered resolutions and side labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from forktool.project import Project
from forktool.sync import loop
from tests.helpers.project import UPSTREAM, Proj, git
from tests.helpers.sync import NEW, everything, resolve
from tests.helpers.sync import loop_series as series


def with_registry(proj: Proj) -> None:
    def entry(pid: str, name: str, files: list[str], hooks: list[str]) -> dict:
        return {"id": pid, "file": name, "title": name, "bug": "", "status": "shipped", "build_impact": [],
                "files": files, "hooks": hooks}
    reg = {"schema": 1, "patches": [entry("0001", "0001-b.patch", ["up/src/b.c"], []),
                                    entry("0002", "0002-a.patch", ["up/src/a.c"], ["a-ten"]),
                                    entry("0003", "0003-tail.patch", ["up/src/a.c"], []),
                                    entry("0004", "0004-d.patch", ["up/include/d.h"], [])],
           # described by a person, so the registry keeps the hook even when a resolution drops its marker
           "hooks": {"a-ten": {"patch": "0002", "description": "a returns ten",
                               "sites": [{"file": "up/src/a.c", "symbol": "a", "line": 1}]}}}
    (proj.root / "registry" / "UPSTREAM_SYNC.yaml").write_text("# kept by hand\n" + yaml.safe_dump(reg, sort_keys=False))
    proj.run("registry", "render")
    proj.run("verify")


def snapshot(proj: Proj) -> dict[str, str]:
    """everything() and the registry: what an undo must put back byte for byte."""
    out = everything(proj)
    out["series"] = (proj.root / "patches" / "series").read_text()
    for rel in ("registry/UPSTREAM_SYNC.yaml", "registry/UPSTREAM_SYNC.md"):
        out[rel] = (proj.root / rel).read_text()
    return out


def upstream_commit(proj: Proj, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (proj.upstream / rel).write_text(text)
    git(proj.upstream, "commit", "-qam", message)
    return git(proj.upstream, "rev-parse", "HEAD")


@pytest.fixture
def reg_moved(proj: Proj) -> tuple[Proj, str, dict[str, str]]:
    series(proj)
    with_registry(proj)
    before = snapshot(proj)
    return proj, upstream_commit(proj, NEW, "newer upstream"), before


def test_a_failed_final_verify_exits_1_and_keeps_the_sync(reg_moved):
    proj, commit, before = reg_moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    text = (proj.tree / "up/src/a.c").read_text()
    start, end = text.index("<<<<<<< "), text.index("\n", text.index(">>>>>>> ")) + 1
    # resolved without the hook's marker: the registry no longer matches the tree
    (proj.tree / "up/src/a.c").write_text(text[:start] + "    return 20;\n" + text[end:])
    code, out, err = proj.run("sync", "--continue", "--json", expect=1)
    data = json.loads(out)
    assert data["verify"]["ok"] is False and data["stage"] == "finished"
    assert any("a-ten" in p["what"] + p["where"] for p in data["verify"]["problems"]), data["verify"]["problems"]
    _, _, err = proj.run("sync", "--continue", expect=1)  # verifies again, still failing, still in progress
    assert "verify failed" in err and "--abort" in err
    assert (proj.root / ".opencoti" / "sync" / "state.json").is_file()
    _, _, err = proj.run("status")
    assert "finished" in err
    proj.run("sync", "--undo", expect=1)  # not finished yet: only --abort goes back
    _, _, err = proj.run("sync", "--abort")
    assert "aborted" in err
    assert snapshot(proj) == before
    proj.run("verify")


def test_undo_puts_everything_back_to_the_byte(reg_moved):
    proj, commit, before = reg_moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    code, out, err = proj.run("sync", "--continue", expect=0)
    assert "verify: OK" in err and "sync --undo" in err and len(err.strip().splitlines()) <= 15, err
    report = (proj.root / ".opencoti" / "sync" / "report.md").read_text()
    assert "## Hook sites" in report and "a-ten" in report and "verify: OK" in report
    finished = snapshot(proj)
    assert finished != before and commit in finished["vendor/vendor.yaml"]
    assert finished["registry/UPSTREAM_SYNC.yaml"].startswith("# kept by hand\n")
    in_use = loop.backups_in_use(Project(proj.root))
    assert len(in_use["vendor-backups"]) == 1 and len(in_use["sync-backups"]) == 1
    # a change made after the finish would be lost: refused, nothing touched
    pin = proj.root / "vendor" / "vendor.yaml"
    pin.write_text(pin.read_text() + "# a later edit\n")
    edited = snapshot(proj)
    _, _, err = proj.run("sync", "--undo", expect=1)
    assert "changed since" in err and "vendor/vendor.yaml" in err
    assert snapshot(proj) == edited
    pin.write_text(finished["vendor/vendor.yaml"])
    code, out, err = proj.run("sync", "--undo", "--json")
    data = json.loads(out)
    assert data["stage"] == "undone" and data["tree_digest"] == before["tree"]
    assert snapshot(proj) == before
    proj.run("verify")
    # a second undo (say, after the first was killed before it could report) says the first one finished
    code, out, err = proj.run("sync", "--undo", "--json")
    again = json.loads(out)
    assert again["already"] is True and again["stage"] == "undone" and again["written"] == 0
    assert again["tree_digest"] == again["tree_digest_undone"] == before["tree"] and again["to"].endswith(commit)
    assert snapshot(proj) == before
    _, _, err = proj.run("sync", "--undo")
    assert "nothing left to undo: the sync" in err and "= as that undo left it" in err
    assert loop.backups_in_use(Project(proj.root)) == {"vendor-backups": [], "sync-backups": []}
    # the tree moved since that undo: still nothing to undo, and the command says the tree is not as it left it
    (proj.tree / "up/src/a.c").write_text((proj.tree / "up/src/a.c").read_text() + "// later\n")
    _, _, err = proj.run("sync", "--undo", expect=1)
    assert "nothing left to undo" in err and "the tree changed since" in err


def test_the_next_start_ends_the_undo(reg_moved):
    proj, commit, before = reg_moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    proj.run("sync", "--continue")
    back = git(proj.upstream, "rev-list", "--max-parents=0", "HEAD")
    proj.run("sync", "--to", back, "--start", expect=None)
    proj.run("sync", "--abort", expect=None)
    _, _, err = proj.run("sync", "--undo", expect=1)
    assert "no finished sync to undo" in err and "the last sync, to " in err and back in err
    assert "was aborted at" in err and "(before it finished)" in err
    # a damaged record of how it ended never blocks anything: the refusal says so and what to do
    (proj.root / ".opencoti" / "sync" / "ended.json").write_text("{")
    _, _, err = proj.run("sync", "--undo", expect=1)
    assert "no finished sync to undo" in err and "ended.json could not be read" in err and "delete" in err
    # the next start removes it
    proj.run("sync", "--to", back, "--start", expect=None)
    assert not (proj.root / ".opencoti" / "sync" / "ended.json").exists()
    proj.run("sync", "--abort", expect=None)


B_NEAR = UPSTREAM["src/b.c"].replace("line 12\n", "line 12 upstream\n")  # inside 0001's context: a clean 3-way merge


def test_a_merged_patch_stops_for_review(proj: Proj):
    series(proj)
    commit = upstream_commit(proj, {"src/b.c": B_NEAR}, "near b's patch")
    code, out, err = proj.run("sync", "--to", commit, "--start", "--json", expect=1)
    data = json.loads(out)
    assert data["stage"] == "stopped" and data["stop"]["id"] == "0001" and data["stop"]["kind"] == "merged"
    assert "+line 10 patched" in data["stop"]["review"] and " line 12 upstream" in data["stop"]["review"]
    _, _, err = proj.run("status")
    assert "review" in err and "+line 10 patched" in err and "--continue" in err
    tree_b = (proj.tree / "up/src/b.c").read_text()
    assert "line 10 patched\n" in tree_b and "line 12 upstream\n" in tree_b and "<<<<<<<" not in tree_b
    code, out, err = proj.run("sync", "--continue", "--json")
    data = json.loads(out)
    assert [(d["id"], d["status"]) for d in data["done"]] == [
        ("0001", "merged"), ("0002", "clean"), ("0003", "clean"), ("0004", "clean")]
    reviewed = (proj.root / "patches" / "0001-b.patch").read_bytes()
    proj.run("sync", "--undo")
    # the same move without review stops nowhere and carries the same bytes
    code, out, err = proj.run("sync", "--to", commit, "--start", "--no-review-merged", "--json")
    assert [d["status"] for d in json.loads(out)["done"]] == ["merged", "clean", "clean", "clean"]
    assert (proj.root / "patches" / "0001-b.patch").read_bytes() == reviewed
    proj.run("sync", "--continue", "--no-review-merged", expect=2)


def test_an_edited_review_is_a_resolution(proj: Proj):
    series(proj)
    commit = upstream_commit(proj, {"src/b.c": B_NEAR}, "near b's patch")
    proj.run("sync", "--to", commit, "--start", expect=1)
    proj.edit("up/src/b.c", "line 10 patched\n", "line 10 patched and reviewed\n")
    data = json.loads(proj.run("sync", "--continue", "--json")[1])
    assert data["done"][0]["status"] == "resolved"
    assert "+line 10 patched and reviewed" in (proj.root / "patches" / "0001-b.patch").read_text()


def test_resolutions_are_remembered_across_abort(moved_plain):
    proj, commit, before = moved_plain
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    _, _, err = proj.run("sync", "--abort")
    assert "kept 2 remembered resolution(s)" in err and "2 learnt from this stop" in err  # the block, the file
    assert everything(proj) == before
    code, out, err = proj.run("sync", "--to", commit, "--start", "--json", expect=1)
    data = json.loads(out)
    [f] = data["stop"]["files"]
    assert f["remembered"] == 1 and f["blocks"] == []
    text = (proj.tree / "up/src/a.c").read_text()
    assert "<<<<<<<" not in text and "    return 20; // opencoti-hook: a-ten\n" in text
    _, _, err = proj.run("status")
    assert "resolved as you resolved them before" in err and "check the files above" in err
    proj.run("sync", "--continue")
    assert "+    return 20; // opencoti-hook: a-ten" in (proj.root / "patches" / "0002-a.patch").read_text()
    proj.run("verify")


@pytest.fixture
def moved_plain(proj: Proj) -> tuple[Proj, str, dict[str, str]]:
    series(proj)
    before = everything(proj)
    return proj, upstream_commit(proj, NEW, "newer upstream"), before


def test_labels_name_the_earlier_resolution(proj: Proj):
    series(proj)
    new = dict(NEW)
    new["src/a.c"] = NEW["src/a.c"].replace("int tail(void) { return 0; }", "int tail(void) { return 9; }")
    commit = upstream_commit(proj, new, "tail changed too")
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    data = json.loads(proj.run("sync", "--continue", "--json", expect=1)[1])
    assert data["stop"]["id"] == "0003"
    text = (proj.tree / "up/src/a.c").read_text()
    assert "<<<<<<< patch (on the pinned upstream)\n" in text
    assert "||||||| pinned upstream + 0002\n" in text
    assert ">>>>>>> new upstream + 0002 as you resolved it\n" in text


def test_edits_outside_the_blocks_come_back_at_the_same_stop(moved_plain):
    """What no conflict block shows (a line further down, a file the patch does not touch) is remembered per file
    and put back when the same stop reads the same file again; the patch made from it is the same bytes."""
    proj, commit, before = moved_plain
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    proj.edit("up/src/a.c", "// filler 30\n", "// filler 30, fixed by hand\n")
    proj.edit("up/include/c.h", "int a(void);\n", "int a(void); // now returns 20\n")
    proj.run("sync", "--continue")
    by_hand = {p.name: p.read_bytes() for p in (proj.root / "patches").iterdir()}
    assert b"+int a(void); // now returns 20" in by_hand["0002-a.patch"]  # the outside edit joined the patch
    proj.run("sync", "--undo")
    assert everything(proj) == before
    code, out, err = proj.run("sync", "--to", commit, "--start", "--json", expect=1)
    stop = json.loads(out)["stop"]
    assert stop["id"] == "0002" and stop["remembered_files"] == ["up/include/c.h", "up/src/a.c"]
    assert "now returns 20" in (proj.tree / "up/include/c.h").read_text()
    _, _, err = proj.run("status")
    assert "2 file(s) put back as you left them" in err
    proj.run("sync", "--continue")
    assert {p.name: p.read_bytes() for p in (proj.root / "patches").iterdir()} == by_hand
    proj.run("verify")


def test_an_undo_whose_record_cannot_be_written_still_undoes(reg_moved):
    """ended.json only informs: a directory planted where it goes does not fail the undo, and the next `--undo`
    answers as before the record existed."""
    proj, commit, before = reg_moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    proj.run("sync", "--continue")
    (proj.root / ".opencoti" / "sync" / "ended.json").mkdir()
    _, _, err = proj.run("sync", "--undo")
    assert "undid the sync" in err and snapshot(proj) == before
    _, _, err = proj.run("sync", "--undo", expect=1)
    assert "no finished sync to undo" in err and "ended.json could not be read" in err


def test_an_undo_killed_after_it_finished_is_reported_by_the_next(reg_moved):
    """Killed after every file was back and the record was gone, before it could print: the next `--undo` does not
    answer "no finished sync to undo" but that the sync was undone, with the tree as that undo left it (exit 0)."""
    proj, commit, before = reg_moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    proj.run("sync", "--continue")
    r = proj.sub("sync", "--undo", env={"FORKTOOL_FAULT": "sync-undone"})
    assert r.returncode == 137 and "undid the sync" not in r.stderr, r.stderr
    assert snapshot(proj) == before
    r = proj.sub("sync", "--undo")
    assert r.returncode == 0 and "nothing left to undo" in r.stderr and "was undone at" in r.stderr, r.stderr
    assert "= as that undo left it" in r.stderr and snapshot(proj) == before


@pytest.mark.parametrize("point", ["staging", "committed", "replacing", "state-written"])
def test_a_killed_undo_is_finished_by_the_next(reg_moved, point):
    proj, commit, before = reg_moved
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    proj.run("sync", "--continue")
    r = proj.sub("sync", "--undo", env={"FORKTOOL_FAULT": point})
    assert r.returncode == 137, r.stderr
    r = proj.sub("sync", "--undo")
    assert r.returncode == 0, r.stderr
    assert snapshot(proj) == before
    assert proj.sub("verify").returncode == 0
    third = proj.sub("sync", "--undo")
    assert third.returncode == 0 and "nothing left to undo" in third.stderr


def test_the_finish_summary_stays_within_15_lines_however_much_drifted(tmp_path: Path) -> None:
    """Six patches, each with five api drift lines, and a verify with five problems: the terminal gets at most
    14 lines before its `time:` line; the report keeps every api drift line and every problem."""
    from forktool.commands.sync_cmds import SUMMARY_LINES, _finish_report
    from forktool.project import Project
    (tmp_path / ".opencoti").mkdir()
    done = [{"id": f"00{70 + i}", "name": f"00{70 + i}-p.patch", "status": "resolved", "files": [],
             "api": [f"00{70 + i} uses `t{j}`: upstream removed 1 member (m{j})" for j in range(5)]} for i in range(6)]
    st = {"done": done, "backups": {"project": "none"}, "to_spec": "x==2", "from_spec": "x==1",
          "hooks": {"sites": []}, "compile": [{"profile": "cpu", "status": "compiled", "reason": "", "units": 3}]}
    st["from"], st["to"] = st["from_spec"], st["to_spec"]
    for verify in ({"ok": True, "exported": 6, "tree_digest": "0" * 64, "full_series": True},
                   {"ok": False, "problems": [{"where": f"w{k}", "what": "differs"} for k in range(5)]}):
        short, detail, _ = _finish_report(Project(tmp_path), st, {"verify": verify, "build_plan": {"lines": ["p"]}})
        assert SUMMARY_LINES == 14 and len(short) <= SUMMARY_LINES, short
        assert any("api drift" in s for s in short) == verify["ok"]  # room for them only when verify passed
        assert any("more in the report" in s for s in short)
        assert sum(d.count("api drift") for d in detail) == 30
    assert sum("differs" in d for d in detail) == 5
