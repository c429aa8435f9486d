"""The scoped compile check on small real CMake trees: which units a touched file feeds, errors quoted at their
cause, and the cuda plumbing (nvcc, the cuBLAS wheel, the libcuda stand-in) on a machine without a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from forktool import build as b
from forktool.build import check, cmakeapi, cuda, diagnose
from forktool.errors import ForktoolError
from forktool.project import Project
from forktool.tree import sha256_file
from tests.helpers.build import CMAKE as BUILD_CMAKE
from tests.helpers.build import CUDA_BUILD_YAML, CUDA_CMAKE, tiny_project
from tests.helpers.cli import tool_that_dies

needs_cmake = pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("make") and shutil.which("cc")),
                                 reason="needs cmake, make and a C compiler")

CMAKE = """\
cmake_minimum_required(VERSION 3.16)
project(demo C)
add_library(demo SHARED src/a.c src/b.c)
target_include_directories(demo PRIVATE include)
add_executable(demo-cli tools/main.c)
target_include_directories(demo-cli PRIVATE include)
target_link_libraries(demo-cli demo)
add_executable(other tools/other.c)
target_include_directories(other PRIVATE include)
"""

FILES = {
    "include/common.h": '#include "deep/inner.h"\n#define ONE INNER\n',
    "include/deep/inner.h": "#define INNER 1\n",
    "include/lone.h": "#define LONE 2\n",
    "src/a.c": '#include "common.h"\nint a(void) { return ONE; }\n',
    "src/b.c": "#include <lone.h>\nint b(void) { return LONE; }\n",
    "tools/main.c": "int a(void);\nint b(void);\nint main(void) { return a() + b(); }\n",
    "tools/other.c": '#include "common.h"\nint main(void) { return ONE; }\n',  # a target the profile does not build
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    return tiny_project(tmp_path, CMAKE, FILES)


def run_check(project: Project, paths: list[str], profile: str = "tiny") -> check.CheckResult:
    cfg = b.load_config(project)
    plan = b.make_plan(project, cfg, cfg.profile(profile), [], [])
    return check.compile_units(project, cfg, plan, paths, 2)


def objects_under(bdir: Path) -> set[str]:
    return {p.relative_to(bdir).as_posix() for p in bdir.rglob("*.o")}


@needs_cmake
def test_only_the_units_a_header_reaches_are_compiled(project: Project) -> None:
    bdir = project.root / "build" / "tiny"
    # inner.h reaches a.c through common.h (a quoted include found through the target's -I); other.c includes it
    # too, but the profile does not build `other` (CMake's codemodel says what demo-cli needs)
    res = run_check(project, ["llama.cpp/include/deep/inner.h"])
    assert res.ok and res.units == ["llama.cpp/src/a.c"]
    assert "other" in cmakeapi.targets(bdir) and cmakeapi.closure(cmakeapi.targets(bdir), ["demo-cli"]) == {
        "demo-cli", "demo"}
    assert objects_under(bdir) == {"CMakeFiles/demo.dir/src/a.c.o"} and len(res.compiled) == 1
    # an angle include through -I; a source file feeds itself; a file nothing includes feeds nothing
    res = run_check(project, ["llama.cpp/include/lone.h", "llama.cpp/tools/main.c", "llama.cpp/README.md"])
    assert res.units == ["llama.cpp/src/b.c", "llama.cpp/tools/main.c"]
    assert len(res.compiled) == 2
    # make's own up-to-date check: the same units again compile nothing
    again = run_check(project, ["llama.cpp/include/lone.h", "llama.cpp/tools/main.c"])
    assert again.ok and again.compiled == [] and len(again.units) == 2
    assert "2 translation unit(s)" in again.describe() and "0 recompiled" in again.describe()


@needs_cmake
def test_a_check_that_compiles_nothing_is_not_compiled_never_ok(project: Project) -> None:
    # files that feed no unit the profile builds (a README; other.c, whose target the profile does not build)
    for paths in (["llama.cpp/README.md"], ["llama.cpp/tools/other.c"], []):
        res = run_check(project, paths)
        assert not res.ok and res.status == check.NOT_COMPILED and res.units == [] and res.compiled == []
        assert res.describe() == "tiny: not compiled (the files checked feed none of its translation units)"
    assert objects_under(project.root / "build" / "tiny") == set()


@needs_cmake
def test_a_compile_error_is_quoted_at_its_cause_and_nothing_else_changes(project: Project) -> None:
    src = project.tree / "llama.cpp"
    ok = run_check(project, ["llama.cpp/src/a.c", "llama.cpp/src/b.c"])
    bdir = project.root / "build" / "tiny"
    a_obj = bdir / "CMakeFiles/demo.dir/src/a.c.o"
    before = sha256_file(a_obj)
    assert ok.ok
    time.sleep(0.01)
    (src / "include" / "lone.h").write_text("#define LONE 2 +\n")  # b.c breaks, at b.c's line 2
    res = run_check(project, ["llama.cpp/include/lone.h"])
    assert res.status == "failed" and res.failed == ["llama.cpp/src/b.c"]
    assert res.cause is not None and res.cause.file == str(src / "src" / "b.c") and res.cause.line == 2
    assert "error" in res.cause.text and res.cause.text in res.describe()
    # an upstream file no patch changes: the hint does not send the maintainer to refresh a patch
    assert "no patch changes" in res.hint and "refresh" not in res.hint.split(":")[0]
    assert "expected" in Path(res.log).read_text()
    assert sha256_file(a_obj) == before


@needs_cmake
def test_a_check_after_one_cut_short_compiles_the_objects_that_run_left_again(project: Project) -> None:
    # the helper's report on a move to 0.3.33: Ctrl-C during a check, a compile the compiler cache's server ran on
    # wrote its object after the source was broken, make took that object for up to date and the next check said
    # "compiled". The check's RUNNING marker makes the next one compile again what the cut-short one wrote
    src = project.tree / "llama.cpp"
    bdir = project.root / "build" / "tiny"
    assert run_check(project, ["llama.cpp/src/b.c"]).ok and not (bdir / b.RUNNING).exists()
    b_obj = bdir / "CMakeFiles/demo.dir/src/b.c.o"
    stale = b_obj.read_bytes()
    (bdir / b.RUNNING).write_text("a check that was cut short\n")
    time.sleep(0.01)
    (src / "src" / "b.c").write_text("#include <lone.h>\nint b(void) { return LONE; }\nthis is a syntax error;\n")
    b_obj.write_bytes(stale)  # the orphan compile lands after the edit, newer than the broken source
    res = run_check(project, ["llama.cpp/src/b.c"])
    assert res.status == "failed" and res.failed == ["llama.cpp/src/b.c"] and res.cause is not None
    assert res.cause.file == str(src / "src" / "b.c") and res.cause.line == 3
    assert not (bdir / b.RUNNING).exists()  # that make ran to its end


@needs_cmake
def test_an_object_planted_or_touched_in_the_build_directory_is_compiled_again(project: Project) -> None:
    # make takes an object newer than its source for up to date: an object planted (other bytes) or touched after
    # the source broke made the check say compiled without compiling the source
    src = project.tree / "llama.cpp"
    bdir = project.root / "build" / "tiny"
    good = (src / "src" / "b.c").read_text()
    broken = good + "this is a syntax error;\n"
    b_obj = bdir / "CMakeFiles/demo.dir/src/b.c.o"
    assert run_check(project, ["llama.cpp/src/b.c"]).ok
    again = run_check(project, ["llama.cpp/src/b.c"])
    assert again.ok and again.compiled == [] and again.distrusted == 0  # the object the last check saw made
    assert "1 up to date by make's timestamps" in again.describe()
    (src / "src" / "b.c").write_text(broken)
    time.sleep(0.01)
    b_obj.write_bytes(b"planted")  # newer than the broken source, other bytes
    res = run_check(project, ["llama.cpp/src/b.c"])
    assert res.status == "failed" and res.failed == ["llama.cpp/src/b.c"] and res.distrusted == 1
    (src / "src" / "b.c").write_text(good)
    assert run_check(project, ["llama.cpp/src/b.c"]).ok
    (src / "src" / "b.c").write_text(broken)
    time.sleep(0.01)
    os.utime(b_obj)  # touched: the same bytes, newer than the broken source
    res = run_check(project, ["llama.cpp/src/b.c"])
    assert res.status == "failed" and res.failed == ["llama.cpp/src/b.c"] and res.distrusted == 1
    # forged to the recorded stat: other bytes written in place (same size, same inode) and the recorded mtime put
    # back, over a broken source given an older mtime; only the kernel's ctime tells it from the object the check
    # saw made, and without it make took the forged object for up to date and the check said compiled
    (src / "src" / "b.c").write_text(good)
    assert run_check(project, ["llama.cpp/src/b.c"]).ok
    made = b_obj.stat()
    (src / "src" / "b.c").write_text(broken)
    os.utime(src / "src" / "b.c", ns=(made.st_mtime_ns - 10**9, made.st_mtime_ns - 10**9))
    time.sleep(0.02)
    with open(b_obj, "r+b") as f:
        data = bytearray(f.read())
        data[-1] ^= 0xFF
        f.seek(0)
        f.write(data)
    os.utime(b_obj, ns=(made.st_atime_ns, made.st_mtime_ns))
    now = b_obj.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (made.st_size, made.st_mtime_ns, made.st_ino)
    assert now.st_ctime_ns != made.st_ctime_ns
    res = run_check(project, ["llama.cpp/src/b.c"])
    assert res.status == "failed" and res.failed == ["llama.cpp/src/b.c"] and res.distrusted == 1


@needs_cmake
def test_the_objects_a_build_compiled_are_not_compiled_again_by_the_next_check(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # what make compiled in `forktool build` was made by the compilers the cache names: the check trusts those
    # objects (and only those) as it trusts its own
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    project = tiny_project(tmp_path, BUILD_CMAKE, {"src/a.c": "int a(void) { return 1; }\n",
                                                   "src/b.c": "int b(void) { return 2; }\n",
                                                   "tools/main.c": "int main(void) { return 0; }\n"})
    cfg = b.load_config(project)
    b.run_build(project, cfg, b.make_plan(project, cfg, cfg.profile("tiny"), [], []), 2)
    res = run_check(project, ["llama.cpp/src/a.c", "llama.cpp/src/b.c"])
    assert res.ok and res.compiled == [] and res.distrusted == 0, res.describe()
    os.utime(project.root / "build" / "tiny" / "CMakeFiles/demo.dir/src/a.c.o")
    res = run_check(project, ["llama.cpp/src/a.c", "llama.cpp/src/b.c"])
    assert res.ok and res.compiled == ["CMakeFiles/demo.dir/src/a.c.o"] and res.distrusted == 1


@needs_cmake
def test_a_check_whose_make_a_signal_ends_keeps_its_marker(project: Project, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # a make killed (an OOM kill) did not run to its end: compiles it started may still land objects, so the marker
    # stays and the next check compiles again what was written since; before, the check removed it as after any make
    bdir = project.root / "build" / "tiny"
    assert run_check(project, ["llama.cpp/src/b.c"]).ok
    tool_that_dies(tmp_path / "bin", monkeypatch, "make", '*" -k "*', "KILL")
    res = run_check(project, ["llama.cpp/src/b.c"])
    assert res.status == "failed" and not res.ok and (bdir / b.RUNNING).exists()
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
    assert run_check(project, ["llama.cpp/src/b.c"]).ok and not (bdir / b.RUNNING).exists()


@needs_cmake
def test_the_check_goes_through_the_compiler_cache(tmp_path: Path, sccache: str) -> None:  # noqa: F811
    project = tiny_project(tmp_path, CMAKE, FILES)
    cold = run_check(project, ["llama.cpp/include/lone.h"])
    assert cold.ok and cold.units == ["llama.cpp/src/b.c"] and "1 miss(es)" in cold.cache
    (project.root / "build" / "tiny" / "CMakeFiles" / "demo.dir" / "src" / "b.c.o").unlink()
    warm = run_check(project, ["llama.cpp/include/lone.h"])
    assert warm.ok and len(warm.compiled) == 1 and "1 hit(s), 0 miss(es)" in warm.cache
    assert warm.cache in warm.describe()


def test_first_error_is_the_cause_in_each_tool_s_format() -> None:
    log = ["[ 10%] Building CUDA object ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/ggml-cuda.cu.o",
           "/v/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu(4321): error: identifier \"ggml_cuda_x\" is undefined",
           "/v/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu(4400): error: too few arguments",
           "2 errors detected in the compilation of \"ggml-cuda.cu\".",
           "make[2]: *** [ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/build.make:90: x.o] Error 2",
           "make: *** [Makefile:137: all] Error 2"]
    cause = diagnose.first_error(log)
    assert cause is not None and cause.line == 4321 and cause.file.endswith("ggml-cuda.cu")
    assert cause.where == "/v/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:4321"
    gcc = ["In file included from /v/a.cpp:3:", "/v/a.h:12:5: error: invalid conversion from 'size_t (*)()'",
           "/v/a.cpp:40:1: error: later cascade"]
    assert diagnose.first_error(gcc) == diagnose.Cause(gcc[1], "/v/a.h", 12)
    cmake = ["-- Found CUDAToolkit", "CMake Error at ggml/src/ggml-cuda/CMakeLists.txt:178 (target_link_libraries):",
             "  Target \"ggml-cuda\" links to:", "", "    CUDA::cublas", "", "  but the target was not found.  "
             "Possible reasons include:", "", "-- Configuring incomplete, errors occurred!"]
    cause = diagnose.first_error(cmake)
    assert cause is not None and (cause.file, cause.line) == ("ggml/src/ggml-cuda/CMakeLists.txt", 178)
    assert "CUDA::cublas" in cause.text and "Configuring incomplete" not in cause.text
    assert diagnose.first_error(["make: *** [all] Error 2"]) is None and diagnose.first_error([]) is None
    # a configure step's relayed "npm error" (CMake goes on without the web UI) is not the compile's error, and an
    # error naming its file and line wins over an earlier one that names none, in a log and in a stream alike
    ui = ["--   stderr: npm error code ERESOLVE", "CMake Warning at scripts/ui-assets.cmake:584 (message):",
          "  UI: npm install failed (1)", "ld: some tool error without a place",
          "[ 40%] Building CXX object src/CMakeFiles/llama.dir/llama-context.cpp.o",
          "/v/src/llama-context.cpp:216:13: error: 'struct llama_cparams' has no member named 'kv_residency_mode'",
          "make: *** [Makefile:137: all] Error 2"]
    assert diagnose.first_error(ui) == diagnose.Cause(ui[5], "/v/src/llama-context.cpp", 216)
    stream = diagnose.FirstError()
    for line in ui:
        stream.feed(line)
    assert stream.cause == diagnose.Cause(ui[5], "/v/src/llama-context.cpp", 216)
    alone = diagnose.FirstError()
    alone.feed(ui[3])
    assert alone.cause == diagnose.Cause(ui[3], "", 0)  # none names a place: the first real one
    # the patch that changes the failing file is the one to fix
    hint = diagnose.compile_hint(diagnose.Cause("x", "/v/llama.cpp/a.h", 1), "/v",
                                 [("0070", ["llama.cpp/b.h"]), ("0073", ["llama.cpp/a.h"])])
    assert "`forktool refresh 0073`" in hint


def test_the_record_answers_only_for_the_same_series_tree_rules_and_compilers(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    project = Project(tmp_path)
    both = {"cpu": "r1", "cuda": "r2"}
    assert check.status_for(project, both, "s1", "t1") == {"cpu": "not compiled", "cuda": "not compiled"}
    cc, nvcc = tmp_path / "cc", tmp_path / "nvcc"
    for exe in (cc, nvcc):
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    monkeypatch.setenv("CUDACXX", str(nvcc))
    comps = {"C": {"path": str(cc), "version": "1", "identity": check._identity(str(cc)), "parts": {}}}
    check.record(project, check.CheckResult("cpu", "compiled", series_digest="s1", tree_digest="t1", config="r1",
                                            compilers=comps), 5)
    check.record(project, check.CheckResult("cuda", "failed", series_digest="s1", tree_digest="t1", config="r2",
                                            compilers={**comps, "CUDA": {"path": str(nvcc), "version": "13",
                                                                         "identity": check._identity(str(nvcc)),
                                                                         "parts": {}}}), 5)
    assert check.status_for(project, both, "s1", "t1") == {"cpu": "compiled", "cuda": "failed"}
    assert check.status_for(project, both, "s2", "t1") == {"cpu": "not compiled", "cuda": "not compiled"}
    assert check.status_for(project, {"cpu": "r1"}, "s1", "t2") == {"cpu": "not compiled"}
    assert check.status_for(project, {"cpu": "r3"}, "s1", "t1") == {"cpu": "not compiled"}  # other build rules
    # $CUDACXX names another nvcc: the next build configures with that one (-DCMAKE_CUDA_COMPILER)
    other = tmp_path / "other-nvcc"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("CUDACXX", str(other))
    assert check.judge(project, both, "s1", "t1") == {"cpu": ("compiled", ""), "cuda": (
        "not compiled", f"the next build compiles CUDA with {other} ($CUDACXX, else PATH), the check compiled with "
        f"{nvcc}")}
    # a compiler recorded without its parts (an earlier forktool looked for none) vouches for no cc1 or ptxas
    check.record(project, check.CheckResult("cpu", "compiled", series_digest="s1", tree_digest="t1", config="r1",
                                            compilers={"C": {k: v for k, v in comps["C"].items() if k != "parts"}}),
                 5)
    assert check.judge(project, {"cpu": "r1"}, "s1", "t1")["cpu"] == (
        "not compiled", "the record does not name the C compiler's parts (made by an earlier forktool)")
    # a record that names no compiler (an earlier forktool's) vouches for none
    check.record(project, check.CheckResult("cpu", "compiled", series_digest="s1", tree_digest="t1", config="r1"), 5)
    assert check.judge(project, {"cpu": "r1"}, "s1", "t1")["cpu"][0] == "not compiled"
    # a record of the format before build rules were recorded says so, not that the rules differ
    recs = json.loads((project.state_dir / check.RECORD).read_text())
    del recs["cpu"]["rules"]
    (project.state_dir / check.RECORD).write_text(json.dumps(recs))
    assert check.judge(project, {"cpu": "r1"}, "s1", "t1")["cpu"] == (
        "not compiled", "the record names neither the build rules nor the compilers it compiled with (made by an "
        "earlier forktool)")
    (project.state_dir / check.RECORD).write_text("{broken")
    assert check.status_for(project, {"cpu": "r1"}, "s1", "t1") == {"cpu": "not compiled"}


KERNEL = """\
#include <cublas_v2.h>
#include <cuda.h>
#include "k.h"
__global__ void scale(float *x, float k) { x[threadIdx.x] *= k; }
int use_blas(void) { cublasHandle_t h; return (int)cublasCreate(&h) + (int)cuInit(0) + K; }
"""


@needs_cmake
@pytest.mark.skipif(cuda.find_nvcc() is None, reason="needs nvcc")
def test_a_cuda_tree_configures_and_compiles_without_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        tk = cuda.find_toolkit()
    except ForktoolError as e:
        pytest.skip(f"no cuBLAS: {e.what}")
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    project = tiny_project(tmp_path, CUDA_CMAKE, {"src/k.cu": KERNEL, "src/k.h": "#define K 1\n"})
    (project.registry_dir / "build.yaml").write_text(CUDA_BUILD_YAML)
    flags = b.configure_flags(b.load_config(project).profile("gpu"), project.root / "build" / "gpu")
    if tk.cublas is not None:  # the toolkit lacks cuBLAS: the wheel's is named, headers included
        assert f"-DCUDA_cublas_LIBRARY={tk.cublas}" in flags and any("STANDARD_INCLUDE" in f for f in flags)
    res = run_check(project, ["llama.cpp/src/k.h"], "gpu")
    assert res.ok, res.describe()
    assert res.units == ["llama.cpp/src/k.cu"] and res.compiled == ["CMakeFiles/kern.dir/src/k.cu.o"]
    if tk.driver is None:  # no driver on this machine: the stand-in was made, with the driver's soname
        stub = project.root / "build" / "gpu" / cuda.STUB_DIR / "libcuda.so"
        assert b"libcuda.so.1" in stub.read_bytes()
        # the library linked here asks for the driver by soname, not for the stand-in's path
        bdir = project.root / "build" / "gpu"
        subprocess.run(["make", "kern"], cwd=bdir, check=True, capture_output=True)
        needed = subprocess.run(["readelf", "-d", str(bdir / "libkern.so")], check=True, capture_output=True,
                                text=True).stdout
        needed = "\n".join(ln for ln in needed.splitlines() if "(NEEDED)" in ln)
        assert "[libcuda.so.1]" in needed and cuda.STUB_DIR not in needed
    # an error in device code is quoted at nvcc's FILE(LINE)
    (project.tree / "llama.cpp" / "src" / "k.h").write_text("#define K undeclared_thing\n")
    bad = run_check(project, ["llama.cpp/src/k.h"], "gpu")
    assert bad.status == "failed" and bad.cause is not None
    assert bad.cause.file.endswith("k.cu") and bad.cause.line == 5 and "undeclared_thing" in bad.cause.text
    assert os.path.isfile(bad.log)


@needs_cmake
@pytest.mark.skipif(cuda.find_nvcc() is None, reason="needs nvcc")
def test_another_cudacxx_configures_afresh_and_the_record_of_the_old_nvcc_no_longer_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CMake reads $CUDACXX only at a first configure: a build directory kept its first nvcc whatever $CUDACXX said
    # later, and a record named no compiler, so verify could not tell
    real = cuda.find_nvcc()
    try:
        cuda.find_toolkit()
    except ForktoolError as e:
        pytest.skip(f"no cuBLAS: {e.what}")
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    monkeypatch.setenv("CUDA_PATH", str(cuda.toolkit_root(real or "")))  # the wrappers' toolkit
    wrappers = []
    for name in ("one", "two"):
        w = tmp_path / name / "nvcc"
        w.parent.mkdir()
        w.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
        w.chmod(0o755)
        wrappers.append(w)
    project = tiny_project(tmp_path / "p", CUDA_CMAKE, {"src/k.cu": KERNEL, "src/k.h": "#define K 1\n"})
    (project.registry_dir / "build.yaml").write_text(CUDA_BUILD_YAML)
    monkeypatch.setenv("CUDACXX", str(wrappers[0]))
    first = run_check(project, ["llama.cpp/src/k.h"], "gpu")
    assert first.ok and first.compilers["CUDA"]["path"] == str(wrappers[0]), first.describe()
    assert check.compilers_changed(first.compilers) == ""
    monkeypatch.setenv("CUDACXX", str(wrappers[1]))
    assert check.compilers_changed(first.compilers) == (
        f"the next build compiles CUDA with {wrappers[1]} ($CUDACXX, else PATH), the check compiled with {wrappers[0]}")
    cfg = b.load_config(project)
    assert b.make_plan(project, cfg, cfg.profile("gpu"), [], []).configure_reason == b.CUDA_COMPILER_CHANGED
    second = run_check(project, ["llama.cpp/src/k.h"], "gpu")
    assert second.ok and second.compilers["CUDA"]["path"] == str(wrappers[1])
    assert second.compiled == ["CMakeFiles/kern.dir/src/k.cu.o"]  # by the new nvcc (--fresh removed CMakeFiles/)
    assert b.make_plan(project, cfg, cfg.profile("gpu"), [], []).configure_reason not in b.FRESH  # no build yet
    assert check.compilers_changed(second.compilers) == ""


GEN_CMAKE = """\
cmake_minimum_required(VERSION 3.16)
project(demo C)
add_custom_target(gen-header COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_SOURCE_DIR}/include/gen.h.in
                  ${CMAKE_BINARY_DIR}/gen/gen.h)
