"""The sync's compile gate on a small CMake upstream: a patch that applies cleanly but no longer compiles stops the
sync at that patch, and the fixed tree finishes it."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from forktool.tree import digest, scan
from tests.helpers.build import DEMO_BUILD_YAML, DEMO_HEADER, demo_cmake, demo_project
from tests.helpers.cli import run_cli
from tests.helpers.project import Proj, git
from tests.helpers.sync import sync_patch as make_patch

pytestmark = pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("make") and shutil.which("cc")),
                                reason="needs cmake, make and a C compiler")

UPSTREAM = {
    "CMakeLists.txt": demo_cmake("src/impl.c", "src/other.c"),
    "include/api.h": DEMO_HEADER,
    "src/impl.c": '#include "api.h"\nint impl(void) { return 1; }\n',
    "src/other.c": "int other(void) { return 2; }\n",
}
IMPL_PATCHED = UPSTREAM["src/impl.c"] + "int patched(void) { cfg_t c = {7}; return c.x; }\n"
OTHER_PATCHED = UPSTREAM["src/other.c"] + "int other2(void) { return 3; }\n"


@pytest.fixture
def proj(tmp_path: Path, cache: Path) -> Proj:
    root, up = demo_project(tmp_path, UPSTREAM, DEMO_BUILD_YAML)
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
    # --no-cache reads no recorded check: a record the checkout carries (here a real one) cannot say compiled
    assert proj.json("verify", "--no-cache")["compiled"] == {"cpu": "not checked"}
    _, _, err = proj.run("verify", "--no-cache")
    assert "compile checks not read (--no-cache reads no recorded check): cpu" in err
    assert "verify: OK; compile not checked: cpu" in err and "compiled for this series" not in err
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


API_H = UPSTREAM["include/api.h"]
API_PATCHED = API_H + "#define DEMO 1\n"
OTHER_MORE = OTHER_PATCHED + "int other3(void) { return 4; }\n"
OTHER_USES_API = OTHER_MORE + '#include "api.h"\nint other4(void) { cfg_t c = {5}; return c.x; }\n'


def test_a_stop_compiles_first_and_a_continue_compiles_the_resolved_patch(proj: Proj,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    # 0004 adds a line to api.h where the new upstream adds another (a conflict), and a use of cfg_t in other.c,
    # a file that carries cleanly; the new upstream renames cfg_t, so 0002 (clean) no longer compiles either
    patch = make_patch("0004-api.patch", "api: a flag and a user",
                       [("llama.cpp/include/api.h", API_H.encode(), API_PATCHED.encode()),
                        ("llama.cpp/src/other.c", OTHER_MORE.encode(), OTHER_USES_API.encode())])
    proj.write_patch(patch.name, patch.raw.decode())
    proj.run("apply")
    (proj.upstream / "include" / "api.h").write_text(
        "#pragma once\ntypedef struct { int x; } config_t;\n#define UPSTREAM 2\n")
    git(proj.upstream, "commit", "-qam", "rename cfg_t, add a flag")
    commit = git(proj.upstream, "rev-parse", "HEAD")
    # the stop is at 0002, whose clean carry broke the compile, not at 0004's later conflict
    _, out, _ = proj.run("sync", "--to", commit, "--start", "--json", expect=1)
    data = json.loads(out)
    assert data["stop"]["id"] == "0002" and data["stop"]["kind"] == "compile"
    assert [(d["id"], d["status"]) for d in data["done"]] == [("0001", "clean")]
    assert "cfg_t" in data["stop"]["compile"]["cause"] and data["stop"]["compile"]["failed"] == ["llama.cpp/src/impl.c"]
    tree = proj.tree / "llama.cpp"
    assert (tree / "src" / "impl.c").read_text() == IMPL_PATCHED
    assert (tree / "src" / "other.c").read_text() == OTHER_PATCHED  # 0003 is not in the tree
    # fixed: the continue compiles 0002's units, carries 0003, compiles 0001-0003, then offers 0004's conflict
    (tree / "src" / "impl.c").write_text(IMPL_PATCHED.replace("cfg_t", "config_t"))
    _, out, _ = proj.run("sync", "--continue", "--json", expect=1)
    data = json.loads(out)
    assert data["stop"]["id"] == "0004" and data["stop"]["kind"] == "conflict"
    assert data["stop"]["checked"] == [{"profile": "cpu", "status": "compiled", "reason": "", "units": 2}]
    assert [(d["id"], d["status"]) for d in data["done"]] == [("0001", "clean"), ("0002", "resolved"),
                                                             ("0003", "clean")]
    _, _, err = proj.run("status")
    assert "compile check: cpu compiled (2 unit(s))" in err
    # a resolution of the block that leaves 0004's cfg_t in other.c, outside any block: stops again at 0004
    api = (tree / "include" / "api.h").read_text()
    assert "<<<<<<<" in api
    (tree / "include" / "api.h").write_text("#pragma once\ntypedef struct { int x; } config_t;\n"
                                            "#define UPSTREAM 2\n#define DEMO 1\n")
    series_before = (proj.root / "patches" / "0004-api.patch").read_bytes()
    _, out, _ = proj.run("sync", "--continue", "--json", expect=1)
    data = json.loads(out)
    assert data["stop"]["id"] == "0004" and data["stop"]["kind"] == "compile"
    c = data["stop"]["compile"]
    assert c["failed"] == ["llama.cpp/src/other.c"] and "cfg_t" in c["cause"]
    assert c["where"].endswith("llama.cpp/src/other.c:5")
    assert [d["id"] for d in data["done"]] == ["0001", "0002", "0003"]
    assert (proj.root / "patches" / "0004-api.patch").read_bytes() == series_before  # nothing taken yet
    assert "#define DEMO 1" in (tree / "include" / "api.h").read_text()  # the resolution stays in the tree
    _, _, err = proj.run("status")
    assert "compile" in err and "cfg_t" in err
    # fixed outside the block too: the continue compiles and the sync finishes
    (tree / "src" / "other.c").write_text(OTHER_USES_API.replace("cfg_t", "config_t"))
    _, out, _ = proj.run("sync", "--continue", "--json", expect=0)
    data = json.loads(out)
    assert [(d["id"], d["status"]) for d in data["done"]] == [("0001", "clean"), ("0002", "resolved"),
                                                             ("0003", "clean"), ("0004", "resolved")]
    assert data["verify"]["ok"] is True
    assert data["compile"] == [{"profile": "cpu", "status": "compiled", "reason": "", "units": 2}]
    assert "config_t c = {5}" in (proj.root / "patches" / "0004-api.patch").read_text()


def test_a_stop_without_a_cmake_tree_says_not_compiled(proj: Proj, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    # the new upstream drops CMakeLists.txt and changes the line 0002 adds after: 0002 stops as a conflict
    (proj.upstream / "CMakeLists.txt").unlink()
    (proj.upstream / "src" / "impl.c").write_text(UPSTREAM["src/impl.c"] + "int upstream_too(void) { return 8; }\n")
    git(proj.upstream, "commit", "-qam", "no cmake, impl grows")
    _, out, _ = proj.run("sync", "--to", git(proj.upstream, "rev-parse", "HEAD"), "--start", "--json", expect=1)
    data = json.loads(out)
    assert data["stop"]["id"] == "0002" and data["stop"]["kind"] == "conflict"
    [checked] = data["stop"]["checked"]
    assert checked["profile"] == "cpu" and checked["status"] == "not compiled" and "CMakeLists.txt" in checked["reason"]
    _, _, err = proj.run("status")
    assert "compile check: cpu not compiled (the vendored tree has no llama.cpp/CMakeLists.txt)" in err
    assert "cpu compiled" not in err


def test_a_check_of_every_profile_that_compiled_none_says_it_checked_nothing(rp: Proj) -> None:
    # --all exits 0 where this machine cannot compile a profile (the sync workflow reads that exit), so the words
    # and the JSON must say that nothing was checked
    shutil.copy(Path(__file__).resolve().parents[1] / "registry" / "build.yaml", rp.root / "registry" / "build.yaml")
    rp.run("apply")
    _, out, err = rp.run("build", "--check", "--all")
    assert "no profile was compiled: this check checked nothing" in out + err
    data = rp.json("build", "--check", "--all")
    assert data["not_compiled"] == ["cpu", "cuda"] and all(p["status"] == "not compiled" for p in data["profiles"])


def test_a_check_of_other_build_rules_does_not_say_this_profile_compiled(proj: Proj,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # the record is of the profile as it was configured then: flags under which the series no longer compiles
    # (here a define that makes the type 0002 uses an int) leave the series and tree as they were
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    assert proj.json("build", "--check")["ok"]
    assert proj.json("verify")["compiled"] == {"cpu": "compiled"}
    build_yaml = proj.root / "registry" / "build.yaml"
    build_yaml.write_text(build_yaml.read_text().replace("flags: [-DCMAKE_BUILD_TYPE=Release]",
                                                         "flags: [-DCMAKE_BUILD_TYPE=Release, -DCMAKE_C_FLAGS=-Dcfg_t=int]"))
    _, _, err = proj.run("verify")
    assert proj.json("verify")["compiled"] == {"cpu": "not compiled"}, err
    assert "not compiled for this series and tree: cpu" in err and "compiled for this series and tree: cpu" not in \
        err.replace("not compiled for this series and tree: cpu", "")
    code, out, err = proj.run("build", "--check", "--json", expect=1)  # what a check of these rules says
    assert json.loads(out)["profiles"][0]["status"] == "failed"
    assert proj.json("verify", expect=1)["compiled"] == {"cpu": "failed"}


def wrapper_compiler(path: Path, note: str) -> None:
    """A compiler at path: a shell script that runs the real cc (note changes its bytes: another 'version')."""
    real = shutil.which("cc")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\n# {note}\nexec {real} "$@"\n')
    path.chmod(0o755)


def test_a_compiler_installed_again_at_the_same_path_is_not_compiled(proj: Proj, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # the record named no compiler: after a new compiler at the same path, verify still said compiled, and the next
    # check said compiled (2 up to date) from the objects the old compiler made
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    cc = tmp_path / "toolchain" / "cc"
    wrapper_compiler(cc, "version 1")
    monkeypatch.setenv("CC", str(cc))  # CMake takes $CC on the first configure
    assert proj.json("build", "--check")["ok"]
    assert proj.json("verify")["compiled"] == {"cpu": "compiled"}
    time.sleep(0.01)
    wrapper_compiler(tmp_path / "toolchain" / "cc.new", "version 2, other bytes")
    os.replace(tmp_path / "toolchain" / "cc.new", cc)  # as a package upgrade installs it
    v = proj.json("verify")
    assert v["compiled"] == {"cpu": "not compiled"}
    assert v["not_compiled_why"]["cpu"] == f"the C compiler changed since the check: {cc} is another file now"
    _, _, err = proj.run("verify")
    assert "not compiled for this series and tree: cpu" in err and "C compiler changed" in err
    # the next check compiles the fed units again with the new compiler, not "up to date" by make's timestamps
    [res] = proj.json("build", "--check")["profiles"]
    assert res["status"] == "compiled" and len(res["compiled"]) == 2 and res["distrusted"] == 2
    assert res["compilers"]["C"]["path"] == str(cc) and res["compilers"]["C"]["version"]
    assert proj.json("verify")["compiled"] == {"cpu": "compiled"}
    cc.unlink()
    assert proj.json("verify")["not_compiled_why"]["cpu"] == f"the C compiler it compiled with is gone: {cc}"
