"""The progress total's cost on a configured build directory: a no-op make, make's count, CMake-file count.

Usage: python bench/bench_progress.py BDIR TARGET... (medians of 5, seconds); OLD_PROGRESS=FILE adds an earlier
progress.py's stale_objects (`git show main~N:forktool/build/progress.py`) for a before figure."""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from forktool.build import progress  # noqa: E402


def timed(fn: Callable[[], Any], n: int = 5) -> tuple[float, Any]:
    ts, out = [], None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def main() -> None:
    bdir, targets = Path(sys.argv[1]), sys.argv[2:]
    noop, _ = timed(lambda: subprocess.run(["make", *targets], cwd=bdir, capture_output=True, check=True))
    print(f"no-op make {' '.join(targets)}: {noop:.3f} s")
    dry, _ = timed(lambda: subprocess.run(["make", "-n", "-k", *targets], cwd=bdir, capture_output=True))
    print(f"one make -n -k: {dry:.3f} s")
    count, got = timed(lambda: progress.objects_to_compile(bdir, targets, {}))
    print(f"objects_to_compile (dependency steps + dry run): {count:.3f} s, finished={got[0]}, {len(got[1])} objects")
    old_path = Path(os.environ.get("OLD_PROGRESS", "/nonexistent"))
    if old_path.exists():  # an earlier progress.py with stale_objects (CMake's files), for a before figure
        spec = importlib.util.spec_from_file_location("old_progress", old_path)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        t_old, stale = timed(lambda: old.stale_objects(bdir, targets))
        print(f"old stale_objects (CMake's files): {t_old:.3f} s, {len(stale) if stale is not None else None} objects")


if __name__ == "__main__":
    main()
