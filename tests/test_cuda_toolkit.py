"""scripts/install-cuda-toolkit.sh (`make cuda-toolkit`): a CUDA toolkit from NVIDIA's PyPI wheels that CMake and
the cuda profile take as they would an installed one; and $CUDACXX naming the nvcc forktool and CMake use."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from forktool import build as b
from forktool.build import check, cuda
from forktool.errors import ConfigError
from forktool.tree import digest, scan
from tests.helpers.build import CUDA_BUILD_YAML, CUDA_CMAKE, tiny_project
from tests.helpers.project import REPO

SCRIPT = REPO / "scripts" / "install-cuda-toolkit.sh"
STAMP = "forktool-cuda-toolkit.txt"


def wheels() -> list[str]:
    """The script's pinned wheels, read from its WHEELS=( ... ) list."""
    block = re.search(r"^WHEELS=\(\n(.*?)^\)", SCRIPT.read_text(), re.S | re.M)
    assert block, "WHEELS=( ... ) not found in the script"
    return block.group(1).split()


def install(prefix: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), str(prefix)], env=dict(os.environ, **env), capture_output=True, text=True)


def test_the_cublas_wheel_is_the_cuda_extras_and_every_wheel_is_pinned() -> None:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cuda"]
    [wanted] = [Requirement(r) for r in extra if r.startswith("nvidia-cublas")]
    pins = {Requirement(w).name: Requirement(w) for w in wheels()}
    for req in pins.values():
        assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", req
    version = next(iter(pins["nvidia-cublas"].specifier)).version
    assert wanted.specifier.contains(version), (version, str(wanted.specifier))
    # what a compile needs: the driver program, its back end, headers, the runtime and cuBLAS
    assert {"nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl",
            "nvidia-cublas"} <= set(pins)


def test_the_make_target_runs_the_script() -> None:
    text = (REPO / "Makefile").read_text()
    rule = text[text.index("\ncuda-toolkit:"):].split("\n\n")[0]
    assert "scripts/install-cuda-toolkit.sh $(CUDA_PREFIX)" in rule
    assert "/.cuda-toolkit/" in (REPO / ".gitignore").read_text().splitlines()


