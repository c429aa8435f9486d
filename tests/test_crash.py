"""Kill the process inside apply and unapply; the next command must leave a tree that verify accepts."""

from __future__ import annotations

import pytest

from tests.helpers.project import Proj
from tests.helpers.series import B2, SERIES, three_patches

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


@pytest.mark.parametrize("point", POINTS)
def test_kill_inside_a_refresh_below_the_top(proj: Proj, point: str):
    # the refreshed patch, the one above it re-anchored, the state and the lock are one update of the project's
    # files: killed anywhere, the next command finishes it or it never began; never a patch on disk the state
    # does not record
    three_patches(proj)
    proj.run("apply")
    names = sorted(SERIES)
    old = {n: (proj.root / "patches" / n).read_bytes() for n in names}
    proj.edit("up/src/b.c", "// opencoti-hook: two\n", "// opencoti-hook: two\nint also; // opencoti-hook: two\n")
    tree = proj.digest()
    r = proj.sub("refresh", "0071", env={"FORKTOOL_FAULT": point})
    assert r.returncode == 137, r.stderr
    st = proj.sub("status")
    assert st.returncode == 0, st.stderr
    if point == "staging":
        assert {n: (proj.root / "patches" / n).read_bytes() for n in names} == old  # nothing was written
        assert proj.sub("refresh", "0071").returncode == 0
    else:
        assert "rolled forward" in st.stderr
    now = {n: (proj.root / "patches" / n).read_bytes() for n in names}
    assert now["0070-one.patch"] == old["0070-one.patch"]
    assert now["0071-two.patch"] != old["0071-two.patch"] and now["0089-three.patch"] != old["0089-three.patch"]
    assert b"+int also; // opencoti-hook: two" in now["0071-two.patch"]
    assert proj.digest() == tree  # the edit is kept: the patches now describe it
    v = proj.sub("verify")
    assert v.returncode == 0, v.stderr
    assert proj.sub("unapply").returncode == 0 and proj.sub("apply").returncode == 0
    assert proj.digest() == tree


@pytest.mark.parametrize("point", POINTS)
def test_kill_inside_a_refresh_of_the_top(proj: Proj, point: str):
    three_patches(proj)
    proj.run("apply")
    old = (proj.root / "patches" / "0089-three.patch").read_bytes()
    proj.edit("up/src/new.c", "int n;\n", "int n; // opencoti-hook: three\n")
    tree = proj.digest()
    r = proj.sub("refresh", "0089", env={"FORKTOOL_FAULT": point})
    assert r.returncode == 137, r.stderr
    assert proj.sub("status").returncode == 0
    if point == "staging":
        assert (proj.root / "patches" / "0089-three.patch").read_bytes() == old
        assert proj.sub("refresh", "0089").returncode == 0
    assert b"+int n; // opencoti-hook: three" in (proj.root / "patches" / "0089-three.patch").read_bytes()
    assert proj.digest() == tree
    v = proj.sub("verify")
    assert v.returncode == 0, v.stderr


# killed by SIGKILL on the third file written into a materialisation's temporary directory (on any forktool: the
# kill is planted from outside, through sitecustomize, not through a fault point of forktool's own)
KILL_IN_MATERIALISE = """
import os, pathlib
_write = pathlib.Path.write_bytes
_seen = []
def write_bytes(self, data):
    if ".llamafile-" in str(self):
        _seen.append(self)
        if len(_seen) == 3:
            os.kill(os.getpid(), 9)
    return _write(self, data)
pathlib.Path.write_bytes = write_bytes
"""


def test_a_materialisation_killed_halfway_leaves_no_partial_tree_behind(proj: Proj, tmp_path):
    # a kill while the pristine tree was written left vendor/.llamafile-XXXX (a partial copy of the tree, which
    # `git status` shows as untracked) that nothing ever removed
    import shutil

    three_patches(proj)
    proj.run("apply")
    shutil.rmtree(proj.tree)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(KILL_IN_MATERIALISE)
    r = proj.sub("apply", env={"PYTHONPATH": str(site)})
    assert r.returncode == -9, r.stderr
    left = [p.name for p in proj.tree.parent.iterdir() if p.name.startswith(".llamafile-")]
    assert left and not proj.tree.exists()  # the kill came inside the materialisation
    assert proj.sub("apply").returncode == 0
    assert [p.name for p in proj.tree.parent.iterdir() if p.name.startswith(".")] == []
    assert proj.sub("verify").returncode == 0


# killed by SIGKILL as the registry file is put in place (after the patch, series and state were written)
KILL_AT_REGISTRY = """
import os
_replace = os.replace
def replace(src, dst, *a, **k):
    if os.fspath(dst).endswith("/registry/UPSTREAM_SYNC.yaml"):
        os.kill(os.getpid(), 9)
    return _replace(src, dst, *a, **k)
os.replace = replace
"""


@pytest.mark.parametrize("point", ["staging", "registry"])
def test_new_cut_short_is_all_or_nothing(rp: Proj, tmp_path, point: str):
    # `new` wrote the patch, the series, the state and the registry one after the other: cut short (a full disk, a
    # kill) it left a patch applied and in the series but not in the registry, and `new` run again, as its error
    # said, made a second patch beside it
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(KILL_AT_REGISTRY)
    env = {"FORKTOOL_FAULT": "staging"} if point == "staging" else {"PYTHONPATH": str(site)}
    rp.run("apply")
    series = (rp.root / "patches" / "series").read_text()
    r = rp.sub("new", "x", env=env)
    assert r.returncode in (137, -9), r.stderr
    rp.run("status")  # finishes (or discards) what the kill left
    now = (rp.root / "patches" / "series").read_text()
    registry = (rp.root / "registry" / "UPSTREAM_SYNC.yaml").read_text()
    patches = sorted(p.name for p in (rp.root / "patches").glob("*.patch"))
    if point == "staging":  # killed before the plan was committed: nothing of it
        assert now == series and "0071" not in registry and patches == ["0070-ctx-window.patch"]
    else:  # committed: all of it
        assert "0071-x.patch" in now and "0071-x.patch" in registry
        assert patches == ["0070-ctx-window.patch", "0071-x.patch"]
    assert rp.json("new", "x")["id"] == ("0071" if point == "staging" else "0072")
