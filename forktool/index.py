"""A stat index of a tree (path -> size, mtime_ns, ctime_ns, inode, sha256, mode), so unchanged files are not re-hashed."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from forktool.cache import seal, unseal
from forktool.tree import (
    EXECUTABLE,
    REGULAR,
    SYMLINK,
    UNRECORDABLE,
    Entry,
    Manifest,
    atomic_write,
    check_link,
    check_name,
    check_root,
    read_file,
    sha256_bytes,
    sha256_file,
    special_file,
)

INDEX_VERSION = 2
MAGIC = b"forktool-index\n"

# an entry whose mtime is this close to the moment the index was taken may have changed again within the
# same clock tick without changing its stat fields ("racily clean", as git calls it): it is re-hashed
RACY_NS = 2_000_000_000

Stat = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode


def _stat_key(st: os.stat_result) -> Stat:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


# The file: MAGIC, then cache.seal of (INDEX_VERSION, root, taken_ns, {rel: (size, mtime_ns, ctime_ns, inode,
# sha256, mode)}): the sha256 (hex) of the marshal body, a newline, the body. marshal of plain tuples loads about four
# times as fast as the same JSON; the checksum is verified first, so a torn or damaged file never reaches
# marshal.loads and is treated as no index (everything is hashed again).
Row = tuple[int, int, int, int, str, str]


def _load(path: Path, root: Path) -> tuple[dict[str, Row], int]:
    """The stored index, or nothing when it is missing, damaged, of another version or made for another root."""
    try:
        data = read_file(path)
        if not data.startswith(MAGIC):
            return {}, 0
        version, where, taken_ns, entries = unseal(memoryview(data)[len(MAGIC):])  # type: ignore[misc]
        if version != INDEX_VERSION or where != str(root) or type(taken_ns) is not int or type(entries) is not dict:
            return {}, 0
        return entries, taken_ns
    except (OSError, ValueError, EOFError, TypeError):
        return {}, 0


def _save(index_path: Path, root: Path, taken_ns: int, entries: dict[str, Row]) -> None:
    """Write the index; failing to write it only costs speed next time."""
    try:
        atomic_write(index_path, MAGIC + seal((INDEX_VERSION, str(root), taken_ns, entries)), durable=False)
    except OSError:
        pass


_IFMT, _IFDIR, _IFREG, _IFLNK, _IXUSR = 0o170000, stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK, stat.S_IXUSR


def scan_indexed(root: Path, index_path: Path) -> tuple[Manifest, int]:
    """The manifest of root, as tree.scan gives it, re-hashing only files whose stat changed.

    Returns (manifest, files hashed). The index is rewritten when the path set changed or a hashed file could be
    trusted from it next time; an entry modified within RACY_NS of now would be re-hashed from a new index as
    from the old one, so files written by the command just before do not make each command rewrite it.
    Failing to write it only costs speed next time.
    """
    old, taken_ns = _load(index_path, root)
    now_ns = time.time_ns()
    trusted_before = taken_ns - RACY_NS
    out: Manifest = {}
    new: dict[str, Row] = {}
    hashed = 0
    useful = False  # a hashed entry a new index would let the next scan trust
    check_root(root)
    if not root.exists():
        return out, 0
    get = old.get
    unrecordable = UNRECORDABLE.search
    entry = tuple.__new__  # Entry(sha, mode) without a Python-level call per file
    stack = [(os.fspath(root), "")]
    while stack:  # this loop runs once per file of the tree at every command: plain strings and ints only
        d, prefix = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                rel = prefix + e.name
                if unrecordable(rel):
                    check_name(rel, root)
                st = e.stat(follow_symlinks=False)
                kind = st.st_mode & _IFMT
                if kind == _IFDIR:
                    stack.append((e.path, rel + "/"))
                    continue
                if kind == _IFREG:
                    mode = EXECUTABLE if st.st_mode & _IXUSR else REGULAR
                elif kind == _IFLNK:
                    check_link(rel, os.readlink(e.path), root)
                    mode = SYMLINK
                else:
                    raise special_file(rel, root)
                prev = get(rel)
                mtime = st.st_mtime_ns
                if (type(prev) is tuple and len(prev) == 6 and prev[0] == st.st_size and prev[1] == mtime
                        and prev[2] == st.st_ctime_ns and prev[3] == st.st_ino and prev[5] == mode
                        and type(prev[4]) is str and mtime < trusted_before):
                    out[rel] = entry(Entry, (prev[4], mode))
                    new[rel] = prev
                    continue
                hashed += 1
                useful = useful or mtime < now_ns - RACY_NS
                sha = sha256_bytes(os.readlink(e.path).encode()) if mode == SYMLINK else sha256_file(Path(e.path))
                out[rel] = entry(Entry, (sha, mode))
                new[rel] = (st.st_size, mtime, st.st_ctime_ns, st.st_ino, sha, mode)
    if useful or new.keys() != old.keys():
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
    new: dict[str, Row] = {}
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
        mode = EXECUTABLE if st.st_mode & stat.S_IXUSR else REGULAR
        prev = old.get(rel)
        if (type(prev) is tuple and len(prev) == 6 and prev[:4] == key and type(prev[4]) is str
                and st.st_mtime_ns < taken_ns - RACY_NS):
            sha = prev[4]
        else:
            hashed += 1
            useful = useful or st.st_mtime_ns < now_ns - RACY_NS
            sha = sha256_file(path)
        out[rel] = sha
        new[rel] = (*key, sha, mode)
    if useful or new.keys() != old.keys():
        _save(index_path, root, now_ns, new)
    return out, hashed
