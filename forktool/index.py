"""A stat index of a tree (path -> size, mtime_ns, ctime_ns, inode, sha256, mode), so unchanged files are not re-hashed."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

from forktool.tree import (
    EXECUTABLE,
    REGULAR,
    SYMLINK,
    Entry,
    Manifest,
    atomic_write,
    check_link,
    check_name,
    check_root,
    sha256_bytes,
    sha256_file,
    special_file,
)

INDEX_VERSION = 1

# an entry whose mtime is this close to the moment the index was taken may have changed again within the
# same clock tick without changing its stat fields ("racily clean", as git calls it): it is re-hashed
RACY_NS = 2_000_000_000

Stat = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode


def _stat_key(st: os.stat_result) -> Stat:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _load(path: Path, root: Path) -> tuple[dict[str, tuple[Stat, Entry]], int]:
    """The stored index, or nothing when it is missing, unreadable or made for another root."""
    try:
        raw = json.loads(path.read_bytes())
        if raw.get("version") != INDEX_VERSION or raw.get("root") != str(root):
            return {}, 0
        entries = {rel: ((int(v[0]), int(v[1]), int(v[2]), int(v[3])), Entry(str(v[4]), str(v[5])))
                   for rel, v in raw["entries"].items()}
        return entries, int(raw["taken_ns"])
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return {}, 0


def _save(index_path: Path, root: Path, taken_ns: int, entries: dict[str, tuple[Stat, Entry]]) -> None:
    """Write the index; failing to write it only costs speed next time."""
    data = {"version": INDEX_VERSION, "root": str(root), "taken_ns": taken_ns,
            "entries": {rel: [*k, en.sha256, en.mode] for rel, (k, en) in sorted(entries.items())}}
    try:
        atomic_write(index_path, json.dumps(data, separators=(",", ":")).encode(), durable=False)
    except OSError:
        pass


def scan_indexed(root: Path, index_path: Path) -> tuple[Manifest, int]:
    """The manifest of root, as tree.scan gives it, re-hashing only files whose stat changed.

    Returns (manifest, files hashed). The index is rewritten when the path set changed or a hashed file could be
    trusted from it next time; an entry modified within RACY_NS of now would be re-hashed from a new index as
    from the old one, so files written by the command just before do not make each command rewrite it.
    Failing to write it only costs speed next time.
    """
    old, taken_ns = _load(index_path, root)
    now_ns = time.time_ns()
    out: Manifest = {}
    new: dict[str, tuple[Stat, Entry]] = {}
    hashed = 0
    useful = False  # a hashed entry a new index would let the next scan trust
    check_root(root)
    if not root.exists():
        return out, 0
    stack = [(root, "")]
    while stack:
        d, prefix = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                rel = prefix + e.name
                check_name(rel, root)
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append((Path(e.path), rel + "/"))
                    continue
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    raise special_file(rel, root)
                if stat.S_ISLNK(st.st_mode):
                    check_link(rel, os.readlink(e.path), root)
                key = _stat_key(st)
                prev = old.get(rel)
                if stat.S_ISLNK(st.st_mode):
                    mode = SYMLINK
                else:
                    mode = EXECUTABLE if st.st_mode & stat.S_IXUSR else REGULAR
                if prev is not None and prev[0] == key and prev[1].mode == mode and st.st_mtime_ns < taken_ns - RACY_NS:
                    entry = prev[1]
                else:
                    hashed += 1
                    useful = useful or st.st_mtime_ns < now_ns - RACY_NS
                    if mode == SYMLINK:
                        entry = Entry(sha256_bytes(os.readlink(e.path).encode()), SYMLINK)
                    else:
                        entry = Entry(sha256_file(Path(e.path)), mode)
                out[rel] = entry
                new[rel] = (key, entry)
    if useful or set(new) != set(old):
        _save(index_path, root, now_ns, new)
    return out, hashed


def hash_indexed(root: Path, rels: list[str], index_path: Path) -> tuple[dict[str, str], int]:
    """(rel -> sha256 of each file root/rel that exists, links followed; files hashed), re-hashing only files
    whose stat changed.

    The same index format and racy-clean rule as scan_indexed, for a chosen list of files (a build's outputs)
    rather than a whole tree; the index keeps exactly the files found.
    """
    old, taken_ns = _load(index_path, root)
    now_ns = time.time_ns()
    out: dict[str, str] = {}
    new: dict[str, tuple[Stat, Entry]] = {}
    hashed = 0
    useful = False  # as in scan_indexed: rewrite only for a hashed entry the next call could trust
    for rel in dict.fromkeys(rels):
        path = root / rel
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        key = _stat_key(st)
        prev = old.get(rel)
        if prev is not None and prev[0] == key and st.st_mtime_ns < taken_ns - RACY_NS:
            entry = prev[1]
        else:
            hashed += 1
            useful = useful or st.st_mtime_ns < now_ns - RACY_NS
            entry = Entry(sha256_file(path), EXECUTABLE if st.st_mode & stat.S_IXUSR else REGULAR)
        out[rel] = entry.sha256
        new[rel] = (key, entry)
    if useful or set(new) != set(old):
        _save(index_path, root, now_ns, new)
    return out, hashed
