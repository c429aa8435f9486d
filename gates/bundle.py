"""Source archives of three series positions (upstream, before 0089, full) for the CUDA build on a GPU machine.

Each position is computed in memory (pristine + its patches, forktool's applier), written out in a temporary
directory and archived; the vendored tree is neither read nor moved, and the project lock is held throughout, so a
forktool command run meanwhile cannot change what the archives hold (it is refused and says so)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from forktool.errors import ForktoolError
from forktool.package import source_date_epoch, write_targz
from forktool.project import find_project
from forktool.tree import EXECUTABLE, resolve_inside
from forktool.txn import locked
from forktool.vendor import materialise_to
from forktool.workspace import Workspace


def write_position(ws: Workspace, patches: list, dest: Path, epoch: int) -> None:
    """dest = a tar.gz of pristine + patches (entries under llama.cpp/), byte-reproducible."""
    result = ws.compute(patches)
    with tempfile.TemporaryDirectory(prefix=".bundle-", dir=ws.state_dir) as tmp:
        root = Path(tmp) / "tree"
        materialise_to(ws.store, ws.pristine, root)
        for rel in sorted(result.files):
            p = resolve_inside(root, rel, "series result")
            data = result.files[rel]
            if data is None:
                p.unlink(missing_ok=True)
                for parent in p.parents:  # the tree keeps no directory a deletion emptied
                    if parent == root or any(parent.iterdir()):
                        break
                    parent.rmdir()
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            e = ws.pristine.get(rel)
            p.chmod(0o755 if e is not None and e.mode == EXECUTABLE else 0o644)
        write_targz(root / "llama.cpp", "llama.cpp", dest, epoch)


def position_names(fixed: str) -> tuple[str, ...]:
    """The names of the positions the GPU gates build, in build order."""
    return ("upstream", "pre" + fixed, "full")


def positions(ws: Workspace, fixed: str) -> dict[str, list]:
    """The series positions the GPU gates build, by name: upstream, pre<fixed> (the series without `fixed` and what
    follows it) and full; SystemExit with a message where `fixed` is not after a first patch."""
    ids = [p.id for p in ws.patches]
    if fixed not in ids or ids.index(fixed) == 0:
        sys.exit(f"gates: {fixed} must be in the series after at least one patch")
    i = ids.index(fixed)
    return dict(zip(position_names(fixed), ([], ws.patches[:i], ws.patches), strict=True))


def series_inputs(root: Path) -> str:
    """gates/series_inputs.sh's digest of root's patches and pin (one definition, in the script the device runs)."""
    script = Path(__file__).resolve().parent / "series_inputs.sh"
    return subprocess.run(["bash", str(script)], cwd=root, capture_output=True, text=True, check=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.bundle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("build/device-bundle"))
    ap.add_argument("--fixed", default="0089", help="the patch whose effect the gates isolate")
    a = ap.parse_args()
    project = find_project()
    try:
        with locked(project.state_dir):
            ws = Workspace(project)
            wanted = positions(ws, a.fixed)
            a.out.mkdir(parents=True, exist_ok=True)
            epoch = source_date_epoch()
            for name, patches in wanted.items():
                dest = a.out / f"{name}.tar.gz"
                write_position(ws, patches, dest, epoch)
                print(f"{dest} ({dest.stat().st_size >> 10} KiB)")
            # what the archives were made from, which gates/device_build.sh checks against the carried checkout
            (a.out / "inputs.sha256").write_text(series_inputs(project.root))
    except ForktoolError as e:
        print(f"gates.bundle: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
