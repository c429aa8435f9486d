"""The real cpu profile: a full build, then a host-only patch edit rebuilds exactly its objects and the stamp."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_build import HOST_FILE, edit_host_file, forktool, scratch_project  # noqa: E402

pytestmark = pytest.mark.slow
JOBS = os.environ.get("FORKTOOL_TEST_JOBS", "2")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("cmake") or not shutil.which("make"):
        pytest.skip("needs cmake and make")
    return scratch_project(tmp_path_factory.mktemp("slow") / "proj")


def test_host_only_edit_rebuilds_only_its_objects(project: Path) -> None:
    first = forktool(project, "build", "-j", JOBS)
    assert first["first_build"] and len(first["objects"]) > 150
    bdir = project / "build" / "cpu"
    out = subprocess.run([bdir / "bin" / "llama-cli", "--version"], capture_output=True, text=True)
    assert first["stamp"] in out.stdout + out.stderr

    noop = forktool(project, "build", "-j", JOBS)
    assert noop["objects"] == [] and noop["unexpected"] == []

    edit_host_file(project, 7)
    forktool(project, "refresh", "0001")
    plan = forktool(project, "build", "--plan")
    assert plan["changed"] == ["0001"] and plan["artifacts"] == ["libllama"]
    assert plan["keep"] == ["ggml-cpu", "ggml-base"]
    assert plan["patches"][0]["summary"] == "0001: host-only, 1 file -> libllama; CUDA DSO untouched, no restamp"

    again = forktool(project, "build", "-j", JOBS)
    # the edited translation unit plus the two the stamp reaches (llama-version.h, build-info.cpp)
    assert sorted(again["objects"]) == sorted([
        f"src/CMakeFiles/llama.dir/{Path(HOST_FILE).name}.o",
        "src/CMakeFiles/llama.dir/llama.cpp.o",
        "common/CMakeFiles/llama-common-base.dir/build-info.cpp.o",
    ])
    assert again["kept"] == ["ggml-cpu", "ggml-base"] and again["unexpected"] == []
    for lib in ("bin/libggml-cpu.so", "bin/libggml-base.so", "bin/libggml.so"):
        assert again["outputs"][lib] == first["outputs"][lib]
    # a comment-only edit may leave libllama's bytes as they were: only the kept ones are a promise
    out = subprocess.run([bdir / "bin" / "llama-cli", "--version"], capture_output=True, text=True)
    assert again["stamp"] in out.stdout + out.stderr and again["stamp"] != first["stamp"]


def test_package_of_the_real_build_is_reproducible(project: Path, tmp_path: Path) -> None:
    a = forktool(project, "package", "--out", str(tmp_path / "a"))
    b = forktool(project, "package", "--out", str(tmp_path / "b"))
    assert Path(a["archive"]).read_bytes() == Path(b["archive"]).read_bytes()
    assert forktool(project, "package", "verify", a["dir"])["ok"]
    manifest = json.loads((Path(a["dir"]) / "manifest.json").read_text())
    assert [p["id"] for p in manifest["patches"]] == ["0001"] and manifest["build"]["compilers"]
    assert (Path(a["dir"]) / "bin" / "llama-cli").is_file()


def test_progress_counts_exactly_the_objects_make_compiles(project: Path) -> None:
    # a header every libllama model file reads, then a source edit (a restamp too): each build's plain progress
    # lines ([done] and make's own line when stderr is not a terminal) count to the number of objects make
    # compiled
    header = project / "vendor" / "llamafile" / "llama.cpp" / "src" / "llama-cparams.h"
    for step in ("header", "source"):
        if step == "header":
            header.touch()
        else:
            edit_host_file(project, 11)
            forktool(project, "refresh", "0001")
        env = dict(os.environ, FORKTOOL_ROOT=str(project))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                          env.get("PYTHONPATH", "")]))
        cp = subprocess.run([sys.executable, "-m", "forktool", "build", "-j", JOBS], env=env, capture_output=True,
                            text=True, check=True)
        counts = [int(m) for m in re.findall(r"^\[(\d+)\] \[...%\] Building (?:C|CXX) object", cp.stderr, re.M)]
        compiled = len(re.findall(r"Building (?:C|CXX) object", cp.stderr))
        assert compiled > 0 and counts == list(range(1, compiled + 1)), (step, counts[:5])
        assert f"{compiled} object(s) recompiled" in cp.stdout + cp.stderr