def test_usage_and_a_python_without_pip_are_refused(tmp_path: Path) -> None:
    r = subprocess.run([str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 1 and "usage:" in r.stderr and "PREFIX" in r.stderr
    nopip = tmp_path / "python"
    nopip.write_text("#!/bin/sh\nexit 1\n")
    nopip.chmod(0o755)
    r = install(tmp_path / "cuda", PYTHON=str(nopip))
    assert r.returncode == 1 and f"{nopip} has no pip" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python"]


def test_a_failed_download_keeps_the_old_toolkit_and_leaves_nothing_behind(tmp_path: Path) -> None:
    prefix = tmp_path / "cuda"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    (prefix / "bin" / "nvcc").chmod(0o755)
    (prefix / STAMP).write_text("an older set\n")
    before = digest(scan(prefix))
    # pip with no index and no links: nothing can be downloaded
    r = install(prefix, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "no-wheels"), PIP_CONFIG_FILE=os.devnull)
    assert r.returncode == 1 and "pip could not install the wheels" in r.stderr
    assert digest(scan(prefix)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cuda"]  # no half-made toolkit beside it


def test_a_prefix_holding_the_same_wheels_is_kept(tmp_path: Path) -> None:
    prefix = tmp_path / "cuda"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (prefix / "bin" / "nvcc").chmod(0o755)
    (prefix / STAMP).write_text("\n".join(wheels()) + "\n")
    before = digest(scan(prefix))
    r = install(prefix, PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull)  # a download would fail: none is tried
    assert r.returncode == 0, r.stderr
    assert f"{prefix} already holds these wheels (nvcc 13.0.88)" in r.stdout
    assert digest(scan(prefix)) == before


def test_cudacxx_names_the_only_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere" / "nvcc"
    monkeypatch.setenv("CUDACXX", str(missing))
    assert cuda.find_nvcc() is None  # whatever nvcc PATH or /usr/local/cuda holds does not count
    with pytest.raises(ConfigError) as err:
        cuda.find_toolkit()
    assert f"$CUDACXX names {missing}" in err.value.what and "CUDACXX" in err.value.hint
    # a toolkit directory with its headers: CMake's FindCUDAToolkit is pointed at it
    tk = tmp_path / "tk"
    (tk / "bin").mkdir(parents=True)
    (tk / "include").mkdir()
    (tk / "include" / "cuda_runtime.h").write_text("")
    (tk / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (tk / "bin" / "nvcc").chmod(0o755)
    monkeypatch.setenv("CUDACXX", str(tk / "bin" / "nvcc"))
    assert cuda.find_nvcc() == str(tk / "bin" / "nvcc") and cuda.toolkit_root(cuda.find_nvcc() or "") == tk
    toolkit = cuda.Toolkit(str(tk / "bin" / "nvcc"), tk, None, None, None, tk / "lib" / "libcuda.so")
    assert toolkit.cmake_flags(tmp_path / "build") == [f"-DCUDAToolkit_ROOT={tk}"]


KERNEL = """\
#include <cublas_v2.h>
#include <cub/cub.cuh>
#include "k.h"
__global__ void scale(float *x, float k) { x[threadIdx.x] *= k; }
int use_blas(void) { cublasHandle_t h; return (int)cublasCreate(&h) + K; }
"""


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("make") and shutil.which("cc")),
                    reason="needs cmake, make and a C compiler")
def test_the_wheels_make_a_toolkit_the_cuda_profile_compiles_with(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Downloads about 525 MB of wheels (pip's cache keeps them) and unpacks about 840 MB."""
    prefix = tmp_path / "cuda"
    r = install(prefix)
    if r.returncode != 0 and "pip could not install" in r.stderr:
        pytest.skip(f"PyPI not reachable: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "a kernel with the runtime, CUB and cuBLAS compiled and linked for sm_90" in r.stdout
    for rel in ("bin/nvcc", "bin/ptxas", "bin/fatbinary", "nvvm/bin/cicc", "include/cuda_runtime.h",
                "include/crt/host_defines.h", "include/cccl/cub/cub.cuh", "include/cublas_v2.h",
                "lib/libcudart_static.a", "lib/libcublas.so", "lib/libcublasLt.so", "targets/x86_64-linux/include",
                "lib64/libcudart.so"):
        assert (prefix / rel).exists(), rel
    assert (prefix / STAMP).read_text().split() == wheels()
    assert install(prefix).stdout.startswith(f"cuda toolkit: {prefix} already holds these wheels")

    # the cuda profile takes it through $CUDACXX alone, though this machine may hold another toolkit on PATH
    monkeypatch.setenv("CUDACXX", str(prefix / "bin" / "nvcc"))
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    tk = cuda.find_toolkit()
    assert tk.root == prefix and tk.cublas is None  # its own cuBLAS: no wheel from forktool's Python
    (tmp_path / "proj").mkdir()
    project = tiny_project(tmp_path / "proj", CUDA_CMAKE, {"src/k.cu": KERNEL, "src/k.h": "#define K 1\n"})
    (project.registry_dir / "build.yaml").write_text(CUDA_BUILD_YAML)
    cfg = b.load_config(project)
    plan = b.make_plan(project, cfg, cfg.profile("gpu"), [], [])
    res = check.compile_units(project, cfg, plan, ["llama.cpp/src/k.h"], 2)
    assert res.ok, res.describe()
    assert res.units == ["llama.cpp/src/k.cu"] and res.compiled == ["CMakeFiles/kern.dir/src/k.cu.o"]
    cache = dict(line.split("=", 1) for line in (plan.build_dir / "CMakeCache.txt").read_text().splitlines()
                 if "=" in line and not line.startswith(("//", "#")))
    for key in ("CMAKE_CUDA_COMPILER:FILEPATH", "CUDAToolkit_BIN_DIR:PATH", "CUDA_cudart_LIBRARY:FILEPATH",
                "CUDA_cublas_LIBRARY:FILEPATH"):
        assert cache[key].startswith(str(prefix) + "/"), (key, cache[key])