add_library(demo SHARED src/a.c)
add_dependencies(demo gen-header)
target_include_directories(demo PRIVATE ${CMAKE_BINARY_DIR}/gen include)
add_executable(demo-cli tools/main.c)
target_link_libraries(demo-cli demo)
"""


@needs_cmake
def test_headers_a_custom_target_writes_are_made_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    project = tiny_project(tmp_path, GEN_CMAKE, {
        "include/gen.h.in": "#define GEN 5\n", "include/lone.h": "#define LONE 2\n",
        "src/a.c": '#include "gen.h"\n#include "lone.h"\nint a(void) { return GEN + LONE; }\n',
        "tools/main.c": "int a(void);\nint main(void) { return a(); }\n"})
    res = run_check(project, ["llama.cpp/include/lone.h"])
    assert res.ok, res.describe()
    assert res.units == ["llama.cpp/src/a.c"] and (project.root / "build" / "tiny" / "gen" / "gen.h").is_file()


TOOL_CMAKE = """\
cmake_minimum_required(VERSION 3.16)
project(demo C)
add_executable(embed-tool tools/embed.c)
add_custom_target(gen-header COMMAND embed-tool ${CMAKE_BINARY_DIR}/gen/gen.h)
add_dependencies(gen-header embed-tool)
add_library(demo SHARED src/a.c)
add_dependencies(demo gen-header)
target_include_directories(demo PRIVATE ${CMAKE_BINARY_DIR}/gen include)
"""


@needs_cmake
def test_a_program_a_custom_target_runs_is_built_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """0.3.35's web UI: the target writing ui.h runs llama-ui-embed, an executable of the same build."""
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    project = tiny_project(tmp_path, TOOL_CMAKE, {
        "include/lone.h": "#define LONE 2\n",
        "tools/embed.c": '#include <stdio.h>\nint main(int c, char **v) { FILE *f; (void) c;\n'
                         '  if (!(f = fopen(v[1], "w"))) return 1; fputs("#define GEN 5\\n", f); return fclose(f); }\n',
        "src/a.c": '#include "gen.h"\n#include "lone.h"\nint a(void) { return GEN + LONE; }\n'})
    (project.root / "build" / "tiny" / "gen").mkdir(parents=True)
    res = run_check(project, ["llama.cpp/include/lone.h"])
    assert res.ok, res.describe()
    assert res.units == ["llama.cpp/src/a.c"]
    assert (project.root / "build" / "tiny" / "gen" / "gen.h").read_text() == "#define GEN 5\n"


