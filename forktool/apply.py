"""Exact-context hunk application in memory: a hunk applies at its place or at a reported offset, never fuzzily."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from forktool.errors import ApplyError, ContextError
from forktool.series import FileDiff, Hunk, Patch, split_lines


class Drift(NamedTuple):
    patch: str
    path: str
    hunk: int
    offset: int

    def to_json(self) -> dict[str, object]:
        return {"patch": self.patch, "file": self.path, "hunk": self.hunk, "offset": self.offset}


class Applied:
    """Contents after applying patches: path -> bytes (None = deleted/absent), and the drift seen."""

    __slots__ = ("files", "drift", "digests")

    def __init__(self, files: dict[str, bytes | None] | None = None, drift: dict[str, list[Drift]] | None = None):
        self.files: dict[str, bytes | None] = {} if files is None else files
        self.drift: dict[str, list[Drift]] = {} if drift is None else drift
        # path -> sha256 of files[path], where it is already known (read back from a remembered result and
        # checked); not part of the value: whoever changes files keeps it or leaves it out
        self.digests: dict[str, str] = {}


Reader = Callable[[str], bytes | None]


def _find(lines: list[bytes], block: list[bytes], expected: int, lo: int, at_start: bool = False,
          at_end: bool = False) -> int | None:
    """Position of block in lines at or after lo, nearest to expected; None when absent. at_start / at_end: the
    block may stand only at the beginning / only at the end of lines."""
    n = len(block)
    if at_start or at_end:
        at = 0 if at_start else len(lines) - n
        return at if lo <= at and lines[at:at + n] == block else None
    if 0 <= expected <= len(lines) - n and expected >= lo and lines[expected:expected + n] == block:
        return expected
    best: int | None = None
    if n == 0:
        return max(lo, min(expected, len(lines)))
    first = block[0]
    for i in range(lo, len(lines) - n + 1):
        if lines[i] == first and lines[i:i + n] == block:
            if best is None or abs(i - expected) < abs(best - expected):
                best = i
            elif i > expected:
                break
    return best


def _first_difference(lines: list[bytes], block: list[bytes], at: int) -> str:
    for k, want in enumerate(block):
        got = lines[at + k] if 0 <= at + k < len(lines) else None
        if got != want:
            shown = "end of file" if got is None else repr(got.decode("utf-8", "replace").rstrip("\n"))
            return (f"line {at + k + 1}: expected {want.decode('utf-8', 'replace').rstrip(chr(10))!r}, "
                    f"found {shown}")
    return f"line {at + 1}: block not found"


def _anchors(h: Hunk) -> tuple[bool, bool]:
    """Where a hunk is tied to, as GNU patch reads it: one with less context before its change than after it
    belongs at the beginning of the file, one with less after than before at the end (the context stopped there
    because the file did). Anywhere else it would be the same lines in another place, not an offset."""
    ops = [op for op, _ in h.lines]
    lead = next((i for i, op in enumerate(ops) if op != b" "), len(ops))
    trail = next((i for i, op in enumerate(reversed(ops)) if op != b" "), len(ops))
    return lead < trail, trail < lead


def apply_file(patch: Patch, fd: FileDiff, content: bytes | None) -> tuple[bytes | None, list[Drift]]:
    where = f"patch {patch.name}, file {fd.path}"
    if fd.is_new:
        if content is not None:
            raise ApplyError(f"{fd.path} already exists but {patch.name} creates it", where=where,
                             hint=f"the file was added upstream or by an earlier patch: edit patches/{patch.name} "
                                  "so that it changes the file instead of creating it, or drop that file from it")
        return b"".join(t for h in fd.hunks for t in h.new_lines()), []
    if content is None:
        raise ApplyError(f"{fd.path} does not exist", where=where,
                         hint=f"upstream removed or moved it, or an earlier patch deleted it (or it never existed): "
                              f"correct the path in patches/{patch.name}, or drop that file from it")
    lines = split_lines(content)
    out: list[bytes] = []
    pos = 0  # first line of `lines` not yet copied
    shift = 0  # drift carried from earlier hunks of this file
    drift: list[Drift] = []
    for number, h in enumerate(fd.hunks, 1):
        old = h.old_lines()
        base = h.old_start - 1 if h.old_count else h.old_start
        expected = base + shift
        at_start, at_end = _anchors(h)
        at = _find(lines, old, expected, pos, at_start, at_end)
        if at is None:
            err = ContextError(
                f"hunk #{number} of {fd.path} does not apply (exact context only, no fuzz"
                + (", at the beginning of the file" if at_start else ", at the end of the file" if at_end else "")
                + ")",
                where=f"{where}, hunk #{number} (@@ -{h.old_start},{h.old_count})",
                details=[_first_difference(lines, old, max(expected, pos))],
                hint="the upstream text changed here: edit the tree at this place and run `forktool refresh "
                     f"{patch.id}`, or let `forktool sync` report it")
            err.patch, err.path = patch.name, fd.path
            raise err
        shift = at - base
        if shift:
            drift.append(Drift(patch.id, fd.path, number, shift))
        out.extend(lines[pos:at])
        out.extend(h.new_lines())
        pos = at + len(old)
    out.extend(lines[pos:])
    if fd.is_deleted:
        if out:
            raise ApplyError(f"{fd.path} is not empty after removing the patch's lines", where=where,
                             hint="upstream added lines to a file the patch deletes; refresh the patch")
        return None, drift
    return b"".join(out), drift


def apply_patch(patch: Patch, read: Reader, into: Applied) -> None:
    """Apply one patch on top of `into` (falling back to `read` for untouched files)."""
    results: dict[str, bytes | None] = {}
    drift: list[Drift] = []
    for fd in patch.files:
        current = into.files[fd.path] if fd.path in into.files else read(fd.path)
        results[fd.path], d = apply_file(patch, fd, current)
        drift.extend(d)
    into.files.update(results)
    for rel in results:
        into.digests.pop(rel, None)
    into.drift[patch.id] = drift


def apply_series(patches: list[Patch], read: Reader, into: Applied | None = None) -> Applied:
    """Apply patches in order on top of `into` (default: nothing applied yet); raises at the first failure."""
    state = into if into is not None else Applied()
    for p in patches:
        apply_patch(p, read, state)
    return state


class FileOutcome(NamedTuple):
    """One file of a patch tried on its own: the new bytes and drift, or the error that stopped it."""

    path: str
    content: bytes | None
    drift: list[Drift]
    error: ApplyError | None = None


def try_patch(patch: Patch, read: Reader, into: Applied | None = None) -> list[FileOutcome]:
    """Try every file of one patch on top of `into` (falling back to `read`), never raising, changing nothing.

    For callers that classify rather than stop (an upstream trial): each file's outcome is independent; apply
    the patch with apply_patch, or record the outcomes into an Applied with `record`, when they all succeeded.
    """
    out = []
    for fd in patch.files:
        current = into.files[fd.path] if into is not None and fd.path in into.files else read(fd.path)
        try:
            content, drift = apply_file(patch, fd, current)
            out.append(FileOutcome(fd.path, content, drift))
        except ApplyError as e:
            out.append(FileOutcome(fd.path, current, [], e))
    return out


def record(patch_id: str, outcomes: list[FileOutcome], into: Applied) -> None:
    """Put the successful outcomes of try_patch into `into` (failed files keep their contents)."""
    into.files.update({o.path: o.content for o in outcomes if o.error is None})
    for o in outcomes:
        into.digests.pop(o.path, None)
    into.drift[patch_id] = [d for o in outcomes for d in o.drift]


def reverse(h: Hunk) -> Hunk:
    flip = {b"+": b"-", b"-": b"+", b" ": b" "}
    return Hunk(h.new_start, h.new_count, h.old_start, h.old_count, [(flip[op], t) for op, t in h.lines])
