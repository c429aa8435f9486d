"""`opencoti-hook:` markers: find them in patches and in the vendored tree."""

from __future__ import annotations

import re
from dataclasses import dataclass

from forktool.series import Patch

MARKER_RE = re.compile(rb"opencoti-hook:\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class Marker:
    path: str
    line: int
    hook: str

    def to_json(self) -> dict[str, object]:
        return {"file": self.path, "line": self.line, "hook": self.hook}


def hooks_in_patch(patch: Patch) -> list[str]:
    """Hooks whose markers this patch introduces.

    A line that an earlier patch added (marker included) and this patch rewrites shows up as - and +
    with the same marker: that marker is carried over, not introduced, and stays the earlier hook's.
    """
    found: set[str] = set()
    for f in patch.files:
        for h in f.hunks:
            removed = {m.group(1).decode() for op, t in h.lines if op == b"-" for m in MARKER_RE.finditer(t)}
            added = {m.group(1).decode() for op, t in h.lines if op == b"+" for m in MARKER_RE.finditer(t)}
            found |= added - removed
    return sorted(found)


def scan_file(rel: str, data: bytes) -> list[Marker]:
    """Markers in data, line by line (a marker never spans lines); only lines holding the word are searched."""
    out = []
    line, at = 1, 0  # the number of the line starting at offset `at`
    i = data.find(b"opencoti-hook")
    while i != -1:
        start = data.rfind(b"\n", 0, i) + 1
        line += data.count(b"\n", at, start)
        at = start
        end = data.find(b"\n", i)
        if end == -1:
            end = len(data)
        for m in MARKER_RE.finditer(data, start, end):
            out.append(Marker(rel, line, m.group(1).decode()))
        i = data.find(b"opencoti-hook", end)
    return out
