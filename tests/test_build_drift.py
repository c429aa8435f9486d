"""Build-file drift from CMake itself: both trees configured, every target's sources compared, include()d ones too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from forktool.sync import buildfiles

pytestmark = pytest.mark.skipif(not shutil.which("cmake") or not shutil.which("cc"), reason="needs cmake and cc")

OLD = {
    # a source generated into the build directory (another path per tree) is the same source in both
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.16)\nproject(demo C)\ninclude(cmake/sources.cmake)\n"
                      "configure_file(src/a.c ${CMAKE_BINARY_DIR}/gen.c COPYONLY)\n"
                      "set_source_files_properties(${CMAKE_BINARY_DIR}/gen.c PROPERTIES GENERATED TRUE)\n"
                      "add_library(llama SHARED src/a.c ${EXTRA_SOURCES} ${CMAKE_BINARY_DIR}/gen.c)\n"
                      "add_library(gone STATIC src/g.c)\n",
    "cmake/sources.cmake": "set(EXTRA_SOURCES src/b.c)\n",
    "src/a.c": "int a(void) { return 1; }\n", "src/b.c": "int b(void) { return 2; }\n",
    "src/g.c": "int g(void) { return 3; }\n",
    "src/CMakeLists.txt": "add_library(llama a.c)\n",  # not configured (no add_subdirectory); the text reading's
}
NEW = {
    **{k: v for k, v in OLD.items() if k != "src/g.c"},
    "CMakeLists.txt": OLD["CMakeLists.txt"].replace("add_library(gone STATIC src/g.c)\n", "add_executable(tool src/t.c)\n"),
    # the added source is named only in the included file: no regex over the CMakeLists.txt sees it
    "cmake/sources.cmake": "set(EXTRA_SOURCES src/b.c)\nlist(APPEND EXTRA_SOURCES src/x.c)\n",
    "src/x.c": "int x(void) { return 4; }\n", "src/t.c": "int main(void) { return 0; }\n",
}


def reader(files: dict[str, str]):
    return lambda rel: files[rel[len("llama.cpp/"):]].encode() if rel[len("llama.cpp/"):] in files else None


def listed(files: dict[str, str]) -> list[str]:
    return sorted(f"llama.cpp/{k}" for k in files)


def test_a_source_added_through_include_is_drift() -> None:
    rows = buildfiles.drift_from_cmake(reader(OLD), reader(NEW), listed(OLD), listed(NEW), "llama.cpp/",
                                       ["-DCMAKE_BUILD_TYPE=Release"])
    assert isinstance(rows, list)
    by = {r["target"]: r for r in rows}
    assert (by["llama"]["added"], by["llama"]["removed"]) == (["src/x.c"], [])
    assert by["gone"]["note"] == "the target is gone in the new upstream" and by["gone"]["removed"] == ["src/g.c"]
    assert by["tool"]["note"] == "a new target in the new upstream" and by["tool"]["added"] == ["src/t.c"]
    assert all(r["from"] == "CMake (both trees configured)" for r in rows if not r["not_checked"])
    # the profiles' targets whose CMake file neither tree has are not checked, never unchanged (docs/sync.md)
    assert {r["target"]: r["not_checked"] for r in rows if r["not_checked"]} == {
        t: f"neither upstream has {cmake}" for t, cmake, *_ in buildfiles.CMAKE_TARGETS if t != "llama"}
    # the regex reading of the same text cannot see it (what the CMake reading replaces)
    assert "x.c" not in buildfiles.cmake_sources(NEW["CMakeLists.txt"].encode(), "llama", "", listed(NEW))


def test_a_tree_that_does_not_configure_falls_back_and_says_so() -> None:
    broken = {**NEW, "cmake/sources.cmake": "message(FATAL_ERROR \"no such option\")\n"}
    why = buildfiles.drift_from_cmake(reader(OLD), reader(broken), listed(OLD), listed(broken), "llama.cpp/", [])
    assert isinstance(why, str) and why.startswith("the new upstream does not configure") and "no such option" in why
    rows = buildfiles.drift(["-DX=1"], reader(OLD), reader(broken), listed(OLD), listed(broken), "llama.cpp/")
    assert [r["target"] for r in rows if not r["not_checked"]] == ["llama"]
    assert rows[0]["from"].startswith("the CMake text (the new upstream does not configure")


def test_configured_sources_of_one_tree(tmp_path: Path) -> None:
    for rel, text in OLD.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text)
    got = buildfiles.configured_sources(tmp_path / "src", tmp_path / "b", [])
    assert got == {"llama": {"src/a.c", "src/b.c", "<build>/gen.c"}, "gone": {"src/g.c"}}
    assert buildfiles.configured_sources(tmp_path, tmp_path / "b2", []) == "no top-level CMakeLists.txt"


def test_unity_files_are_not_sources_and_a_target_the_flags_do_not_build_is_read_from_its_text(tmp_path: Path) -> None:
    # a unity build's batch files live in the build directory and follow the batch size, not upstream's changes
    for rel, text in OLD.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text)
    unity = buildfiles.configured_sources(tmp_path / "src", tmp_path / "b", ["-DCMAKE_UNITY_BUILD=ON"])
    assert unity == {"llama": {"src/a.c", "src/b.c", "<build>/gen.c"}, "gone": {"src/g.c"}}
    # ggml-cuda's CMakeLists.txt is not configured under these flags (no add_subdirectory: the cpu profile's case):
    # its sources are compared from the CMake text, and the row says how
    cuda = "ggml/src/ggml-cuda/CMakeLists.txt"
    old = {**OLD, cuda: 'file(GLOB SRCS "*.cu")\nadd_library(ggml-cuda ${SRCS})\n', "ggml/src/ggml-cuda/a.cu": "",
           "ggml/src/ggml-cuda/gone.cu": ""}
    new = {**NEW, cuda: old[cuda], "ggml/src/ggml-cuda/a.cu": "", "ggml/src/ggml-cuda/new.cu": ""}
    rows = buildfiles.drift_from_cmake(reader(old), reader(new), listed(old), listed(new), "llama.cpp/", [])
    assert isinstance(rows, list)
    [row] = [r for r in rows if r["target"] == "ggml-cuda"]
    assert (row["added"], row["removed"]) == (["new.cu"], ["gone.cu"])
    assert row["from"].startswith("the CMake text (the flags the trial configured with do not build this target")


def test_a_profile_target_built_under_another_name_is_not_called_unbuilt() -> None:
    # upstream renamed `common` to `llama-common`: CMake configures it (its row compares the sources), so the
    # CMake text of common/CMakeLists.txt is not read again as a target "the flags do not build"
    top = "cmake_minimum_required(VERSION 3.16)\nproject(demo C)\nadd_subdirectory(common)\n"
    old = {"CMakeLists.txt": top, "common/CMakeLists.txt": "add_library(llama-common STATIC arg.c)\n",
           "common/arg.c": "int a(void) { return 1; }\n"}
    new = {**old, "common/CMakeLists.txt": "add_library(llama-common STATIC arg.c json.c)\n",
           "common/json.c": "int j(void) { return 2; }\n"}
    rows = buildfiles.drift_from_cmake(reader(old), reader(new), listed(old), listed(new), "llama.cpp/", [])
    assert isinstance(rows, list)
    assert [(r["target"], r["added"], r["from"]) for r in rows if not r["not_checked"]] == [
        ("llama-common", ["common/json.c"], "CMake (both trees configured)")]
    assert "common" not in {r["target"] for r in rows}
