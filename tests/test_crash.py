"""Kill the process inside apply and unapply; the next command must leave a tree that verify accepts."""

from __future__ import annotations

import pytest

from tests.helpers.project import Proj
from tests.helpers.series import B2, three_patches

POINTS = ["staging", "committed", "replacing", "state-written"]


@pytest.mark.parametrize("point", POINTS)
def test_kill_inside_apply(proj: Proj, point: str):
    three_patches(proj)
    pristine = proj.digest()
    r = proj.sub("apply", env={"FORKTOOL_FAULT": point})
    assert r.returncode == 137, r.stderr
    st = proj.sub("status")
    assert st.returncode == 0, st.stderr
    if point == "staging":
        assert "discarded" in st.stderr
        assert proj.digest() == pristine  # nothing had been written: byte-identical to before
    else:
        assert "rolled forward" in st.stderr
        assert (proj.tree / "up/src/b.c").read_text() == B2  # fully at the target
    assert proj.sub("apply").returncode == 0
    v = proj.sub("verify")
    assert v.returncode == 0, v.stderr


@pytest.mark.parametrize("point", POINTS)
def test_kill_inside_unapply(proj: Proj, point: str):
    three_patches(proj)
    pristine = proj.digest()
    proj.run("apply")
    applied = proj.digest()
    r = proj.sub("unapply", env={"FORKTOOL_FAULT": point})
    assert r.returncode == 137
    assert proj.sub("status").returncode == 0
    assert proj.digest() in (pristine, applied)  # all or nothing
    assert proj.digest() == (applied if point == "staging" else pristine)
    v = proj.sub("verify")
    assert v.returncode == 0, v.stderr