def test_verify_reads_compile_records_without_loading_shutil() -> None:
    # verify imports this module for the records: shutil at its top brought bz2 and lzma, 1.8 ms of every verify
    import sys

    code = "import sys, forktool.build.check; print('shutil' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_the_compiler_version_comes_from_the_newest_cmake_directory_not_the_last_by_name(tmp_path: Path):
    """After a CMake upgrade a build directory holds one CMakeFiles/VERSION/ per CMake that configured it; the
    version recorded is the newest configure's ("3.9.0" sorts after "3.28.1" by name)."""
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\n")
    (tmp_path / "CMakeCache.txt").write_text(f"CMAKE_C_COMPILER:FILEPATH={cc}\n")
    for i, (ver, gcc) in enumerate((("3.28.1", "12.2.0"), ("3.9.0", "10.1.0"))):
        d = tmp_path / "CMakeFiles" / ver
        d.mkdir(parents=True)
        f = d / "CMakeCCompiler.cmake"
        f.write_text(f'set(CMAKE_C_COMPILER_VERSION "{gcc}")\n')
        os.utime(f, ns=(10**18 - i * 10**9, 10**18 - i * 10**9))  # 3.28.1's written last
    assert check.compilers(tmp_path)["C"]["version"] == "12.2.0"


def _driver(path: Path, answers: dict[str, str], body: str = "") -> Path:
    """A stand-in C/C++ driver: answers `-print-prog-name=NAME` from answers (GCC's way: a path, or the bare name)."""
    cases = "".join(f'  -print-prog-name={n}) echo "{a}" ;;\n' for n, a in answers.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\n{body}case "$1" in\n{cases}  *) exit 1 ;;\nesac\n')
    path.chmod(0o755)
    return path


