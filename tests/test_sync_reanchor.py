"""`apply --reanchor` after a lower patch changed a later patch's context: the sync loop onto the changed base."""

from __future__ import annotations

import json

import pytest

from tests.helpers.project import UPSTREAM, Proj
from tests.helpers.sync import sync_patch as make_patch

B = UPSTREAM["src/b.c"]
LOW = B.replace("line 10\n", "line 10 // lower comment\n")


def two_patches(proj: Proj, upper_line: str) -> None:
    """0001 comments line 10; 0002 changes upper_line with 0001's comment in its context."""
    up = LOW.replace(f"{upper_line}\n", f"{upper_line} upper // opencoti-hook: up\n")
    for p in (make_patch("0001-low.patch", "low", [("up/src/b.c", B.encode(), LOW.encode())]),
              make_patch("0002-up.patch", "up", [("up/src/b.c", LOW.encode(), up.encode())])):
        proj.write_patch(p.name, p.raw.decode())
    proj.run("apply")


def edit_lower(proj: Proj) -> dict[str, str]:
    """Edit 0001's comment the everyday way (unapply to it, edit, refresh); return what --abort must restore."""
    proj.run("unapply", "--to", "0001")
    proj.edit("up/src/b.c", "line 10 // lower comment\n", "line 10 // lower comment, edited\n")
    proj.run("refresh", "0001")
    return everything(proj)


def everything(proj: Proj) -> dict[str, str]:
    out = {"tree": proj.digest()}
    for rel in ("vendor/vendor.yaml", "vendor/vendor.lock", ".opencoti/state.json", "patches/series",
                "patches/0001-low.patch", "patches/0002-up.patch"):
        out[rel] = (proj.root / rel).read_text()
    return out


def test_plain_apply_names_the_way_that_works(proj: Proj):
    two_patches(proj, "line 12")
    before = edit_lower(proj)
    _, _, err = proj.run("apply", expect=1)
    assert "apply --reanchor" in err and "refresh 0002" not in err
    assert "a patch below it (0001) changed the text it was written against" in err
    assert everything(proj) == before
    _, _, err = proj.run("verify", expect=1)  # verify gives its report, not an apply error
    assert "verify found 1 difference(s)" in err and "0002-up.patch" in err


def test_a_context_change_stops_for_review_then_finishes(proj: Proj):
    two_patches(proj, "line 12")
    edit_lower(proj)
    code, out, err = proj.run("apply", "--reanchor", "--json", expect=1)
    data = json.loads(out)
    assert data["stage"] == "stopped" and data["stop"]["id"] == "0002" and data["stop"]["kind"] == "merged"
    assert "+line 12 upper" in data["stop"]["review"]
    assert "line 10 // lower comment, edited" in (proj.tree / "up/src/b.c").read_text()
    _, _, err = proj.run("status")
    # every command it names is one that runs here (no refresh of an unapplied patch, no option of sync --start)
    assert "--continue" in err and "refresh 0002" not in err and "--no-review-merged" not in err
    code, out, err = proj.run("sync", "--continue", "--json")
    data = json.loads(out)
    assert [(d["id"], d["status"]) for d in data["done"]] == [("0001", "clean"), ("0002", "merged")]
    assert data["verify"]["ok"] is True
    patch = (proj.root / "patches" / "0002-up.patch").read_text()
    assert " line 10 // lower comment, edited\n" in patch and "+line 12 upper // opencoti-hook: up\n" in patch
    proj.run("verify")
    _, _, err = proj.run("status")
    assert "2/2 applied" in err


@pytest.mark.parametrize("then", ["--abort", "--continue"])
def test_a_clash_stops_with_conflict_blocks(proj: Proj, then: str):
    two_patches(proj, "line 11")  # the line right below the edited one: the two changes meet
    before = edit_lower(proj)
    code, out, err = proj.run("apply", "--reanchor", "--json", expect=1)
    data = json.loads(out)
    assert data["stop"]["kind"] == "conflict" and data["stop"]["files"][0]["blocks"]
    text = (proj.tree / "up/src/b.c").read_text()
    assert "<<<<<<< patch (as written)\n" in text and "||||||| the context it was written against\n" in text
    assert ">>>>>>> the tree now (with 0001)\n" in text
    _, _, err = proj.run("status")
    assert "`>>>>>>> the tree now` block: keep what the patch means on the edited patches below it" in err
    proj.run("sync", "--continue", expect=1)  # blocks left: refused
    if then == "--abort":
        proj.run("sync", "--abort")
        assert everything(proj) == before
        return
    start = text.index("<<<<<<< ")
    end = text.index("\n", text.index(">>>>>>> ")) + 1
    (proj.tree / "up/src/b.c").write_text(text[:start] + "line 10 // lower comment, edited\n"
                                          "line 11 upper // opencoti-hook: up\n" + text[end:])
    data = json.loads(proj.run("sync", "--continue", "--json")[1])
    assert [(d["id"], d["status"]) for d in data["done"]] == [("0001", "clean"), ("0002", "resolved")]
    proj.run("verify")
    assert proj.root.joinpath("vendor/vendor.yaml").read_text() == before["vendor/vendor.yaml"]  # the pin stays
