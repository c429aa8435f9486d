"""gates.device_pieces: a file carried to the device in pieces over several calls, joined there and checked."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pieces(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "gates.device_pieces", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_split_here_is_staged_a_piece_a_call_and_joined_checked_on_the_device(tmp_path: Path):
    src = tmp_path / "model.gguf"
    src.write_bytes(os.urandom(3 * (1 << 20) + 12345))  # 3 MiB and a bit: four pieces of 1 MiB, the last short
    out, home = tmp_path / "kit", tmp_path / "home"
    home.mkdir()
    r = pieces("split", str(src), "--out", str(out), "--mib", "1", home=home)
    assert r.returncode == 0, r.stderr
    assert "model.gguf: 3158073 bytes in 4 pieces" in r.stdout
    folders = sorted(p.name for p in out.iterdir())
    assert folders == ["01", "02", "03", "04"]
    m = json.loads((out / "01" / "pieces.json").read_text())
    assert m["sha256"] == digest(src) and m["bytes"] == src.stat().st_size
    assert [p["bytes"] for p in m["pieces"]] == [1 << 20] * 3 + [12345]
    assert all((out / f / "pieces.json").read_text() == (out / "01" / "pieces.json").read_text() for f in folders)
    # each folder is one call's carry: its piece and the manifest, nothing else
    assert sorted(p.name for p in (out / "03").iterdir()) == ["model.gguf.03", "pieces.json"]

    stage = home / ".forktool-device-stage"
    # before every piece is there, the path is refused and says what is left to carry
    r = pieces("stage", str(out / "02"), home=home)
    assert r.returncode == 0 and "staged 1 of 4 pieces" in r.stdout and "model.gguf.01 model.gguf.03" in r.stdout
    r = pieces("path", "model.gguf", home=home)
    assert r.returncode == 2 and "still to carry model.gguf.01 model.gguf.03 model.gguf.04" in r.stderr
    # staging the same piece again changes nothing
    assert pieces("stage", str(out / "02"), home=home).returncode == 0
    for f in ("04", "01"):
        assert pieces("stage", str(out / f), home=home).returncode == 0
    r = pieces("stage", str(out / "03"), home=home)
    assert r.returncode == 0 and r.stdout.startswith(f"complete: {stage / 'model.gguf'}"), r.stdout
    assert digest(stage / "model.gguf") == digest(src)
    assert sorted(p.name for p in stage.iterdir()) == ["model.gguf", "model.gguf.pieces.json"]  # pieces dropped
    r = pieces("path", "model.gguf", home=home)
    assert r.returncode == 0 and r.stdout.strip() == str(stage / "model.gguf")
    # a joined file changed since it was checked is not handed on
    with open(stage / "model.gguf", "r+b") as f:
        f.write(b"X")
    r = pieces("path", "model.gguf", home=home)
    assert r.returncode == 1 and "stage its pieces again" in r.stderr and r.stdout == ""


def test_a_piece_damaged_on_the_way_is_refused_and_nothing_of_it_is_staged(tmp_path: Path):
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(2 * (1 << 20)))
    out, home = tmp_path / "kit", tmp_path / "home"
    home.mkdir()
    assert pieces("split", str(src), "--out", str(out), "--mib", "1", home=home).returncode == 0
    piece = out / "02" / "f.bin.02"
    data = bytearray(piece.read_bytes())
    data[100] ^= 0xFF
    piece.write_bytes(bytes(data))
    r = pieces("stage", str(out / "02"), home=home)
    assert r.returncode == 1 and "carry it again (nothing of it was staged)" in r.stderr
    stage = home / ".forktool-device-stage"
    assert not (stage / "f.bin.02").exists() and not list(stage.glob(".*part"))
    # a folder without its manifest, or without a piece, says what to carry
    (out / "01" / "pieces.json").unlink()
    r = pieces("stage", str(out / "01"), home=home)
    assert r.returncode == 1 and "is not a pieces manifest" in r.stderr and "make device-needle" in r.stderr
    (out / "02" / "f.bin.02").unlink()
    r = pieces("stage", str(out / "02"), home=home)
    assert r.returncode == 1 and "holds no piece of f.bin" in r.stderr
    assert pieces("path", "other.bin", home=home).returncode == 2


def test_pieces_of_a_new_file_of_the_same_name_replace_the_old_ones(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    old, new = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for f in (old, new):
        f.parent.mkdir()
        f.write_bytes(os.urandom(2 * (1 << 20)))
    assert pieces("split", str(old), "--out", str(tmp_path / "ka"), "--mib", "1", home=home).returncode == 0
    assert pieces("split", str(new), "--out", str(tmp_path / "kb"), "--mib", "1", home=home).returncode == 0
    assert pieces("stage", str(tmp_path / "ka" / "01"), home=home).returncode == 0
    # the old file's first piece must not be joined with the new file's second
    assert pieces("stage", str(tmp_path / "kb" / "02"), home=home).returncode == 0
    r = pieces("path", "m.gguf", home=home)
    assert r.returncode == 2 and "still to carry m.gguf.01" in r.stderr
    r = pieces("stage", str(tmp_path / "kb" / "01"), home=home)
    assert r.returncode == 0 and "complete" in r.stdout
    assert digest(home / ".forktool-device-stage" / "m.gguf") == digest(new)