def _replace(path: Path, text: str) -> None:
    """Install another file at path, as a package upgrade does (a new inode)."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


def test_a_compiler_s_parts_are_recorded_and_a_changed_or_gone_one_no_longer_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver may stay the same file while cc1plus under it is replaced (a gcc package update): the record names
    the parts the driver runs, and verify's stat of each sees the new file, or none (running nothing)."""
    cc1plus = tmp_path / "libexec" / "cc1plus"
    cc1plus.parent.mkdir()
    cc1plus.write_text("the compiler proper\n")
    gxx = _driver(tmp_path / "bin" / "g++", {"cc1plus": str(cc1plus), "as": "as"})
    bdir = tmp_path / "build"
    bdir.mkdir()
    (bdir / "CMakeCache.txt").write_text(f"CMAKE_CXX_COMPILER:FILEPATH={gxx}\n")
    comps = check.compilers(bdir)
    parts = comps["CXX"]["parts"]
    assert parts["cc1plus"] == {"path": str(cc1plus), "identity": check._identity(str(cc1plus))}
    real_as = shutil.which("as")  # a bare `as` is the one PATH gives
    assert parts.get("as", {}).get("path") == real_as
    assert check.compilers_changed(comps) == ""
    # objects a check saw made with these compilers are trusted by the next check with the same ones
    (bdir / "a.o").write_bytes(b"object")
    check._note_made(bdir, comps, {}, ["a.o"], [])
    assert check._seen_objects(bdir, check.compilers(bdir)) == {"a.o": check._object_identity(str(bdir / "a.o"))}

    _replace(cc1plus, "the compiler proper\n")  # same bytes, same size: another file all the same
    with monkeypatch.context() as m:  # verify's side: stats only
        m.setattr(subprocess, "Popen", None)
        assert check.compilers_changed(comps) == (
            f"the CXX compiler's cc1plus changed since the check: {cc1plus} is another file now")
    assert check._seen_objects(bdir, check.compilers(bdir)) == {}  # made by the old cc1plus: not trusted
    cc1plus.unlink()
    assert check.compilers_changed(comps) == f"the CXX compiler's cc1plus is gone: {cc1plus}"
    # the driver itself is still checked first
    _replace(gxx, gxx.read_text())
    assert check.compilers_changed(comps) == f"the CXX compiler changed since the check: {gxx} is another file now"


