"""A real upstream move with the loop: the shipped series to llama-cpp-python 0.3.35 and the 0.3.35 port back to
0.3.36 (the pin), each stop resolved by the recorded resolutions; the forward result builds and passes the gates."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forktool.project import load_vendor_config

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "sync-0.3.35"
sys.path.insert(0, str(DATA))
import resolve  # noqa: E402  (the recorded hand resolutions, kept beside the port they produced)

pytestmark = [pytest.mark.slow, pytest.mark.integration]
JOBS = os.environ.get("FORKTOOL_TEST_JOBS", "2")
STOPS = ["0070", "0071", "0072", "0073", "0089"]


def forktool(root: Path, *args: str, expect: int | None = 0) -> tuple[int, dict]:
    env = dict(os.environ, FORKTOOL_ROOT=str(root))
    r = subprocess.run([sys.executable, "-m", "forktool", *args, "--json"], env=env, capture_output=True, text=True)
    if expect is not None:
        assert r.returncode == expect, f"forktool {' '.join(args)}: {r.returncode}\n{r.stderr[-4000:]}"
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {}


def project(root: Path, series_from: Path | None) -> Path:
    """The repository's tracked files, optionally with the 0.3.35 port's pin, patches and registry."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)
    if series_from is not None:
        for p in (root / "patches").iterdir():
            p.unlink()
        for sub in ("patches", "vendor", "registry"):
            for f in (series_from / sub).iterdir():
                shutil.copy2(f, root / sub / f.name)
    for args in (("vendor", "fetch"), ("apply",), ("verify",)):
        forktool(root, *args)
    return root


def same(a: Path, b: Path, rels: list[str]) -> list[str]:
    return [rel for rel in rels if (a / rel).read_bytes() != (b / rel).read_bytes()]


def registry_facts(root: Path) -> dict:
    """What the move owns in the registry: each patch's files, impact and hooks, each hook's sites (the gates'
    commands and texts belong to the payload and may change under the recorded port)."""
    from forktool import registry as rg
    reg = rg.load(root / "registry" / "UPSTREAM_SYNC.yaml")
    return {"patches": {e.id: (e.file, e.files, e.build_impact, e.hooks) for e in reg.patches},
            "hooks": {h.id: (h.patch, h.sites) for h in reg.hooks.values()}}


def carried(root: Path, spec: str, fix) -> tuple[list[dict], float]:
    """Start the move, resolve each stop with fix(patch_id), continue; (the runs' outputs, the tool's seconds)."""
    runs = []
    t0 = time.monotonic()
    code, data = forktool(root, "sync", "--to", spec, "--start", expect=None)
    tool = time.monotonic() - t0 - data["timings"]["fetch_s"]
    runs.append(data)
    while data["stage"] == "stopped":
        fix(data["stop"]["id"])
        t0 = time.monotonic()
        code, data = forktool(root, "sync", "--continue", expect=None)
        tool += time.monotonic() - t0
        runs.append(data)
    assert code == 0 and data["verify"]["ok"], data
    return runs, tool


@pytest.fixture(scope="module")
def cache() -> None:
    if not shutil.which("cmake"):
        pytest.skip("needs cmake")


def test_port_to_0_3_35_and_abort(cache, tmp_path: Path) -> None:
    root = project(tmp_path / "proj", None)
    _, before = forktool(root, "status")
    # --abort after the first stop: everything back, the tree digest equal to before the start
    code, stop = forktool(root, "sync", "--to", "llama-cpp-python==0.3.35", "--start", expect=1)
    assert stop["stop"]["id"] == "0070"
    _, aborted = forktool(root, "sync", "--abort")
    assert aborted["tree_digest"] == aborted["tree_digest_before"]
    forktool(root, "verify")
    runs, tool = carried(root, "llama-cpp-python==0.3.35",
                         lambda pid: resolve.resolve(root / "vendor" / "llamafile" / "llama.cpp", pid))
    assert [r["stop"]["id"] for r in runs if r["stage"] == "stopped"] == STOPS
    assert [(d["id"], d["status"]) for d in runs[-1]["done"]] == [
        ("0070", "resolved"), ("0071", "resolved"), ("0072", "resolved"), ("0073", "resolved"), ("0089", "resolved")]
    # the recorded port is exactly what the tool makes of these resolutions
    rels = [f"patches/{p.name}" for p in (DATA / "patches").iterdir()] + ["vendor/vendor.yaml", "vendor/vendor.lock"]
    assert same(root, DATA, rels) == []
    assert registry_facts(root) == registry_facts(DATA)
    forktool(root, "registry", "check")
    print(f"port to 0.3.35: {len(STOPS)} stops, tool {tool:.1f} s (fetch excluded)")


def test_forward_to_the_pin_builds_and_passes_the_gates(cache, tmp_path: Path) -> None:
    root = project(tmp_path / "proj", DATA)
    pristine = json.loads((REPO / "vendor" / "vendor.lock").read_text())["pristine_digest"]
    pin = next(c for c in load_vendor_config(REPO / "vendor" / "vendor.yaml").components if c.kind == "sdist")
    runs, tool = carried(root, pin.spec, lambda pid: resolve.resolve_to_series(root, REPO / "patches", pristine, pid))
    assert [r["stop"]["id"] for r in runs if r["stage"] == "stopped"] == STOPS
    assert [(d["id"], d["status"]) for d in runs[-1]["done"]] == [
        ("0070", "resolved"), ("0071", "resolved"), ("0072", "resolved"), ("0073", "resolved"), ("0089", "resolved")]
    hooks = runs[-1]["hooks"]
    assert {h["status"] for h in hooks} <= {"found", "moved_lines", "added"}
    assert [(h["hook"], h["symbol"]) for h in hooks if h["status"] == "added"] == [
        ("kv-split-storage", "llama_kv_cache::state_clear")]
    # the round trip 0.3.36 -> 0.3.35 -> 0.3.36 gives back the shipped series, registry and lock byte for byte
    rels = [f"patches/{p.name}" for p in (REPO / "patches").iterdir()] + ["vendor/vendor.yaml"]
    assert same(root, REPO, rels) == []
    # the lock: same components, pristine and patched tree (its series digest is checked by verify, which the
    # finish ran, against these very patches)
    lock, shipped = (json.loads((r / "vendor" / "vendor.lock").read_text()) for r in (root, REPO))
    for key in ("components", "pristine_digest", "pristine_files"):
        assert lock[key] == shipped[key], key
    assert lock["patched"]["tree_digest"] == shipped["patched"]["tree_digest"]
    assert registry_facts(root) == registry_facts(REPO)
    forktool(root, "registry", "check")
    _, built = forktool(root, "build", "--profile", "cpu", "-j", JOBS)
    assert built["unexpected"] == []
    # the CPU logit gates: head mode identical to an unpatched build of the same upstream, forced windows
    # equal to resident within the gate's tolerance
    from forktool.commands.gates_cmds import ensure_reference_build
    from forktool.project import Project
    upstream = ensure_reference_build(Project(root), "cpu")
    r = subprocess.run([sys.executable, "-m", "gates.cpu", "--patched-bin", str(root / "build" / "cpu" / "bin"),
                        "--upstream-bin", str(upstream), "--work-dir", str(tmp_path / "gates")],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"forward to 0.3.36: tool {tool:.1f} s; build {built['seconds']:.0f} s\n{r.stdout[-2000:]}")
