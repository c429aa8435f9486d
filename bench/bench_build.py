"""Build benchmark: full cpu build, host-only rebuild, no-op build, and the make-clean anchor flow, as medians."""

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
HOST_FILE = "llama.cpp/src/llama-kv-cache.cpp"
CUDA_CPU_SECONDS = 2090  # FACTS.md: libggml-cuda for sm_90, 144 objects, measured on the 2-core machine
CUDA_OBJECTS = 144


def forktool(root: Path, *args: str, check: bool = True) -> dict:
    """Run the forktool CLI of this checkout on the project at root; its --json result."""
    env = dict(os.environ, FORKTOOL_ROOT=str(root))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    cp = subprocess.run([sys.executable, "-m", "forktool", *args, "--json"], env=env, capture_output=True, text=True)
    if check and cp.returncode != 0:
        raise RuntimeError(f"forktool {' '.join(args)} exited {cp.returncode}:\n{cp.stdout}\n{cp.stderr}")
    return json.loads(cp.stdout) if cp.stdout.strip() else {}


def scratch_project(dest: Path) -> Path:
    """A throwaway project on the real pin (tree from the pristine cache) with one host-only patch, 0001."""
    for rel in ("vendor/vendor.yaml", "vendor/vendor.lock", "registry/build.yaml"):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, dest / rel)
    (dest / "patches").mkdir()
    (dest / "patches" / "series").write_text("# bench series\n")
    forktool(dest, "apply")
    forktool(dest, "new", "bench-host", "--title", "bench: host-only edit in the KV cache")
    edit_host_file(dest, 0)
    forktool(dest, "refresh", "0001")
    return dest


def edit_host_file(root: Path, n: int) -> None:
    p = root / "vendor" / "llamafile" / HOST_FILE
    lines = p.read_text().splitlines(keepends=True)
    lines = [ln for ln in lines if "opencoti-hook: bench-host" not in ln]
    p.write_text("".join(lines) + f"// opencoti-hook: bench-host v{n}\n")


def patch_variants(root: Path, count: int) -> list[bytes]:
    """Bytes of patch 0001 in `count` versions (each a different host-only edit); the tree ends at the last."""
    out = []
    for n in range(1, count + 1):
        edit_host_file(root, n)
        forktool(root, "refresh", "0001")
        out.append(next((root / "patches").glob("0001-*.patch")).read_bytes())
    return out


def use_variant(root: Path, data: bytes) -> None:
    next((root / "patches").glob("0001-*.patch")).write_bytes(data)


def timed(fn) -> tuple[float, object]:
    t = time.monotonic()
    res = fn()
    return time.monotonic() - t, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="runs of the incremental, no-op and forktool-flow steps")
    ap.add_argument("--full-repeat", type=int, default=1, help="runs of the full and anchor builds (minutes each)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the scratch project here")
    args = ap.parse_args()
    if not os.environ.get("FORKTOOL_CACHE"):
        print("set FORKTOOL_CACHE to the cache holding the pinned upstream", file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="forktool-bench-"))
    root = scratch_project(work / "proj")
    j = str(args.jobs)
    results: dict[str, list[float]] = {}
    notes: dict[str, str] = {}

    for _ in range(args.full_repeat):
        shutil.rmtree(root / "build", ignore_errors=True)
        s, res = timed(lambda: forktool(root, "build", "-j", j))
        results.setdefault("full cpu build", []).append(s)
        notes["full cpu build"] = f"{len(res['objects'])} objects"

    variants = patch_variants(root, 2)
    forktool(root, "build", "-j", j)  # settle at the last variant
    objs = []
    for i in range(args.repeat):
        use_variant(root, variants[i % 2])
        forktool(root, "apply")
        s, res = timed(lambda: forktool(root, "build", "-j", j))
        results.setdefault("host-only rebuild (forktool build)", []).append(s)
        objs.append(len(res["objects"]))
        notes["host-only rebuild (forktool build)"] = (f"{objs[-1]} objects; kept {', '.join(res['kept'])}; "
                                                       f"unexpected: {res['unexpected'] or 'none'}")

    for _ in range(args.repeat):
        s, res = timed(lambda: forktool(root, "build", "-j", j))
        results.setdefault("no-op forktool build", []).append(s)
        notes["no-op forktool build"] = f"{len(res['objects'])} objects"

    # the same edit, two ways: forktool's apply + build, and llamafile's re-apply + make clean + full build
    k = args.repeat
    for i in range(args.repeat):
        use_variant(root, variants[(k + i) % 2])
        s, _ = timed(lambda: (forktool(root, "apply"), forktool(root, "build", "-j", j)))
        results.setdefault("forktool flow: apply + build", []).append(s)
    targets = forktool(root, "build", "--plan")["targets"]
    bdir = root / "build" / "cpu"
    for i in range(args.full_repeat):
        use_variant(root, variants[(k + args.repeat + i) % 2])

        def anchor() -> None:
            forktool(root, "unapply")
            forktool(root, "apply")
            subprocess.run(["make", "clean"], cwd=bdir, check=True, capture_output=True)
            subprocess.run(["make", f"-j{j}", *targets], cwd=bdir, check=True, capture_output=True,
                           env=dict(os.environ, GIT_CEILING_DIRECTORIES=str(root / "vendor" / "llamafile")))
        s, _ = timed(anchor)
        results.setdefault("anchor flow: re-apply + make clean + full build", []).append(s)

    med = {k: statistics.median(v) for k, v in results.items()}
    full = med["full cpu build"]
    print(f"\nforktool build benchmark, cpu profile, -j{j}, {os.cpu_count()} CPUs, work dir {work}")
    print(f"{'step':52} {'median s':>9} {'runs':>5} {'vs full':>8}  notes")
    for k, v in med.items():
        print(f"{k:52} {v:9.1f} {len(results[k]):5d} {v / full:8.3f}  {notes.get(k, '')}")
    fk, an = med["forktool flow: apply + build"], med["anchor flow: re-apply + make clean + full build"]
    print(f"\nanchor / forktool flow for the same host-only edit: {an / fk:.1f}x ({an:.1f} s vs {fk:.1f} s)")
    print(f"CUDA DSO a host-only change does not rebuild (FACTS.md, sm_90): {CUDA_OBJECTS} objects, "
          f"{CUDA_CPU_SECONDS} CPU-s = {CUDA_CPU_SECONDS / 2 / 60:.1f} min at -j2, "
          f"{CUDA_CPU_SECONDS / args.jobs / 60:.1f} min at -j{j} (ideal scaling)")
    print(json.dumps({"jobs": args.jobs, "medians_s": med, "runs": results}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