def test_a_driver_that_names_no_part_fails_or_hangs_gives_an_empty_parts_record(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch):
    """clang answers a bare cc1plus (it compiles itself): nothing to record; a driver that fails, cannot run or does
    not answer in time gives no parts and no error, and the record still says parts were looked for."""
    monkeypatch.setattr(check, "PART_TIMEOUT", 0.5)
    drivers = {
        "bare": _driver(tmp_path / "bare" / "clang++", {"cc1plus": "cc1plus", "as": "no-such-assembler-here"}),
        "fails": _driver(tmp_path / "fails" / "c++", {}),
        "hangs": _driver(tmp_path / "hangs" / "c++", {"cc1plus": str(tmp_path)}, body="exec sleep 30\n"),
    }
    noexec = tmp_path / "noexec" / "c++"
    noexec.parent.mkdir()
    noexec.write_text("not a program\n")
    drivers["noexec"] = noexec
    for why, drv in drivers.items():
        bdir = tmp_path / f"build-{why}"
        bdir.mkdir()
        (bdir / "CMakeCache.txt").write_text(f"CMAKE_CXX_COMPILER:FILEPATH={drv}\n")
        t0 = time.monotonic()
        comps = check.compilers(bdir)
        assert time.monotonic() - t0 < 5, why
        assert comps["CXX"]["parts"] == {}, why
        assert check.compilers_changed(comps) == "", why


