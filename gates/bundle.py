"""Source archives of three series positions (upstream, before 0089, full) for the CUDA build on a GPU machine."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from forktool.package import source_date_epoch, write_targz
from forktool.project import find_project
from forktool.series import read_series


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.bundle", description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("build/device-bundle"))
    ap.add_argument("--fixed", default="0089", help="the patch whose effect the gates isolate")
    a = ap.parse_args()
    project = find_project()
    ids = [e.id for e in read_series(project.series_file)]
    if a.fixed not in ids or ids.index(a.fixed) == 0:
        sys.exit(f"gates.bundle: {a.fixed} must be in the series after at least one patch")
    before = ids[ids.index(a.fixed) - 1]
    a.out.mkdir(parents=True, exist_ok=True)
    ft = [sys.executable, "-m", "forktool"]
    epoch = source_date_epoch()
    for name, move in (("upstream", ft + ["unapply"]), ("pre" + a.fixed, ft + ["apply", "--upto", before]),
                       ("full", ft + ["apply"])):
        subprocess.run(move, check=True)
        dest = a.out / f"{name}.tar.gz"
        write_targz(project.tree / "llama.cpp", "llama.cpp", dest, epoch)
        print(f"{dest} ({dest.stat().st_size >> 10} KiB)")
    subprocess.run(ft + ["verify"], check=True)  # the tree is back at the full series, proven
    return 0


if __name__ == "__main__":
    sys.exit(main())
