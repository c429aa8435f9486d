"""A build of one series position made on this machine (the cuda profile's unless --profile says another), for
carrying to the GPU machine beside another build made here: two builds of one compiler, which gate b needs (a ratio
between builds of different compilers measures the compilers too; gates.common.compilers_differ).

The position's sources come from forktool's applier (gates.bundle: the vendored tree is neither read nor moved), the
configure is the cuda profile's as `forktool build` resolves it on this machine (registry/build.yaml's flags, the
toolkit, the compiler cache), and the build directory is fixed, build/host/<position>/, so a compiler cache serves
the next build of the same sources in full. --pack writes bin/ as a tar.xz whose symlinks point at their neighbours,
ready to unpack on the GPU machine (tar xJf FILE -C DIR gives DIR/bin).

    python -m gates.host_build --position upstream [--jobs 2] [--pack build/host/upstream-bin.tar.xz]
    python -m gates.host_build --bin build/cuda/bin --pack build/host/full-bin.tar.xz
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from forktool.archive import extract_to_dir
from forktool.build import cuda
from forktool.build.config import load_config
from forktool.build.plan import configure_flags
from forktool.errors import ForktoolError
from forktool.package import source_date_epoch
from forktool.project import find_project
from forktool.txn import locked
from forktool.workspace import Workspace
from gates.bundle import position_names, positions, write_position

TARGETS = ("llama-completion", "llama-perplexity", "llama-bench", "ggml-cpu")  # and ggml-cuda for the cuda profile
SOURCES_RECORD = ".sources-sha256"  # the archive the extracted sources came from


def pack(bin_dir: Path, dest: Path) -> int:
    """bin_dir's files and symlinks as DEST (tar.xz, entries bin/NAME; a symlink keeps its own target, which names
    a neighbour); its size in bytes. A symlink that leaves bin_dir is refused: unpacked elsewhere it would dangle."""
    for p in bin_dir.iterdir():
        if p.is_symlink() and (os.path.isabs(os.readlink(p)) or "/" in os.readlink(p)):
            raise ValueError(f"{p} -> {os.readlink(p)} points outside {bin_dir}: it would not resolve once unpacked")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    with tarfile.open(tmp, "w:xz") as tar:
        for p in sorted(bin_dir.iterdir()):
            if p.is_file() or p.is_symlink():
                tar.add(p, arcname=f"bin/{p.name}", recursive=False)
    tmp.replace(dest)
    return dest.stat().st_size


def sources(project, position: str, fixed: str, root: Path) -> Path:
    """root/src/llama.cpp holding the sources of `position` (one of position_names); re-extracted only when the
    archive's bytes changed, so an unchanged position leaves make nothing to do."""
    archive = root / f"{position}.tar.gz"
    with locked(project.state_dir):
        ws = Workspace(project)
        root.mkdir(parents=True, exist_ok=True)
        write_position(ws, positions(ws, fixed)[position], archive, source_date_epoch())
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    src = root / "src"
    record = root / SOURCES_RECORD
    if not (src / "llama.cpp").is_dir() or not record.is_file() or record.read_text().strip() != digest:
        shutil.rmtree(src, ignore_errors=True)
        extract_to_dir(archive, src)  # every member checked before the first write
        record.write_text(digest + "\n")
    return src / "llama.cpp"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.host_build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--position", help="upstream, pre<fixed> or full")
    ap.add_argument("--bin", type=Path, help="build nothing: only --pack this bin directory (e.g. build/cuda/bin, "
                                             "forktool build's full series)")
    ap.add_argument("--fixed", default="0089", help="the patch whose effect the gates isolate (names pre<fixed>)")
    ap.add_argument("--profile", default="cuda", help="the registry's build profile whose configure it takes")
    ap.add_argument("--out", type=Path, help="default: build/host/<position> (<position>-<profile> for another profile)")
    ap.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--pack", type=Path, help="also write bin/ as this tar.xz")
    a = ap.parse_args(argv)
    if a.bin is not None:
        if a.pack is None or a.position is not None or not a.bin.is_dir():
            print("gates.host_build: --bin DIR needs --pack FILE, an existing DIR and no --position", file=sys.stderr)
            return 2
        try:
            print(f"{a.pack} ({pack(a.bin, a.pack) >> 20} MiB)")
        except ValueError as e:
            print(f"gates.host_build: {e}", file=sys.stderr)
            return 2
        return 0
    if a.position is None:
        print("gates.host_build: --position (or --bin DIR --pack FILE) is required", file=sys.stderr)
        return 2
    project = find_project()
    root = a.out or project.root / "build" / "host" / (a.position if a.profile == "cuda" else f"{a.position}-{a.profile}")
    names = position_names(a.fixed)
    try:
        if a.position not in names:  # refused before anything is read or written
            raise ValueError(f"no position {a.position!r}: one of {', '.join(names)}")
        profile = load_config(project).profile(a.profile)  # a bad name is refused before anything is written
        src = sources(project, a.position, a.fixed, root)
        bdir = root / "bld"
        bdir.mkdir(parents=True, exist_ok=True)
        flags = configure_flags(profile, bdir)
        if any(cuda.STUB_DIR in f for f in flags):
            cuda.make_driver_stub(bdir)
    except (ForktoolError, ValueError) as e:
        print(f"gates.host_build: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root))
    t0 = time.monotonic()
    steps = [["cmake", "-S", str(src), "-B", str(bdir), "-G", profile.generator, *flags,
              f"-DLLAMA_BUILD_COMMIT=host-{a.position}"],
             ["make", "-C", str(bdir), f"-j{a.jobs}", *TARGETS, *(["ggml-cuda"] if profile.has_cuda else [])]]
    with open(root / "build.log", "w") as log:
        for argv_ in steps:
            log.write("$ " + " ".join(argv_) + "\n")
            log.flush()
            rc = subprocess.run(argv_, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
            if rc != 0:
                print(f"gates.host_build: {argv_[0]} failed (exit {rc}); its output: {root / 'build.log'}",
                      file=sys.stderr)
                return 1
    print(f"{a.position}: built in {time.monotonic() - t0:.0f} s -> {bdir / 'bin'}")
    if a.pack:
        print(f"{a.pack} ({pack(bdir / 'bin', a.pack) >> 20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
