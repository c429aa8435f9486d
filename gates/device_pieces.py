"""A file too large for one device call, carried in pieces over several calls and joined on the device.

The device takes at most 64 MiB a call (the tracked tree included), and Gemma 3 270M's GGUF is 253 MB. Here
(`make device-needle`):

    python -m gates.device_pieces split FILE --out build/device-needle --mib 52

writes build/device-needle/01, 02, ... each holding one piece and `pieces.json` (the file's name, size and
sha256, and every piece's). On the device, one call per piece, each carrying its folder:

    python3 -m gates.device_pieces stage build/device-needle/03

copies the piece into the stage folder (HOME/.forktool-device-stage, or --stage) after checking its sha256, and once
every piece is there joins them, checks the whole file's sha256 and removes the pieces. The stage outlives a call
only while the machine stays warm, so the calls follow each other. Then

    python3 -m gates.device_pieces path gemma-3-270m-q4_k_m.gguf

prints the joined file's path after checking its sha256 again (exit 0), or says which pieces are still to carry
(exit 2). A piece or a joined file whose digest is not the one recorded is refused (exit 1) and nothing of it is
kept. Only the standard library: it
runs before anything is installed on the device.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

MANIFEST = "pieces.json"
CHUNK = 1 << 20


def default_stage() -> Path:
    return Path(os.environ.get("HOME", "~")).expanduser() / ".forktool-device-stage"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def split(src: Path, out: Path, piece_bytes: int) -> dict:
    """Cut src into pieces of piece_bytes (the last one shorter) under out/NN/, each folder with the manifest."""
    if piece_bytes <= 0:
        raise ValueError("a piece must hold at least one byte")
    size = src.stat().st_size
    n = max(1, -(-size // piece_bytes))
    if out.exists():
        shutil.rmtree(out)
    pieces = []
    whole = hashlib.sha256()
    with open(src, "rb") as f:
        for i in range(n):
            name = f"{src.name}.{i + 1:02d}"
            folder = out / f"{i + 1:02d}"
            folder.mkdir(parents=True)
            h = hashlib.sha256()
            left = piece_bytes
            with open(folder / name, "wb") as g:
                while left > 0 and (block := f.read(min(CHUNK, left))):
                    g.write(block)
                    h.update(block)
                    whole.update(block)
                    left -= len(block)
            pieces.append({"name": name, "bytes": (folder / name).stat().st_size, "sha256": h.hexdigest()})
    manifest = {"name": src.name, "bytes": size, "sha256": whole.hexdigest(), "pieces": pieces}
    for i in range(n):
        (out / f"{i + 1:02d}" / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_manifest(path: Path) -> dict:
    try:
        m = json.loads(path.read_text())
        if not (isinstance(m.get("name"), str) and isinstance(m.get("pieces"), list) and m["pieces"]):
            raise ValueError("no name or pieces")
        return m
    except (OSError, ValueError) as e:
        raise SystemExit(f"device_pieces: {path} is not a pieces manifest ({e}); `make device-needle` writes it") from None


def missing(stage: Path, m: dict) -> list[str]:
    """The pieces of m not staged yet (none once the file is joined)."""
    if (stage / m["name"]).is_file():
        return []
    return [p["name"] for p in m["pieces"] if not (stage / p["name"]).is_file()]


def stage_piece(folder: Path, stage: Path) -> tuple[dict, list[str]]:
    """Copy the piece in folder into stage (checked), and join the file when every piece is there; returns the
    manifest and the pieces still missing."""
    m = read_manifest(folder / MANIFEST)
    names = {p["name"]: p for p in m["pieces"]}
    here = [p for p in sorted(folder.iterdir()) if p.name in names]
    if not here:
        raise SystemExit(f"device_pieces: {folder} holds no piece of {m['name']} (carry the folder with its piece)")
    stage.mkdir(parents=True, exist_ok=True)
    # a manifest staged before for another file of the same name would mix pieces: the newer one replaces it all
    staged_manifest = stage / f"{m['name']}.{MANIFEST}"
    if staged_manifest.is_file() and read_manifest(staged_manifest)["sha256"] != m["sha256"]:
        for p in stage.iterdir():
            if p.name.startswith(m["name"]):
                p.unlink()
    staged_manifest.write_text(json.dumps(m, indent=2) + "\n")
    if (stage / m["name"]).is_file():
        return m, []
    for src in here:
        want = names[src.name]["sha256"]
        got = sha256_file(src)
        if got != want:
            raise SystemExit(f"device_pieces: {src} has sha256 {got[:12]}, the manifest records {want[:12]}: "
                             f"carry it again (nothing of it was staged)")
        tmp = stage / f".{src.name}.part"
        shutil.copyfile(src, tmp)
        os.replace(tmp, stage / src.name)
    left = missing(stage, m)
    if not left:
        join(stage, m)
    return m, left


def join(stage: Path, m: dict) -> Path:
    """Join the staged pieces into stage/NAME, checked against the whole file's sha256, and drop the pieces."""
    dst = stage / m["name"]
    tmp = stage / f".{m['name']}.part"
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for p in m["pieces"]:
            with open(stage / p["name"], "rb") as f:
                while block := f.read(CHUNK):
                    out.write(block)
                    h.update(block)
    if h.hexdigest() != m["sha256"]:
        tmp.unlink()
        raise SystemExit(f"device_pieces: the joined {m['name']} has sha256 {h.hexdigest()[:12]}, the manifest "
                         f"records {m['sha256'][:12]}: the staged pieces were removed, carry them again")
    os.replace(tmp, dst)
    for p in m["pieces"]:
        (stage / p["name"]).unlink()
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.device_pieces", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("split", help="cut a file into pieces, one folder each")
    sp.add_argument("file", type=Path)
    sp.add_argument("--out", type=Path, required=True)
    sp.add_argument("--mib", type=float, default=52.0, help="MiB a piece (the tracked tree travels with it)")
    st = sub.add_parser("stage", help="on the device: stage the piece a call carried; join when all are there")
    st.add_argument("folder", type=Path)
    st.add_argument("--stage", type=Path, default=None)
    pa = sub.add_parser("path", help="on the device: the joined file's path, or the pieces still to carry")
    pa.add_argument("name")
    pa.add_argument("--stage", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.cmd == "split":
        if not a.file.is_file():
            print(f"device_pieces: {a.file} is not a file", file=sys.stderr)
            return 1
        m = split(a.file, a.out, int(a.mib * (1 << 20)))
        print(f"{m['name']}: {m['bytes']} bytes in {len(m['pieces'])} pieces under {a.out} "
              f"(sha256 {m['sha256'][:12]}); carry one folder a call, then stage it")
        return 0
    stage = a.stage or default_stage()
    if a.cmd == "stage":
        m, left = stage_piece(a.folder, stage)
        if left:
            print(f"staged {len(m['pieces']) - len(left)} of {len(m['pieces'])} pieces of {m['name']} in {stage}; "
                  f"still to carry: {' '.join(left)}")
        else:
            print(f"complete: {stage / m['name']} ({m['bytes']} bytes, sha256 {m['sha256'][:12]})")
        return 0
    staged_manifest = stage / f"{a.name}.{MANIFEST}"
    if not staged_manifest.is_file():
        print(f"device_pieces: no piece of {a.name} staged in {stage}", file=sys.stderr)
        return 2
    m = read_manifest(staged_manifest)
    left = missing(stage, m)
    if left:
        print(f"device_pieces: {a.name} is not complete in {stage}: still to carry {' '.join(left)}", file=sys.stderr)
        return 2
    got = sha256_file(stage / m["name"])
    if got != m["sha256"]:  # joined and checked once; a file changed since is not handed to a gate
        print(f"device_pieces: {stage / m['name']} has sha256 {got[:12]}, the manifest records {m['sha256'][:12]}: "
              f"stage its pieces again", file=sys.stderr)
        return 1
    print(stage / m["name"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
