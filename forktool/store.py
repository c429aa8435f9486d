"""Content-addressed object store (sha256) shared by the pristine cache and backups."""

from __future__ import annotations

import os
from pathlib import Path

from forktool.errors import ForktoolError
from forktool.tree import atomic_write, sha256_bytes


class ObjectStore:
    def __init__(self, root: Path):
        self.root = root

    def path(self, sha: str) -> Path:
        return self.root / sha[:2] / sha[2:]

    def has(self, sha: str) -> bool:
        return self.path(sha).is_file()

    def put(self, data: bytes) -> str:
        sha = sha256_bytes(data)
        p = self.path(sha)
        if not p.is_file():
            atomic_write(p, data)
        return sha

    def missing(self, blobs: list[bytes]) -> list[tuple[Path, bytes]]:
        """(path, bytes) of the blobs not stored yet, each once: for tree.write_many, alone or with other files
        that must become durable in the same wait."""
        todo = {self.path(sha256_bytes(b)): b for b in blobs}
        return [(p, b) for p, b in todo.items() if not p.is_file()]

    def get(self, sha: str) -> bytes:
        p = self.path(sha)
        try:
            data = p.read_bytes()
        except FileNotFoundError as e:
            raise ForktoolError(f"object {sha[:12]} missing from the store", where=str(p),
                                hint="run `forktool vendor fetch` to rebuild the pristine cache") from e
        if sha256_bytes(data) != sha:
            raise ForktoolError(f"object {sha[:12]} is corrupt (checksum mismatch)", where=str(p),
                                hint=f"delete {p} and run `forktool vendor fetch` again")
        return data

    def size(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root):
            total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
        return total
