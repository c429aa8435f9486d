"""Content-addressed object store (sha256), shared by the pristine cache and backups: every read is verified."""

from __future__ import annotations

import os
from pathlib import Path

from forktool.errors import ForktoolError
from forktool.tree import atomic_write, holds, read_checked, sha256_bytes


class ObjectStore:
    def __init__(self, root: Path):
        self.root = root

    def path(self, sha: str) -> Path:
        return self.root / sha[:2] / sha[2:]

    def has(self, sha: str) -> bool:
        return self.path(sha).is_file()

    def intact(self, sha: str) -> bool:
        """The object is there, a regular file, and its bytes hash to its name (all read and hashed as a stream: never
        vouched for by a stat, and a large planted file is never held in memory)."""
        return holds(self.path(sha), sha)

    def discard(self, sha: str) -> None:
        """Remove a damaged copy of the object (other bytes, a link, a FIFO), so the next put writes it whole. A
        directory there is left for its owner: put then refuses it, naming it."""
        p = self.path(sha)
        if os.path.lexists(p) and not (p.is_dir() and not p.is_symlink()):
            p.unlink()

    def put(self, data: bytes) -> str:
        sha = sha256_bytes(data)
        p = self.path(sha)
        if not p.is_file():  # a copy there is taken as it is (every get checks it; vendor fetch repairs the pristine)
            if os.path.lexists(p):
                self.discard(sha)
            atomic_write(p, data)
        return sha

    def get(self, sha: str) -> bytes:
        p = self.path(sha)
        try:
            data = read_checked(p, sha)  # other bytes are found by a streamed hash, never held in memory
        except FileNotFoundError as e:
            raise ForktoolError(f"object {sha[:12]} missing from the store", where=str(p),
                                hint="run `forktool vendor fetch` to rebuild the pristine cache") from e
        except OSError as e:  # a FIFO, directory or device planted there, or unreadable: refused, never waited on
            raise ForktoolError(f"object {sha[:12]} cannot be read: {e.strerror}", where=str(p),
                                hint=f"delete {p} and run `forktool vendor fetch` again") from None
        if data is None:
            raise ForktoolError(f"object {sha[:12]} is corrupt (checksum mismatch)", where=str(p),
                                hint=f"delete {p} and run `forktool vendor fetch` again")
        return data

    def size(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root):
            total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
        return total