@pytest.mark.skipif(not (shutil.which("g++") and shutil.which("gcc")), reason="needs gcc and g++")
def test_the_real_gcc_s_cc1_cc1plus_and_as_are_recorded(tmp_path: Path) -> None:
    gcc, gxx = shutil.which("gcc"), shutil.which("g++")
    if "Free Software Foundation" not in subprocess.run([str(gxx), "--version"], capture_output=True,
                                                        text=True).stdout:
        pytest.skip("g++ is not GCC here")
    (tmp_path / "CMakeCache.txt").write_text(f"CMAKE_C_COMPILER:FILEPATH={gcc}\nCMAKE_CXX_COMPILER:FILEPATH={gxx}\n")
    comps = check.compilers(tmp_path)
    for lang, proper in (("C", "cc1"), ("CXX", "cc1plus")):
        part = comps[lang]["parts"][proper]
        assert os.path.isabs(part["path"]) and os.path.basename(part["path"]) == proper
        assert os.path.isfile(part["path"]) and part["identity"] == check._identity(part["path"])
        assert os.path.isfile(comps[lang]["parts"]["as"]["path"])
        # the file the driver runs, not a guess: it compiles with it
        assert part["path"] == subprocess.run([str(gxx if lang == "CXX" else gcc), f"-print-prog-name={proper}"],
                                              capture_output=True, text=True).stdout.strip()
    assert check.compilers_changed(comps) == ""


