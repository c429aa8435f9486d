"""Regenerate this recording: move a copy of the project (its tracked files as they are in the working tree) to
llama-cpp-python 0.3.35 with the sync loop, resolving each stop with resolve.py, and copy what the move made (the
patches, the pin, the lock, the registry) here. Each `--continue` compiles the cpu and cuda profiles at that patch's
position, so this takes as long as those builds (about an hour on 2 cores).

    FORKTOOL_CACHE=~/.cache/forktool python tests/data/sync-0.3.35/regenerate.py [WORKDIR]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
import resolve  # noqa: E402

SPEC = "llama-cpp-python==0.3.35"


def forktool(root: Path, *args: str) -> tuple[int, dict]:
    env = dict(os.environ, FORKTOOL_ROOT=str(root))
    r = subprocess.run([sys.executable, "-m", "forktool", *args, "--json"], env=env, capture_output=True, text=True)
    sys.stderr.write(r.stderr[-2000:])
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else {}


def main() -> int:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="sync-0.3.35-"))
    root = work / "proj"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)
    for args in (("vendor", "fetch"), ("apply",), ("verify",)):
        code, _ = forktool(root, *args)
        if code != 0:
            sys.exit(f"regenerate: forktool {' '.join(args)} exited {code} in {root}")
    t0 = time.monotonic()
    code, data = forktool(root, "sync", "--to", SPEC, "--start")
    stops = []
    while data.get("stage") == "stopped":
        stop = data["stop"]
        stops.append(f"{stop['id']} ({stop.get('kind', 'conflict')})")
        print(f"stopped at {stops[-1]} after {time.monotonic() - t0:.0f} s", flush=True)
        resolve.resolve(root / "vendor" / "llamafile" / "llama.cpp", stop["id"])
        code, data = forktool(root, "sync", "--continue")
    if code != 0 or not data.get("verify", {}).get("ok"):
        sys.exit(f"regenerate: the move did not finish with verify OK (exit {code}); the project is in {root}")
    for sub in ("patches", "registry"):
        for f in (HERE / sub).iterdir():
            f.unlink()
        for f in (root / sub).iterdir():
            if f.is_file() and (sub == "patches" or f.name.startswith("UPSTREAM_SYNC.")):
                shutil.copy2(f, HERE / sub / f.name)
    for name in ("vendor.yaml", "vendor.lock"):
        shutil.copy2(root / "vendor" / name, HERE / "vendor" / name)
    print(f"regenerated {HERE.relative_to(REPO)}: stops {', '.join(stops)}; {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
