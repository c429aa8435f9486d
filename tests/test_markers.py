"""The marker scan reads only the lines that hold the word, with the same result as matching every line."""

from __future__ import annotations

import random
from pathlib import Path

from forktool.markers import MARKER_RE, Marker, scan_file

REPO = Path(__file__).resolve().parent.parent


def _line_by_line(rel: str, data: bytes) -> list[Marker]:
    return [Marker(rel, n, m.group(1).decode()) for n, line in enumerate(data.split(b"\n"), 1)
            for m in MARKER_RE.finditer(line)]


PIECES = [b"opencoti-hook:", b"opencoti-hook: a-b.c", b"opencoti-hook:x", b"opencoti-hook", b" ", b"\t", b"\n",
          b"\r\n", b"// ", b"int x;", b"opencoti-hook:\n", b"opencoti-hook: \n  name", b"-", b"\x0b", b"\x0c", b"9"]


def test_the_scan_agrees_with_matching_every_line_on_generated_text() -> None:
    rnd = random.Random(3)
    found = 0
    for _ in range(3000):
        data = b"".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 25)))
        want = _line_by_line("f", data)
        assert scan_file("f", data) == want, data
        found += len(want)
    assert found > 1000


def test_the_scan_agrees_on_the_shipped_patches_and_a_marker_across_a_line_end() -> None:
    data = b"a\nopencoti-hook:\n  opencoti-hook: two-pass\nx opencoti-hook: k1 opencoti-hook: k2"
    assert scan_file("f", data) == [Marker("f", 3, "two-pass"), Marker("f", 4, "k1"), Marker("f", 4, "k2")]
    for p in sorted((REPO / "patches").glob("*.patch")):
        raw = p.read_bytes()
        assert scan_file(p.name, raw) == _line_by_line(p.name, raw)
        assert scan_file(p.name, raw)  # every shipped patch carries markers
