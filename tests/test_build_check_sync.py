"""The sync's compile gate on a small CMake upstream: a patch that applies cleanly but no longer compiles stops the
sync at that patch, and the fixed tree finishes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from forktool.tree import digest, scan
from tests.helpers.cli import run_cli
from tests.helpers.project import Proj, git, make_upstream
from tests.helpers.sync import sync_patch as make_patch

pytestmark = pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("make") and shutil.which("cc")),
                                reason="needs cmake, make and a C compiler")

BUILD_YAML = """\
artifacts:
  - name: lib
    impact: host
    paths: ["llama.cpp"]
    targets: [demo]
    outputs: [libdemo.so]
profiles:
  cpu:
    flags: [-DCMAKE_BUILD_TYPE=Release]
    targets: [demo]
"""

UPSTREAM = {
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.16)\nproject(demo C)\n"
                      "add_library(demo SHARED src/impl.c src/other.c)\ntarget_include_directories(demo PRIVATE include)\n",
    "include/api.h": "#pragma once\ntypedef struct { int x; } cfg_t;\n",
    "src/impl.c": '#include "api.h"\nint impl(void) { return 1; }\n',
    "src/other.c": "int other(void) { return 2; }\n",
}
IMPL_PATCHED = UPSTREAM["src/impl.c"] + "int patched(void) { cfg_t c = {7}; return c.x; }\n"
OTHER_PATCHED = UPSTREAM["src/other.c"] + "int other2(void) { return 3; }\n"


@pytest.fixture
def proj(tmp_path: Path, cache: Path) -> Proj:
    up = tmp_path / "upstream"
    commit = make_upstream(up, UPSTREAM)
    root = tmp_path / "proj"
    for d in ("vendor", "patches", "registry"):
        (root / d).mkdir(parents=True)
    (root / "registry" / "build.yaml").write_text(BUILD_YAML)
    (root / "vendor" / "vendor.yaml").write_text(
        f"components:\n  - name: llama.cpp\n    kind: git\n    url: {up}\n    commit: {commit}\n"
        "    include: [CMakeLists.txt, src, include]\n")
    (root / "patches" / "series").write_text("# test series\n")
    run_cli(root, ["vendor", "fetch"])
    p = Proj(root, up)
    for patch in (
        make_patch("0001-other.patch", "other: a second function",
                   [("llama.cpp/src/other.c", UPSTREAM["src/other.c"].encode(), OTHER_PATCHED.encode())]),
        make_patch("0002-impl.patch", "impl: use the config",
                   [("llama.cpp/src/impl.c", UPSTREAM["src/impl.c"].encode(), IMPL_PATCHED.encode())]),
        make_patch("0003-more.patch", "other: a third function",
                   [("llama.cpp/src/other.c", OTHER_PATCHED.encode(),
                     (OTHER_PATCHED + "int other3(void) { return 4; }\n").encode())])):
        p.write_patch(patch.name, patch.raw.decode())
    p.run("apply")
    return p


def test_a_patch_that_no_longer_compiles_stops_the_sync_there(proj: Proj, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    # the new upstream renames the type 0002's added line uses: every patch still applies cleanly
    (proj.upstream / "include" / "api.h").write_text("#pragma once\ntypedef struct { int x; } config_t;\n")
    git(proj.upstream, "commit", "-qam", "rename cfg_t")
    commit = git(proj.upstream, "rev-parse", "HEAD")
    _, out, _ = proj.run("sync", "--to", commit, "--start", "--json", expect=1)
    data = json.loads(out)
    assert data["stage"] == "stopped" and data["stop"]["id"] == "0002" and data["stop"]["kind"] == "compile"
    assert [(d["id"], d["status"]) for d in data["done"]] == [("0001", "clean")]
    c = data["stop"]["compile"]
    assert c["profile"] == "cpu" and "cfg_t" in c["cause"] and c["where"].endswith("llama.cpp/src/impl.c:3")
    assert c["failed"] == ["llama.cpp/src/impl.c"]
    # the tree holds 0001 and 0002 on the new upstream, not 0003
    tree = proj.tree / "llama.cpp"
    assert (tree / "src" / "impl.c").read_text() == IMPL_PATCHED
    assert (tree / "src" / "other.c").read_text() == OTHER_PATCHED
    assert "config_t" in (tree / "include" / "api.h").read_text()
    _, _, err = proj.run("status")
    assert "compile" in err and "cfg_t" in err and "--continue" in err
    # the maintainer fixes what 0002 means on the new upstream; the continue compiles again and finishes
    (tree / "src" / "impl.c").write_text(IMPL_PATCHED.replace("cfg_t", "config_t"))
    _, out, _ = proj.run("sync", "--continue", "--json", expect=0)
    data = json.loads(out)
    assert [(d["id"], d["status"]) for d in data["done"]] == [("0001", "clean"), ("0002", "resolved"),
                                                             ("0003", "clean")]
    assert data["compile"] == [{"profile": "cpu", "status": "compiled", "reason": "", "units": 2}]
    assert data["verify"]["ok"] is True
    assert "config_t c = {7}" in (proj.root / "patches" / "0002-impl.patch").read_text()
    # what the gate compiled is recorded for the moved series: verify says so
    assert proj.json("verify")["compiled"] == {"cpu": "compiled"}


def test_abort_after_a_compile_stop_restores_everything(proj: Proj, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    before = digest(scan(proj.tree)), (proj.root / "vendor" / "vendor.lock").read_bytes()
    (proj.upstream / "include" / "api.h").write_text("#pragma once\ntypedef struct { int x; } config_t;\n")
    git(proj.upstream, "commit", "-qam", "rename cfg_t")
    proj.run("sync", "--to", git(proj.upstream, "rev-parse", "HEAD"), "--start", expect=1)
    proj.run("sync", "--abort")
    assert (digest(scan(proj.tree)), (proj.root / "vendor" / "vendor.lock").read_bytes()) == before


def test_check_is_recorded_and_verify_says_which_profiles_compiled(proj: Proj,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    v = proj.json("verify")
    assert v["ok"] and v["compiled"] == {"cpu": "not compiled"}
    _, _, err = proj.run("verify")
    assert "not compiled for this series and tree: cpu" in err and "verify: OK; not compiled: cpu" in err
    data = proj.json("build", "--check")
    [res] = data["profiles"]
    assert data["ok"] and res["status"] == "compiled"
    assert res["units"] == ["llama.cpp/src/impl.c", "llama.cpp/src/other.c"] and len(res["compiled"]) == 2
    assert proj.json("verify")["compiled"] == {"cpu": "compiled"}
    _, _, err = proj.run("verify")
    assert "compiled for this series and tree: cpu" in err and "not compiled" not in err
    # usage errors name the option
    _, _, err = proj.run("build", "--check", "--all", "--profile", "cpu", expect=2)
    assert "--all" in err
    _, _, err = proj.run("build", "--check", "--profile", "nosuch", expect=2)
    assert "no build profile 'nosuch'" in err
    _, _, err = proj.run("build", "--all", expect=2)
    assert "--all goes with --check" in err
    # a patch that breaks the compile: the check fails at its line, the record of this tree fails verify
    broken = IMPL_PATCHED + "int broken(void) { return missing_symbol; }\n"
    patch = make_patch("0004-broken.patch", "impl: broken",
                       [("llama.cpp/src/impl.c", IMPL_PATCHED.encode(), broken.encode())])
    proj.write_patch(patch.name, patch.raw.decode())
    proj.run("apply")
    code, out, err = proj.run("build", "--check", "--json", expect=1)
    [res] = json.loads(out)["profiles"]
    assert res["status"] == "failed" and res["failed"] == ["llama.cpp/src/impl.c"]
    assert res["cause"]["line"] == 4 and "missing_symbol" in res["cause"]["text"]
    assert "`forktool refresh 0004`" in res["hint"]  # 0002 and 0004 change impl.c: the later one is named
    _, _, err = proj.run("verify", expect=1)
    assert "compile check of this series failed for cpu" in err