def _toolkit(root: Path, names: tuple[str, ...] = ("nvcc", "ptxas", "fatbinary", "nvlink")) -> Path:
    for name in names:
        f = root / "bin" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"{name}\n")
        f.chmod(0o755)
    cicc = root / "nvvm" / "bin" / "cicc"
    cicc.parent.mkdir(parents=True)
    cicc.write_text("cicc\n")
    return root / "bin" / "nvcc"


def test_nvcc_s_parts_are_its_toolkit_s_and_a_new_ptxas_no_longer_holds(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """nvcc through a symlink: its parts are beside the real nvcc (ptxas, fatbinary, nvlink; cicc in nvvm/bin),
    found without running it; only those that exist are recorded."""
    nvcc = _toolkit(tmp_path / "cuda-13")
    link = tmp_path / "bin" / "nvcc"
    link.parent.mkdir()
    link.symlink_to(nvcc)
    monkeypatch.setenv("CUDACXX", str(link))
    bdir = tmp_path / "build"
    bdir.mkdir()
    (bdir / "CMakeCache.txt").write_text(f"CMAKE_CUDA_COMPILER:FILEPATH={link}\n")
    comps = check.compilers(bdir)
    parts = comps["CUDA"]["parts"]
    assert sorted(parts) == ["cicc", "fatbinary", "nvlink", "ptxas"]  # no cudafe++ in this toolkit
    assert parts["cicc"]["path"] == str(tmp_path / "cuda-13" / "nvvm" / "bin" / "cicc")
    assert check.compilers_changed(comps) == ""
    ptxas = tmp_path / "cuda-13" / "bin" / "ptxas"
    _replace(ptxas, "ptxas\n")
    assert check.compilers_changed(comps) == (
        f"the CUDA compiler's ptxas changed since the check: {ptxas} is another file now")
    ptxas.unlink()
    assert check.compilers_changed(comps) == f"the CUDA compiler's ptxas is gone: {ptxas}"


def test_nvcc_through_a_wrapper_script_records_the_toolkit_s_parts_not_the_wrapper_s_neighbours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/usr/local/bin/nvcc exec'ing a toolkit's nvcc may sit beside other wrappers (/usr/local/bin/ptxas): the nvcc
    that runs is the toolkit's, and so are the parts it runs."""
    nvcc = _toolkit(tmp_path / "cuda-13")
    wrap = _toolkit(tmp_path / "wrappers")  # a ptxas, fatbinary, ... beside the wrapper too
    wrap.write_text(f'#!/bin/sh\nexec {nvcc} "$@"\n')
    monkeypatch.setenv("CUDACXX", str(wrap))
    bdir = tmp_path / "build"
    (bdir / "CMakeFiles" / "3.28.1").mkdir(parents=True)
    (bdir / "CMakeFiles" / "3.28.1" / "CMakeCUDACompiler.cmake").write_text(
        f'set(CMAKE_CUDA_COMPILER_VERSION "13.0.88")\nset(CMAKE_CUDA_COMPILER_TOOLKIT_ROOT "{tmp_path / "cuda-13"}")\n')
    (bdir / "CMakeCache.txt").write_text(f"CMAKE_CUDA_COMPILER:FILEPATH={wrap}\n")
    comps = check.compilers(bdir)
    assert comps["CUDA"]["parts"] == {}
    assert comps["CUDA toolkit"]["path"] == str(nvcc)
    assert sorted(comps["CUDA toolkit"]["parts"]) == ["cicc", "fatbinary", "nvlink", "ptxas"]
    _replace(tmp_path / "wrappers" / "ptxas", "another\n")  # not what nvcc runs
    assert check.compilers_changed(comps) == ""
    cicc = tmp_path / "cuda-13" / "nvvm" / "bin" / "cicc"
    _replace(cicc, "cicc 13.1\n")
    assert check.compilers_changed(comps) == (
        f"the CUDA toolkit's cicc changed since the check: {cicc} is another file now")
