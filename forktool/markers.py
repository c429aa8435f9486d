"""`opencoti-hook:` markers: find them in patches and in the vendored tree."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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


def markers_in_patch(patch: Patch) -> list[Marker]:
    """Markers on added lines, with their line numbers in the patched file."""
    return [Marker(f.path, n, m.group(1).decode()) for f in patch.files for n, t in f.added_lines()
            for m in MARKER_RE.finditer(t)]


def scan_file(rel: str, data: bytes) -> list[Marker]:
    if b"opencoti-hook" not in data:
        return []
    out = []
    for n, line in enumerate(data.split(b"\n"), 1):
        for m in MARKER_RE.finditer(line):
            out.append(Marker(rel, n, m.group(1).decode()))
    return out


def scan_tree(tree: Path, paths: list[str]) -> list[Marker]:
    out = []
    for rel in sorted(paths):
        p = tree / rel
        if p.is_file() and not p.is_symlink():
            out.extend(scan_file(rel, p.read_bytes()))
    return out
