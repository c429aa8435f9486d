"""The one safe way forktool reads tar archives: every member checked before anything is kept.

A member is refused when its name is absolute, climbs out with '..', is not UTF-8 or holds a control
character, is too long, names the same path twice, or passes through a file or a symlink; when it is a
device or FIFO; when a hard link names anything but an earlier regular file; and when a symlink,
resolved as a chain through the links already seen (as the filesystem would), points outside the root.
Nothing is written until the whole archive has passed.
"""

from __future__ import annotations

import io
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from forktool.errors import ForktoolError, UnsafePathError
from forktool.store import ObjectStore
from forktool.tree import EXECUTABLE, REGULAR, SYMLINK, Entry, Manifest, atomic_write

MAX_NAME = 4096
MAX_PART = 255
MAX_LINK_HOPS = 40
HINT = "the archive is unsafe; nothing was extracted"


@dataclass(frozen=True)
class Member:
    """One checked archive member: path relative to the root, kind, and its content or link target."""

    rel: str
    kind: str  # "file" | "symlink" | "dir"
    data: bytes = b""  # file content, or the symlink target as bytes
    executable: bool = False


def _unsafe(what: str, where: str) -> UnsafePathError:
    return UnsafePathError(what, where=where, hint=HINT)


def _split(name: str, where: str) -> list[str]:
    if any("\udc80" <= ch <= "\udcff" for ch in name):
        raise _unsafe(f"archive member {name!r} has a name that is not UTF-8", where)
    if any(ord(ch) < 32 or ch in "\\\x7f" for ch in name):
        raise _unsafe(f"archive member {name!r} has a control character or backslash in its name", where)
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(f"archive member {name!r} has an absolute name", where)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _unsafe(f"archive member {name!r} contains '..'", where)
    if len(name.encode()) > MAX_NAME or any(len(p.encode()) > MAX_PART for p in parts):
        raise _unsafe(f"archive member {name[:80]!r}... has a name too long for a file system", where)
    return parts


class _Tree:
    """What the archive would create, to resolve each member and link against the members before it."""

    def __init__(self, where: str):
        self.kinds: dict[str, str] = {}
        self.links: dict[str, str] = {}
        self.where = where

    def resolve(self, parts: list[str], hops: int = 0) -> list[str] | None:
        """The real path of parts once every link on the way is followed; None when it leaves the root."""
        out: list[str] = []
        todo = list(parts)
        while todo:
            part = todo.pop(0)
            if part == "..":
                if not out:
                    return None
                out.pop()
                continue
            if part in ("", "."):
                continue
            out.append(part)
            key = "/".join(out)
            if key in self.links:
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise _unsafe(f"archive link {key!r} loops", self.where)
                target = self.links[key]
                if target.startswith("/"):
                    return None
                out.pop()
                todo = target.split("/") + todo
        return out

    def add(self, parts: list[str], kind: str, name: str) -> str:
        rel = "/".join(parts)
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            k = self.kinds.get(parent)
            if k == "symlink":
                raise _unsafe(f"archive member {name!r} is placed through the symlink {parent!r}", self.where)
            if k == "file":
                raise _unsafe(f"archive member {name!r} needs {parent!r} to be a directory, but it is a file",
                              self.where)
            self.kinds.setdefault(parent, "dir")
        have = self.kinds.get(rel)
        if have is not None and not (have == "dir" and kind == "dir"):
            raise _unsafe(f"archive member {name!r} names {rel!r} again (as a {kind}, already a {have})", self.where)
        self.kinds[rel] = kind
        return rel


def open_tar(data: bytes | Path, where: str) -> tarfile.TarFile:
    try:
        if isinstance(data, Path):
            return tarfile.open(data, mode="r:*")
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise ForktoolError(f"{where}: not a readable tar archive ({e})", where=where,
                            hint="the archive is damaged or not a tar archive; nothing was extracted") from None


