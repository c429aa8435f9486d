"""Core benchmarks on the real pinned upstream: fetch, apply, verify, no-op apply, against git apply / git am."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def sh(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{r.stderr}")


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5, help="runs per measurement (median reported)")
    ap.add_argument("--cold-repeat", type=int, default=3, help="runs of the cold fetch (each downloads ~77 MB)")
    args = ap.parse_args()
    ft = [sys.executable, "-m", "forktool"]
    work = Path(tempfile.mkdtemp(prefix="forktool-bench-"))
    root = work / "proj"
    for d in ("vendor", "patches", "registry"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("llamafile", ".*"))
    warm_cache = Path(os.environ.get("FORKTOOL_CACHE") or Path.home() / ".cache" / "forktool")
    env = dict(os.environ, FORKTOOL_ROOT=str(root), FORKTOOL_CACHE=str(warm_cache))
    rows: list[tuple[str, list[float]]] = []

    def cold_fetch() -> None:
        cache = work / f"cold-{time.monotonic_ns()}"
        shutil.rmtree(root / "vendor" / "llamafile", ignore_errors=True)
        (root / "vendor" / "vendor.lock").unlink(missing_ok=True)
        sh(ft + ["vendor", "fetch"], root, dict(env, FORKTOOL_CACHE=str(cache)))
        shutil.rmtree(cache)

    rows.append(("vendor fetch, cold (pip download + extract + materialise)", timed(cold_fetch, args.cold_repeat)))
    shutil.rmtree(root / "vendor" / "llamafile", ignore_errors=True)
    shutil.copy(REPO / "vendor" / "vendor.lock", root / "vendor" / "vendor.lock")
    sh(ft + ["vendor", "fetch"], root, env)
    n = sum(1 for ln in (root / "patches" / "series").read_text().splitlines() if ln.strip() and not ln.startswith("#"))

    def apply_from_pristine() -> None:
        sh(ft + ["apply"], root, env)

    apply_t = []
    for _ in range(args.repeat):
        sh(ft + ["unapply"], root, env)
        apply_t += timed(apply_from_pristine, 1)
    rows.append((f"forktool apply, whole series ({n} patches) from pristine", apply_t))
    rows.append(("forktool verify, warm", timed(lambda: sh(ft + ["verify"], root, env), args.repeat)))
    rows.append(("forktool apply, no-op (already applied)", timed(apply_from_pristine, args.repeat)))

    # the same series with git: a git repo of the pristine tree, then git apply per patch / git am
    sh(ft + ["unapply"], root, env)
    gitdir = work / "git"
    shutil.copytree(root / "vendor" / "llamafile", gitdir, symlinks=True)
    genv = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b",
                GIT_COMMITTER_EMAIL="b@b")
    for a in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "pristine"]):
        sh(["git", *a], gitdir, genv)
    patches = [str(root / "patches" / ln.strip()) for ln in (root / "patches" / "series").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]

    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=gitdir, capture_output=True, text=True).stdout.strip()

    def reset() -> None:
        sh(["git", "reset", "-q", "--hard", base], gitdir, genv)

    def git_apply() -> None:
        for p in patches:
            sh(["git", "apply", p], gitdir, genv)

    def git_am() -> None:
        sh(["git", "am", "-q", *patches], gitdir, genv)

    ga, gm = [], []
    for _ in range(args.repeat):
        reset()
        ga += timed(git_apply, 1)
        reset()
        gm += timed(git_am, 1)
    rows.append(("git apply, one call per patch (same tree, same series)", ga))
    rows.append(("git am, whole series (same tree, same series)", gm))

    print(f"{'measurement':62} {'median s':>9} {'min':>7} {'max':>7}  runs")
    for name, ts in rows:
        print(f"{name:62} {statistics.median(ts):9.3f} {min(ts):7.3f} {max(ts):7.3f}  {len(ts)}")
    med = {name: statistics.median(ts) for name, ts in rows}
    fa = med[f"forktool apply, whole series ({n} patches) from pristine"]
    per_patch = med["git apply, one call per patch (same tree, same series)"]
    print(f"\nratio forktool apply / git apply per patch: {fa / per_patch:.2f}")
    print(f"ratio forktool apply / git am:              {fa / med['git am, whole series (same tree, same series)']:.2f}")
    print(f"ratio no-op apply / full apply:             {med['forktool apply, no-op (already applied)'] / fa:.2f}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
