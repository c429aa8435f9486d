"""apply / unapply / status / verify / refresh / new on real throwaway projects (real git upstream)."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from tests.helpers.patches import make_patch
from tests.helpers.project import Proj
from tests.helpers.series import A1, B1, B2, A, B, three_patches


def test_apply_verify_status_noop(proj: Proj):
    three_patches(proj)
    pristine = proj.digest()
    res = proj.json("apply")
    assert res["top"] == "0089" and sorted(res["written"]) == ["up/src/a.c", "up/src/b.c", "up/src/new.c"]
    assert res["backup"] and res["recorded_lock"] is True
    assert (proj.tree / "up/src/b.c").read_text() == B2
    assert proj.digest() != pristine
    assert proj.json("verify")["ok"] is True
    st = proj.json("status")
    assert [r["state"] for r in st["patches"]] == ["applied"] * 3 and st["tree"] == "clean"
    before = proj.state_digest()
    backups = len(os.listdir(proj.root / ".opencoti" / "vendor-backups"))
    again = proj.json("apply")
    assert again["written"] == [] and again["backup"] is None
    assert proj.state_digest() == before
    assert len(os.listdir(proj.root / ".opencoti" / "vendor-backups")) == backups


def test_write_only_what_changed_keeps_mtimes(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    old = time.time() - 1000
    for rel in ("up/src/a.c", "up/src/b.c", "up/include/c.h"):
        os.utime(proj.tree / rel, (old, old))
    # edit patch 0070 on disk: only a.c may be rewritten
    p = proj.root / "patches" / "0070-one.patch"
    p.write_text(make_patch("0070-one.patch", {"up/src/a.c": (A, A1.replace("return 2", "return 3"))}, "one", "one"))
    assert proj.json("status")["patches"][0]["state"] == "changed"
    res = proj.json("apply")
    assert res["written"] == ["up/src/a.c"]
    assert os.stat(proj.tree / "up/src/b.c").st_mtime == old
    assert os.stat(proj.tree / "up/include/c.h").st_mtime == old
    assert os.stat(proj.tree / "up/src/a.c").st_mtime > old
    assert "return 3" in (proj.tree / "up/src/a.c").read_text()


def test_unapply_returns_pristine_bytes(proj: Proj):
    three_patches(proj)
    pristine = proj.digest()
    proj.run("apply")
    res = proj.json("unapply", "--to", "0070")
    assert res["top"] == "0070" and (proj.tree / "up/src/b.c").read_text() == B
    assert not (proj.tree / "up/src/new.c").exists()
    proj.run("unapply")
    assert proj.digest() == pristine
    proj.run("verify")


def test_offset_is_applied_and_reported_as_drift(proj: Proj):
    text = make_patch("0070-one.patch", {"up/src/a.c": (A, A1)}, "one", "one")
    shifted = text.replace("@@ -1,6 +1,7 @@", "@@ -4,6 +4,7 @@")
    assert shifted != text
    proj.write_patch("0070-one.patch", shifted)
    res = proj.json("apply")
    assert res["drift"] == [{"file": "up/src/a.c", "hunk": 1, "offset": -3, "patch": "0070"}]
    st = proj.json("status")
    assert st["patches"][0]["drift"][0]["offset"] == -3
    assert (proj.tree / "up/src/a.c").read_text() == A1


def test_conflict_names_patch_file_hunk_line_and_changes_nothing(proj: Proj):
    three_patches(proj)
    proj.run("apply", "--upto", "0070")
    bad = make_patch("0071-two.patch", {"up/src/b.c": (B.replace("line 9\n", "line nine\n"), B1)}, "two", "two")
    (proj.root / "patches" / "0071-two.patch").write_text(bad)
    before = proj.state_digest()
    code, out, err = proj.run("apply", expect=1)
    assert "0071-two.patch" in err and "up/src/b.c" in err and "hunk #1" in err
    assert "line 9" in err and "no fuzz" in err
    # 0070 changes a.c only: it once said "a patch below it changed the text it was written against"
    assert "no patch below it changes up/src/b.c" in err and "git checkout -- patches/0071-two.patch" in err
    assert "a patch below it" not in err
    assert proj.state_digest() == before


def test_dirty_tree_refused_then_forced_with_backup(proj: Proj):
    three_patches(proj)
    proj.run("apply", "--upto", "0071")
    proj.edit("up/src/b.c", "line 3\n", "my local edit\n")
    before = proj.state_digest()
    code, out, err = proj.run("apply", expect=1)
    assert "modified: up/src/b.c" in err and "--force" in err
    assert proj.state_digest() == before
    res = proj.json("apply", "--force")
    assert res["forced"] == ["up/src/b.c"]
    assert (proj.tree / "up/src/b.c").read_text() == B2
    # the local edit is in the backup and comes back byte for byte
    proj.run("backup", "restore", res["backup"])
    assert "my local edit" in (proj.tree / "up/src/b.c").read_text()
    assert proj.state_digest() == before


@pytest.mark.parametrize("argv", [["unapply", "--force"], ["apply", "--force"]])
def test_force_names_the_edits_it_overwrote_and_the_backup_that_brings_them_back(proj: Proj, argv):
    # `--force` said only "backed up and overwrote 1 locally changed file(s)" and the backup's name: not which
    # files' edits went, nor how to get them back
    three_patches(proj)
    proj.run("apply", "--upto", "0071")
    proj.edit("up/src/b.c", "line 3\n", "my local edit\n")
    (proj.tree / "up" / "mine.txt").write_text("mine\n")
    before = proj.state_digest()
    _, out, err = proj.run(*argv)
    name = next(ln.split("backup ")[1] for ln in err.splitlines() if ": wrote " in ln)
    assert "backed up and overwrote 2 locally changed file(s), your edits to:" in err, err
    assert "  modified: up/src/b.c" in err and "  added: up/mine.txt" in err, err
    assert f"the edits are in backup {name}: `forktool backup restore {name}` puts the tree back as it was before " \
           f"this {argv[0]}, edits included" in err, err
    res = proj.json("backup", "restore", name)
    assert "my local edit" in (proj.tree / "up/src/b.c").read_text() and (proj.tree / "up" / "mine.txt").exists()
    assert proj.state_digest() == before, res


def test_force_lists_the_overwritten_edits_in_json(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    proj.edit("up/src/b.c", "line 3\n", "my local edit\n")
    res = proj.json("unapply", "--force")
    assert res["forced"] == ["up/src/b.c"] and res["forced_changes"] == [{"path": "up/src/b.c", "change": "modified"}]


def test_edit_loop_refresh_and_conflicting_later_patch(proj: Proj):
    three_patches(proj)
    proj.run("apply", "--upto", "0071")
    proj.edit("up/src/b.c", "line 10\n", "line 10\nanother line // opencoti-hook: two\n")
    res = proj.json("refresh", "0071")
    assert res["changed"] and res["hooks"] == "two"
    text = (proj.root / "patches" / "0071-two.patch").read_text()
    assert "+another line // opencoti-hook: two" in text and "Opencoti-Hooks: two" in text
    proj.run("verify")
    res = proj.json("apply")  # 0089's context (line 25) is untouched: still applies, one line lower
    assert res["drift"] == [{"file": "up/src/b.c", "hunk": 1, "offset": 1, "patch": "0089"}]
    code, out, err = proj.run("verify", expect=1)  # drifted: 0089 is no longer canonical
    assert "0089" in err
    proj.run("refresh", "0089")  # re-anchor it
    proj.run("verify")
    # now make 0089 conflict: refresh 0071 so that it rewrites line 25
    proj.run("apply", "--upto", "0071")
    proj.edit("up/src/b.c", "line 25\n", "line twenty-five // opencoti-hook: two\n")
    proj.run("refresh", "0071")
    before = proj.state_digest()
    code, out, err = proj.run("apply", expect=1)
    assert "0089-three.patch" in err and "hunk #1" in err
    assert proj.state_digest() == before


def test_refresh_below_the_top_rewrites_it_and_reanchors_the_patches_above(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    proj.edit("up/src/b.c", "// opencoti-hook: two\n", "// opencoti-hook: two\nint also; // opencoti-hook: two\n")
    tree = proj.digest()
    hunks = [ln for ln in (proj.root / "patches/0089-three.patch").read_text().splitlines() if ln.startswith("@@")]
    res = proj.json("refresh", "0071")
    assert res["changed"] and res["reanchored"] == ["0089"] and res["hooks"] == "two"
    assert proj.digest() == tree  # the tree is not touched: the patches now describe it
    assert "+int also; // opencoti-hook: two" in (proj.root / "patches/0071-two.patch").read_text()
    text = (proj.root / "patches/0089-three.patch").read_text()
    now = [ln for ln in text.splitlines() if ln.startswith("@@")]
    assert now[0] != hunks[0] and now[1:] == hunks[1:]  # b.c's hunk one line lower, new.c's the same
    assert "+// opencoti-hook: three" in text
    assert proj.json("verify")["ok"] is True
    st = proj.json("status")
    assert st["tree"] == "clean" and [r["state"] for r in st["patches"]] == ["applied"] * 3
    proj.run("unapply")
    proj.run("apply")
    assert proj.digest() == tree  # the rewritten series gives back the edited tree byte for byte
    # nothing edited: a refresh below the top only writes the patch's canonical form (trailers), once
    proj.run("refresh", "0070")
    before = proj.state_digest()
    assert proj.json("refresh", "0070")["changed"] is False
    assert proj.state_digest() == before and proj.digest() == tree


def test_refresh_below_the_top_refuses_an_edit_of_lines_a_later_patch_owns(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    proj.edit("up/src/b.c", "extra\n", "extra, edited\n")  # a line 0089 adds
    before = proj.state_digest()
    code, out, err = proj.run("refresh", "0071", expect=1)
    assert "0089" in err and "up/src/b.c" in err and "apply --upto 0071" in err
    assert proj.state_digest() == before  # tree (the edit kept), patches and state untouched
    assert proj.json("refresh", "0089")["changed"] is True  # the top owns that line: it takes the edit


def test_refresh_below_the_top_takes_new_and_untouched_files_and_refuses_a_later_patchs_file(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    proj.edit("up/include/c.h", "int a(void);\n", "int a(void);\nint b2; // opencoti-hook: one\n")
    (proj.tree / "up/src/extra.c").write_text("int extra;\n")
    tree = proj.digest()
    res = proj.json("refresh", "0070")
    assert res["files"] == ["up/include/c.h", "up/src/a.c", "up/src/extra.c"] and res["reanchored"] == []
    assert proj.digest() == tree and proj.json("verify")["ok"] is True
    proj.run("unapply")
    proj.run("apply")
    assert proj.digest() == tree
    # a file only a later patch creates cannot take an edit into a patch below it
    proj.edit("up/src/new.c", "int n;\n", "int n, m;\n")
    before = proj.state_digest()
    code, out, err = proj.run("refresh", "0070", expect=1)
    assert "up/src/new.c" in err and "0089" in err
    assert proj.state_digest() == before


def test_refresh_below_the_top_refuses_a_mode_change(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    os.chmod(proj.tree / "up/src/a.c", 0o755)
    before = proj.state_digest()
    code, out, err = proj.run("refresh", "0070", expect=1)
    assert "up/src/a.c" in err and "mode" in err and "apply --upto 0070" in err
    assert proj.state_digest() == before and os.stat(proj.tree / "up/src/a.c").st_mode & 0o111


def test_refresh_refuses_a_patch_that_is_not_applied(proj: Proj):
    three_patches(proj)
    proj.run("apply", "--upto", "0070")
    before = proj.state_digest()
    code, out, err = proj.run("refresh", "0071", expect=2)
    assert "not applied" in err and "apply --upto 0071" in err
    assert proj.state_digest() == before


def test_new_inserts_after_top_and_refresh_fills_it(proj: Proj):
    three_patches(proj)
    proj.run("apply", "--upto", "0071")
    res = proj.json("new", "fix-a", "--title", "fix a")
    assert res["id"] == "0072" and res["after"] == "0071"
    names = [ln for ln in (proj.root / "patches/series").read_text().splitlines() if ln and not ln.startswith("#")]
    assert names == ["0070-one.patch", "0071-two.patch", "0072-fix-a.patch", "0089-three.patch"]
    proj.edit("up/include/c.h", "int a(void);\n", "int a(void);\nint fixed; // opencoti-hook: fix-a\n")
    out = proj.json("refresh", res["id"])
    assert out["files"] == ["up/include/c.h"]
    proj.run("verify")
    proj.run("apply")
    proj.run("verify")
    # no room between 0070 and 0071: the next number after the highest
    proj.run("apply", "--upto", "0070")
    assert proj.json("new", "squeeze")["id"] == "0090"


def test_verify_detects_non_canonical_patch(proj: Proj):
    three_patches(proj)
    p = proj.root / "patches" / "0070-one.patch"
    p.write_text(p.read_text().replace("index ", "index ").replace("@@ -1,6 +1,7 @@", "@@ -1,6 +1,7 @@ int a(void)"))
    proj.run("apply")
    code, out, err = proj.run("verify", expect=1)
    assert "0070" in err and "byte for byte" in err


def test_verify_detects_local_edit_and_tree_digest(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    proj.edit("up/src/a.c", "int tail", "int tail2")
    code, out, err = proj.run("verify", expect=1)
    assert "modified up/src/a.c" in err


def test_status_says_which_key_of_a_pin_differs_from_what_the_tree_was_made_from(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    assert proj.json("status")["pin_moved"] == []
    pin = proj.root / "vendor" / "vendor.yaml"
    before = proj.state_digest()
    pin.write_text(pin.read_text().replace("exclude: ['*.md']", "exclude: ['*.md', '*.txt']"))
    code, out, err = proj.run("status")
    assert "tree: clean" in err and "pin moved: up: vendor.yaml pins " in err
    assert "with another exclude than the tree was made from" in err and "vendor fetch && forktool apply" in err
    assert proj.state_digest() == before


def test_status_json_has_stable_keys(proj: Proj):
    three_patches(proj)
    st = proj.json("status")
    assert set(st) == {"patches", "tree", "top", "local_changes", "applied_not_in_series", "pristine_digest",
                       "pin_moved"}
    assert set(st["patches"][0]) == {"id", "name", "title", "state", "drift", "files"}


def test_status_with_the_tree_absent_shows_no_patch_applied(proj: Proj):
    # with vendor/... removed, status showed every patch "+" (applied) beside "tree: absent"; with no tree no
    # patch is on disk: each is unapplied, the top is none, and the line says what the state recorded and what to run
    three_patches(proj)
    proj.run("apply")
    shutil.rmtree(proj.tree)
    code, out, err = proj.run("status")
    assert code == 0
    assert "+ 00" not in err and err.count("- 00") == 3, err
    assert "tree: absent; top: none; 0/3 applied" in err, err
    assert "does not exist, so no patch is applied (the state records 0089 as its top); next: `forktool apply`" \
        in err, err
    st = proj.json("status")
    assert st["tree"] == "absent" and st["top"] is None and st["local_changes"] == []
    assert [p["state"] for p in st["patches"]] == ["unapplied"] * 3
    proj.run("apply")
    assert proj.json("status")["top"] == "0089"


def test_missing_series_file_entry(proj: Proj):
    with open(proj.root / "patches/series", "a") as f:
        f.write("0001-missing.patch\n")
    before = proj.state_digest()
    code, out, err = proj.run("apply", expect=1)
    assert "0001-missing.patch" in err and "patches/series:2" in err
    assert proj.state_digest() == before


def test_json_error_payload(proj: Proj):
    with open(proj.root / "patches/series", "a") as f:
        f.write("0001-missing.patch\n")
    code, out, err = proj.run("apply", "--json", expect=1)
    payload = json.loads(out)
    assert payload["kind"] == "ConfigError" and payload["where"] == "patches/series:2"


def test_usage_error_exit_2(proj: Proj):
    code, out, err = proj.run("apply", "--upto", "9999", expect=2)
    assert "9999" in err
    code, out, err = proj.run("apply", "--no-such-option", expect=2)


@pytest.mark.parametrize("bad", ["crlf", "truncated", "counts", "binary", "rename", "mode", "traversal", "absolute"])
def test_bad_patch_inputs_leave_everything_unchanged(proj: Proj, bad: str):
    three_patches(proj)
    proj.run("apply", "--upto", "0070")
    good = make_patch("0071-two.patch", {"up/src/b.c": (B, B1)}, "two", "two")
    mutate = {
        "crlf": lambda t: t.replace("\n", "\r\n"),
        "truncated": lambda t: t[: len(t) - 40],
        "counts": lambda t: t.replace("@@ -8,6 +8,7 @@", "@@ -8,6 +8,9 @@"),
        "binary": lambda t: t.split("--- a/")[0] + "Binary files a/up/src/b.c and b/up/src/b.c differ\n",
        "rename": lambda t: t.replace("diff --git a/up/src/b.c b/up/src/b.c", "diff --git a/up/src/b.c b/up/src/z.c"),
        "mode": lambda t: t.replace("index ", "old mode 100644\nnew mode 100755\nindex "),
        "traversal": lambda t: t.replace("up/src/b.c", "../../outside.c"),
        "absolute": lambda t: t.replace("a/up/src/b.c b/up/src/b.c", "a//tmp/x.c b//tmp/x.c"),
    }[bad]
    text = mutate(good)
    assert text != good
    (proj.root / "patches" / "0071-two.patch").write_text(text)
    before = proj.state_digest()
    code, out, err = proj.run("apply", expect=1)
    assert "0071-two.patch" in err or "outside" in err
    assert "next:" in err  # every error says what to do
    assert proj.state_digest() == before
    assert not (proj.root / "outside.c").exists() and not (proj.root.parent / "outside.c").exists()


def test_symlink_escape_is_refused(proj: Proj, tmp_path):
    three_patches(proj)
    outside = tmp_path / "outside"
    outside.mkdir()
    # a symlinked directory inside the tree pointing outside: patches must not write through it
    target = proj.tree / "up" / "src"
    moved = tmp_path / "src-real"
    target.rename(moved)
    target.symlink_to(outside, target_is_directory=True)
    (outside / "a.c").write_text(A)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    code, out, err = proj.run("apply", "--force", expect=1)
    assert "symlink" in err
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before


def test_new_with_explicit_id(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    assert proj.json("new", "later", "--id", "0100")["patch"] == "0100-later.patch"
    code, out, err = proj.run("new", "dup", "--id", "0070", expect=2)
    assert "not a free" in err


def test_refresh_keeps_an_edited_message_but_not_a_hand_edited_diff(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    p = proj.root / "patches" / "0089-three.patch"
    p.write_text(p.read_text().replace("Subject: [PATCH] three\n\n", "Subject: [PATCH] three\n\nWhy it exists.\n\n"))
    assert proj.json("status")["patches"][2]["state"] == "changed"
    proj.run("refresh", "0089")
    assert "Why it exists." in p.read_text()
    proj.run("verify")
    p.write_text(p.read_text().replace("+extra\n", "+extra edited by hand\n"))
    before = proj.state_digest()
    code, out, err = proj.run("refresh", "0089", expect=1)
    assert "changed on disk" in err
    assert proj.state_digest() == before


def test_reanchor_after_a_lower_patch_changes(proj: Proj):
    three_patches(proj)
    proj.run("apply", "--upto", "0071")
    proj.edit("up/src/b.c", "line 3\n", "line 3\nline 3b // opencoti-hook: two\n")
    proj.run("refresh", "0071")
    old = (proj.root / "patches" / "0089-three.patch").read_text()
    proj.run("apply")
    proj.run("verify", expect=1)  # 0089 applies one line lower and over another blob: not canonical
    before = (proj.tree / "up/src/b.c").read_bytes()
    res = proj.json("apply", "--reanchor")
    assert res["reanchored"] == ["0089"] and res["written"] == []
    new = (proj.root / "patches" / "0089-three.patch").read_text()
    assert new != old and "+// opencoti-hook: three" in new
    assert (proj.tree / "up/src/b.c").read_bytes() == before
    proj.run("verify")


def test_verify_names_a_patch_that_no_longer_applies(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    p = proj.root / "patches" / "0071-two.patch"
    p.write_text(make_patch("0071-two.patch", {"up/src/b.c": (B.replace("line 9\n", "line nine\n"), B1)}, "two", "two"))
    code, out, err = proj.run("verify", expect=1)
    assert "0071-two.patch" in err and "does not apply" in err


def test_try_patch_reports_each_file_and_changes_nothing():
    from forktool.apply import Applied, apply_series, record, try_patch
    from forktool.series import parse_patch

    upstream = {"up/src/a.c": A.encode(), "up/src/b.c": B.replace("line 25\n", "line XXV\n").encode()}
    three = parse_patch(make_patch("0089-three.patch", {"up/src/b.c": (B1, B2), "up/src/new.c": (None, "int n;\n")},
                                   "three", "three").encode(), "0089-three.patch")
    one = parse_patch(make_patch("0070-one.patch", {"up/src/a.c": (A, A1)}, "one", "one").encode(), "0070-one.patch")
    acc = apply_series([one], upstream.get)
    before = dict(acc.files)
    outcomes = try_patch(three, upstream.get, acc)
    assert acc.files == before  # trying changes nothing
    by_path = {o.path: o for o in outcomes}
    assert by_path["up/src/b.c"].error is not None and "hunk #1" in by_path["up/src/b.c"].error.what
    assert by_path["up/src/b.c"].content == upstream["up/src/b.c"]
    assert by_path["up/src/new.c"].error is None and by_path["up/src/new.c"].content == b"int n;\n"
    record(three.id, outcomes, acc)
    assert acc.files["up/src/new.c"] == b"int n;\n" and "up/src/b.c" not in acc.files
    assert apply_series([one], upstream.get, Applied()).files == before



def test_a_hunk_whose_context_stops_at_the_file_end_applies_only_there():
    """Less context after the change than before it: the file ended there; the same lines elsewhere in a longer
    file are another place, not an offset (likewise at the beginning). Full context on both sides: an offset."""
    from forktool.apply import apply_file
    from forktool.errors import ApplyError
    from forktool.series import parse_patch

    body = "".join(f"line {i}\n" for i in range(1, 13))
    for name, new, anchored, longer in (
            ("0070-tail.patch", body + "added\n", "at the end", body + "more\n"),
            ("0071-head.patch", "first\n" + body, "at the beginning", "zero\n" + body)):
        patch = parse_patch(make_patch(name, {"up/src/t.c": (body, new)}).encode(), name)
        assert apply_file(patch, patch.files[0], body.encode()) == (new.encode(), [])
        with pytest.raises(ApplyError) as e:
            apply_file(patch, patch.files[0], longer.encode())
        assert f"{anchored} of the file" in e.value.what
    mid = body.replace("line 6\n", "line 6\nmid\n")
    patch = parse_patch(make_patch("0072-mid.patch", {"up/src/t.c": (body, mid)}).encode(), "0072-mid.patch")
    out, drift = apply_file(patch, patch.files[0], ("zero\n" + body + "more\n").encode())
    assert out == ("zero\n" + mid + "more\n").encode() and [d.offset for d in drift] == [1]


def test_a_tree_written_where_there_was_none_names_no_backup(rp: Proj):
    # the first apply after the tree was removed writes it whole: there was nothing to keep, and it says so
    import shutil

    shutil.rmtree(rp.root / "vendor" / "llamafile")
    (rp.root / ".opencoti" / "state.json").unlink()
    _, out, err = rp.run("apply")
    assert "no backup (there was no tree to keep)" in out + err and "backup None" not in out + err
    _, out, err = rp.run("unapply")
    assert "; backup " in out + err and "None" not in out + err


@pytest.mark.parametrize("files, what", [
    ({"up/src/ghost.c": ("a\nb\nc\n", "a\nB\nc\n")}, "up/src/ghost.c does not exist"),
    ({"up/src/a.c": (None, "int a;\n")}, "up/src/a.c already exists but 0090-ghost.patch creates it"),
])
def test_a_patch_for_a_file_missing_or_already_there_is_refused_with_a_fix_that_works(proj: Proj, files, what):
    three_patches(proj)
    proj.write_patch("0090-ghost.patch", make_patch("0090-ghost.patch", files, "ghost", "ghost"))
    before = proj.state_digest()
    for argv in (["apply"], ["apply", "--reanchor"]):
        code, out, err = proj.run(*argv, expect=1)
        assert what in err and "patches/0090-ghost.patch" in err, (argv, err)
        # no patch below changed a text it was written against, and no 3-way merge makes or removes a file:
        # --reanchor once stopped at 'conflict blocks' in a file that was not there
        assert "a patch below it changed the text" not in err and "re-anchoring" not in err, (argv, err)
        assert "refresh" not in err, (argv, err)
        assert proj.state_digest() == before
    assert not (proj.root / ".opencoti" / "sync" / "state.json").exists()
    proj.run("status")


def test_status_names_an_applied_patch_the_series_no_longer_names(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    series = proj.root / "patches" / "series"
    series.write_text(series.read_text().replace("0089-three.patch\n", ""))
    before = proj.state_digest()
    code, out, err = proj.run("status")
    # it said "top: 0089; 3/2 applied" and listed 0089 nowhere
    assert "! 0089 0089-three.patch: applied, but patches/series no longer names it" in err
    assert "tree: clean; top: 0089; 2/2 applied, and 1 not in the series" in err
    assert proj.json("status")["applied_not_in_series"] == ["0089"]
    code, out, err = proj.run("verify", expect=1)
    assert "patch 0089: applied, but patches/series no longer names it; run `forktool apply`" in err
    assert "file changed since it was applied" not in err  # what verify said of it: the file had not changed
    assert proj.state_digest() == before
    proj.run("apply")  # what the line says it does
    code, out, err = proj.run("status")
    assert "top: 0071; 2/2 applied\n" in err and "not in the series" not in err


def test_status_shows_titles_and_paths_as_written(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    proj.run("new", "odd", "--title", "a [red]b[/red] c")
    (proj.tree / "up" / "src" / "[red]d[/red]").mkdir(parents=True)
    (proj.tree / "up" / "src" / "[red]d[/red]" / "f.c").write_text("x\n")
    code, out, err = proj.run("status")
    # both were read as markup: the title showed as "a b c" and the file as up/src/d/f.c, which does not exist
    assert "+ 0090 a [red]b[/red] c (0 file(s))" in err
    assert "  added up/src/[red]d[/red]/f.c" in err


def test_refresh_below_an_applied_patch_whose_file_changed_names_the_apply_to_run(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    p = proj.root / "patches" / "0089-three.patch"
    p.write_text(p.read_text().replace("Subject: [PATCH] three", "Subject: [PATCH] three, retitled"))
    before = proj.state_digest()
    code, out, err = proj.run("refresh", "0071", expect=1)
    assert "applied patch(es) 0089 changed on disk since they were applied" in err
    assert "run `forktool apply --upto 0089` to re-apply them first" in err  # it said `--upto ID`
    assert proj.state_digest() == before
    proj.run("apply", "--upto", "0089")
    proj.run("refresh", "0071")


def test_verify_of_an_empty_series_says_the_tree_is_pristine_not_that_the_series_is_not_applied(proj: Proj):
    # a sync whose patches were all skipped leaves a series that names no patch: 0/0 applied is the whole series
    _, _, out = proj.run("verify")
    pristine = proj.json("verify")["tree_digest"][:12]
    assert f"tree digest {pristine} is the pristine tree (the series names no patch)" in out
    assert "not fully applied" not in out
    three_patches(proj)
    proj.run("apply")
    proj.run("unapply", "--to", "0070")
    _, _, out = proj.run("verify")
    assert "(series not fully applied)" in out
