"""Integration on the real pinned upstream (llama-cpp-python sdist, fetched once and cached)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.project import Proj, copy_real_project, git

pytestmark = pytest.mark.integration


@pytest.fixture
def real(tmp_path: Path, session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Proj:
    # the session's cache: the 77 MB sdist is downloaded once per test session
    monkeypatch.setenv("FORKTOOL_CACHE", str(session_cache))
    root = copy_real_project(tmp_path / "proj")
    run_cli(root, ["vendor", "fetch"])
    return Proj(root, Path("/nonexistent"))


def test_pin_and_lock(real: Proj):
    lock = real.json("vendor", "status")
    assert lock["pristine_files"] == 966 and lock["problems"] == []
    assert lock["components"][0]["upstream_commit"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert (real.tree / "llama.cpp/src/llama-kv-cache.cpp").is_file()
    assert not (real.tree / "llama.cpp/ggml/src/ggml-metal").exists()
    assert (real.tree / "llama.cpp/ggml/src/ggml-cuda").is_dir()


def test_shipped_series_applies_verifies_and_unapplies(real: Proj):
    pristine = real.digest()
    res = real.json("apply")
    assert res["top"] == (res["applied"][-1] if res["applied"] else None)
    real.run("verify")
    real.run("unapply")
    assert real.digest() == pristine


def test_real_patch_round_trip_and_git_am(real: Proj, tmp_path: Path):
    real.run("apply")
    pid = real.json("new", "demo-hook", "--title", "demo: a marked line in the KV cache")["id"]
    real.edit("llama.cpp/src/llama-kv-cache.cpp", "\nllama_kv_cache::llama_kv_cache(",
              "\n// opencoti-hook: demo-hook\nllama_kv_cache::llama_kv_cache(")
    out = real.json("refresh", pid)
    assert out["files"] == ["llama.cpp/src/llama-kv-cache.cpp"] and out["build_impact"] == "host"
    name = out["patch"]
    data = (real.root / "patches" / name).read_bytes()
    real.run("unapply")
    real.run("apply")
    assert (real.root / "patches" / name).read_bytes() == data
    # the same bytes are a valid mailbox for git am on a git copy of the upstream tree at the previous state
    work = tmp_path / "am"
    shutil.copytree(real.tree, work, symlinks=True)
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    kv = work / "llama.cpp/src/llama-kv-cache.cpp"
    kv.write_text(kv.read_text().replace("// opencoti-hook: demo-hook\n", ""))
    git(work, "add", "-A")
    git(work, "commit", "-qm", "base")
    git(work, "am", "-q", str(real.root / "patches" / name))
    assert "opencoti-hook: demo-hook" in kv.read_text()


@pytest.mark.skipif(shutil.which("quilt") is None, reason="quilt is not installed (.ci/run installs it)")
def test_quilt_consumes_the_shipped_series(real: Proj, tmp_path: Path):
    """quilt pushes patches/ as it is, onto a copy of the pristine tree, to the same bytes forktool applies."""
    work = tmp_path / "quilt"
    shutil.copytree(real.tree, work, symlinks=True)
    env = dict(os.environ, QUILT_PATCHES=str(real.root / "patches"), QUILT_PC=str(tmp_path / "pc"))
    r = subprocess.run(["quilt", "push", "-a", "-q"], cwd=work, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    real.run("apply")
    from forktool.tree import digest, scan
    assert digest(scan(work)) == real.digest()
