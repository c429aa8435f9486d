"""Upstream sync timings on the real upstreams, sdists cached: the whole-series trial 0.3.35 -> pin, and the loop's
start (to the first stop) and abort, as medians of whole processes.

Run with the bytecode cache on, as users have it: `env -u PYTHONDONTWRITEBYTECODE python bench/bench_sync.py`.
Needs FORKTOOL_CACHE holding both sdists (a first `forktool sync --to ...` fills it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "sync-0.3.35"


def forktool(root: Path, *args: str) -> tuple[float, int, dict]:
    env = dict(os.environ, FORKTOOL_ROOT=str(root))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "forktool", *args, "--json"], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    return wall, r.returncode, json.loads(r.stdout) if r.stdout.strip() else {}


def scratch(root: Path) -> Path:
    """The repository's tracked files with the 0.3.35 port's pin, patches and registry; series applied."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    for rel in files.split("\0"):
        if rel and (REPO / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)
    for p in (root / "patches").iterdir():
        p.unlink()
    for sub in ("patches", "vendor", "registry"):
        for f in (DATA / sub).iterdir():
            shutil.copy2(f, root / sub / f.name)
    for args in (("vendor", "fetch"), ("apply",)):
        _, code, _ = forktool(root, *args)
        assert code == 0, args
    return root


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set; users have the bytecode cache (unset it for real figures)")
    pin = json.loads((REPO / "vendor" / "vendor.lock").read_text())["components"]
    spec = next(v["spec"] for v in pin.values() if v["kind"] == "sdist")
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        root = scratch(Path(tmp) / "proj")
        trial, tool, start, abort = [], [], [], []
        for _ in range(args.runs):
            wall, code, data = forktool(root, "sync", "--to", spec, "--out", str(Path(tmp) / "out"))
            assert code in (0, 1) and data["timings"]["fetch_from_cache"], data.get("timings")
            trial.append(wall)
            tool.append(data["timings"]["total_s"])
            wall, code, data = forktool(root, "sync", "--to", spec, "--start")
            assert code == 1 and data["stage"] == "stopped", data
            start.append(wall)
            wall, code, data = forktool(root, "sync", "--abort")
            assert code == 0 and data["tree_digest"] == data["tree_digest_before"], data
            abort.append(wall)
    med = statistics.median
    print(f"whole-series trial 0.3.35 -> {spec} (cached): wall {med(trial):.2f} s, in-tool total {med(tool):.2f} s "
          f"(runs: {', '.join(f'{x:.2f}' for x in trial)})")
    print(f"loop --start to the first stop: {med(start):.2f} s; --abort: {med(abort):.2f} s "
          f"(start+abort / trial = {(med(start) + med(abort)) / med(trial):.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