def members(data: bytes | Path, where: str, strip_top: bool = False, subdir: str = "") -> Iterator[Member]:
    """Every member under subdir (after dropping the top directory when strip_top), checked; see the module doc."""
    tree = _Tree(where)
    files: dict[str, Member] = {}
    sub = [p for p in subdir.split("/") if p] if subdir else []
    tar = open_tar(data, where)
    try:
        with tar:
            for m in tar:
                parts = _split(m.name, where)
                if m.ischr() or m.isblk() or m.isfifo():
                    raise _unsafe(f"archive member {m.name!r} is a device or fifo", where)
                if strip_top:
                    parts = parts[1:]
                if parts[: len(sub)] != sub or len(parts) <= len(sub):
                    continue
                parts = parts[len(sub):]
                if m.isdir():
                    tree.add(parts, "dir", m.name)
                    continue
                if m.issym():
                    rel = tree.add(parts, "symlink", m.name)
                    target = m.linkname
                    if any(ord(ch) < 32 or "\udc80" <= ch <= "\udcff" for ch in target):
                        raise _unsafe(f"archive link {m.name!r} has a control character in its target", where)
                    tree.links[rel] = target
                    if not target or target.startswith("/") or tree.resolve(parts[:-1] + target.split("/")) is None:
                        raise _unsafe(f"archive link {m.name!r} -> {target!r} leaves the root", where)
                    yield Member(rel, "symlink", target.encode())
                    continue
                if m.islnk():
                    tparts = _split(m.linkname, where)
                    if strip_top:
                        tparts = tparts[1:]
                    if tparts[: len(sub)] != sub:
                        raise _unsafe(f"archive link {m.name!r} -> {m.linkname!r} leaves the root", where)
                    trel = "/".join(tparts[len(sub):])
                    if trel not in files:
                        raise _unsafe(f"hard link {m.name!r} points at {m.linkname!r}, which is not an earlier "
                                      "regular file of the archive", where)
                    rel = tree.add(parts, "file", m.name)
                    files[rel] = Member(rel, "file", files[trel].data, files[trel].executable)
                    yield files[rel]
                    continue
                if not m.isfile():
                    raise _unsafe(f"archive member {m.name!r} has an unsupported type", where)
                rel = tree.add(parts, "file", m.name)
                f = tar.extractfile(m)
                assert f is not None
                files[rel] = Member(rel, "file", f.read(), bool(m.mode & 0o100))
                yield files[rel]
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise ForktoolError(f"{where}: the tar archive is damaged ({e})", where=where,
                            hint="nothing was extracted; fetch the archive again") from None


def extract_to_store(data: bytes, store: ObjectStore, where: str, *, strip_top: bool, subdir: str,
                     keep: Callable[[str], bool]) -> tuple[Manifest, int]:
    """(manifest of the kept members, count of members the filter skipped); bytes go to the object store only."""
    checked = list(members(data, where, strip_top, subdir))  # the whole archive passes before anything is kept
    manifest: Manifest = {}
    skipped = 0
    for m in checked:
        if m.kind == "dir":
            continue
        if not keep(m.rel):
            skipped += 1
            continue
        mode = SYMLINK if m.kind == "symlink" else (EXECUTABLE if m.executable else REGULAR)
        manifest[m.rel] = Entry(store.put(m.data), mode)
    return manifest, skipped


def extract_to_dir(archive: Path, dest: Path, where: str = "") -> None:
    """Every member of archive under dest (which must be empty or absent), checked before the first write."""
    checked = list(members(archive, where or str(archive)))
    dest.mkdir(parents=True, exist_ok=True)
    for m in checked:
        p = dest / m.rel
        if m.kind == "dir":
            p.mkdir(parents=True, exist_ok=True)
        elif m.kind == "symlink":
            p.parent.mkdir(parents=True, exist_ok=True)
            p.symlink_to(m.data.decode())
        else:
            atomic_write(p, m.data, EXECUTABLE if m.executable else REGULAR)
