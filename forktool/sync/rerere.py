"""Remembered conflict resolutions, keyed by a conflict block's two sides, kept across --abort and offered again."""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from forktool.tree import atomic_write, read_file

OURS, BASE, THEIRS, END = b"<<<<<<< ", b"||||||| ", b"=======", b">>>>>>> "


@dataclass(frozen=True)
class Block:
    start: int  # index of the `<<<<<<<` line
    end: int  # index of the `>>>>>>>` line
    ours: bytes
    theirs: bytes

    @property
    def key(self) -> str:
        # the base is left out, as git's rerere does: the same two sides meet again after the base moves
        return hashlib.sha256(b"forktool-rerere\0" + self.ours + b"\0" + self.theirs).hexdigest()


def blocks(lines: list[bytes]) -> list[Block]:
    """The diff3 blocks of a merge result split into lines (each keeping its newline)."""
    out = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(OURS):
            i += 1
            continue
        start, part = i, "ours"
        sides: dict[str, list[bytes]] = {"ours": [], "base": [], "theirs": []}
        i += 1
        while i < len(lines) and not lines[i].startswith(END):
            ln = lines[i]
            if part == "ours" and ln.startswith(BASE):
                part = "base"
            elif part in ("ours", "base") and ln.rstrip(b"\r\n") == THEIRS:
                part = "theirs"
            else:
                sides[part].append(ln)
            i += 1
        if i < len(lines):
            out.append(Block(start, i, b"".join(sides["ours"]), b"".join(sides["theirs"])))
        i += 1
    return out


class Memory:
    """One file per resolution under .opencoti/sync/rerere/: the project's own state, as git's rr-cache is."""

    def __init__(self, root: Path):
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, b: Block) -> bytes | None:
        try:
            raw = json.loads(read_file(self._path(b.key)).decode("utf-8"))
            if raw["ours"] == b.ours.decode("utf-8") and raw["theirs"] == b.theirs.decode("utf-8"):
                return str(raw["resolution"]).encode("utf-8")
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            pass  # unreadable or another conflict under the same name: nothing is offered
        return None

    def put(self, b: Block, resolution: bytes, where: str) -> bool:
        """Remember one resolution; False when it was already known."""
        if self.get(b) == resolution:
            return False
        try:
            text = {"ours": b.ours.decode("utf-8"), "theirs": b.theirs.decode("utf-8"),
                    "resolution": resolution.decode("utf-8"), "where": where}
        except UnicodeDecodeError:
            return False  # only text conflicts are remembered
        atomic_write(self._path(b.key), json.dumps(text, indent=1, sort_keys=True).encode())
        return True

    def count(self) -> int:
        """Remembered blocks and whole files."""
        if not self.root.is_dir():
            return 0
        files = [p for p in (self.root / "files").glob("*/*") if p.name != "name.json"]
        return len(list(self.root.glob("*.json"))) + len(files)

    # whole files: how a file read when the stop at a patch left it, and how the maintainer left it (edits
    # outside the conflict blocks included); given back only at a stop at the same patch where the same file
    # reads exactly the same

    def _file_dir(self, patch: str, rel: str) -> Path:
        return self.root / "files" / hashlib.sha256(f"{patch}\0{rel}".encode()).hexdigest()

    def put_file(self, patch: str, rel: str, pre: bytes, post: bytes) -> bool:
        d = self._file_dir(patch, rel)
        target = d / hashlib.sha256(pre).hexdigest()
        if target.is_file() and target.read_bytes() == post:
            return False
        atomic_write(d / "name.json", json.dumps({"patch": patch, "file": rel}).encode())
        atomic_write(target, post)
        return True

    def get_file(self, patch: str, rel: str, pre: bytes) -> bytes | None:
        try:
            return read_file(self._file_dir(patch, rel) / hashlib.sha256(pre).hexdigest())
        except OSError:
            return None

    def file_names(self, patch: str) -> list[str]:
        """The files with a remembered whole-file resolution at a stop at this patch."""
        out = []
        for d in sorted((self.root / "files").glob("*/name.json")) if (self.root / "files").is_dir() else []:
            try:
                raw = json.loads(read_file(d).decode("utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(raw, dict) and raw.get("patch") == patch and isinstance(raw.get("file"), str):
                out.append(raw["file"])
        return out

    def replay(self, merged: bytes) -> tuple[bytes, int]:
        """The merge result with every block this memory knows replaced by its resolution; (text, how many)."""
        lines = merged.splitlines(keepends=True)
        out: list[bytes] = []
        used = 0
        at = 0
        for b in blocks(lines):
            res = self.get(b)
            if res is None:
                continue
            out += lines[at:b.start]
            out.append(res)
            at = b.end + 1
            used += 1
        out += lines[at:]
        return b"".join(out), used

    def harvest(self, pre: bytes, post: bytes, where: str) -> int:
        """Remember how each block of pre (the text written at the stop) reads in post (the text now): the lines
        between the nearest unchanged lines around it. Blocks still holding markers are not remembered."""
        a, b = pre.splitlines(keepends=True), post.splitlines(keepends=True)
        same: dict[int, int] = {}
        for tag, i1, i2, j1, _j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
            if tag == "equal":
                for k in range(i2 - i1):
                    same[i1 + k] = j1 + k
        kept = 0
        for blk in blocks(a):
            before = max((i for i in same if i < blk.start), default=None)
            after = min((i for i in same if i > blk.end), default=None)
            lo = same[before] + 1 if before is not None else 0
            hi = same[after] if after is not None else len(b)
            res = b"".join(b[lo:hi])
            if any(ln.startswith((OURS, BASE, END)) or ln.rstrip(b"\r\n") == THEIRS for ln in b[lo:hi]):
                continue
            kept += self.put(blk, res, where)
        return kept
