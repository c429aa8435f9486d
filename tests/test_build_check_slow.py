"""The real series' scoped cuda check on a machine without a GPU: it compiles, verify says so, and a break in a
patch's CUDA file is quoted at its line with the patch to fix."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_build import REPO, clone_project, forktool  # noqa: E402

from forktool.build import cuda  # noqa: E402
from forktool.errors import ForktoolError  # noqa: E402

pytestmark = pytest.mark.slow
JOBS = os.environ.get("FORKTOOL_TEST_JOBS", "2")
CUDA_FILE = "llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu"  # 0073 changes it


def _toolkit() -> bool:
    try:
        cuda.find_toolkit()
        return True
    except ForktoolError:
        return False


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.environ.get("FORKTOOL_CACHE") or not shutil.which("cmake") or not _toolkit():
        pytest.skip("needs FORKTOOL_CACHE with the pinned upstream, cmake, nvcc and cuBLAS (`make setup`)")
    return clone_project(REPO, tmp_path_factory.mktemp("cudacheck") / "proj")


def test_the_series_compiles_for_cuda_and_verify_says_so(project: Path) -> None:
    before = forktool(project, "verify")
    assert before["compiled"]["cuda"] == "not compiled"
    data = forktool(project, "build", "--check", "--profile", "cuda", "-j", JOBS)
    [res] = data["profiles"]
    assert data["ok"] and res["status"] == "compiled"
    assert CUDA_FILE in res["units"] and "llama.cpp/ggml/src/ggml-cuda/fattn.cu" in res["units"]
    after = forktool(project, "verify")
    assert after["compiled"]["cuda"] == "compiled" and after["compiled"]["cpu"] == "not compiled"


def test_a_break_in_0073s_cuda_file_is_quoted_with_the_patch_to_fix(project: Path) -> None:
    path = project / "vendor" / "llamafile" / CUDA_FILE
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    lines.append("static int opencoti_broken(void) { return not_declared_anywhere(); }\n")
    path.write_text("".join(lines))
    try:
        data = forktool(project, "build", "--check", "--profile", "cuda", "-j", JOBS, check=False)
        [res] = data["profiles"]
        assert res["status"] == "failed" and CUDA_FILE in res["failed"]
        assert res["cause"]["file"].endswith(CUDA_FILE) and res["cause"]["line"] == len(lines)
        assert "not_declared_anywhere" in res["cause"]["text"] and "forktool refresh 0073" in res["hint"]
    finally:
        path.write_text(text)
