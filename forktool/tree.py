"""Trees as data: safe relative paths, manifests of (path -> sha256, mode), digests, atomic file writes."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import NamedTuple

from forktool.errors import UnsafePathError

REGULAR = "100644"
EXECUTABLE = "100755"
SYMLINK = "120000"


class Entry(NamedTuple):
    """One file of a manifest (a tuple: built, compared and hashed at C speed over a thousand-file tree)."""

    sha256: str
    mode: str = REGULAR

    def to_json(self) -> list[str]:
        return [self.sha256, self.mode]


Manifest = dict[str, Entry]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_rel_path(rel: str, where: str = "") -> str:
    """Reject anything that could name a place outside the root; returns the normalised path."""
    if not rel or "\x00" in rel or "\\" in rel:
        raise UnsafePathError(f"invalid path {rel!r}", where=where, hint="paths must be plain relative POSIX paths")
    if rel.startswith("/"):
        raise UnsafePathError(f"absolute path {rel!r} is not allowed", where=where,
                              hint="paths must be relative to the vendored root")
    if any(part in ("..", ".", "") for part in rel.split("/")):
        raise UnsafePathError(f"path {rel!r} leaves or escapes the vendored root", where=where,
                              hint="remove '..' and '.' components")
    return rel


def resolve_inside(root: Path, rel: str, where: str = "") -> Path:
    """The on-disk path for rel under root, refusing symlinked parents or a symlink leaving root."""
    check_rel_path(rel, where)
    base = os.fspath(root)
    parts = rel.split("/")
    for i in range(1, len(parts)):  # plain strings: this runs for every file a command writes or restores
        if os.path.islink(os.path.join(base, *parts[:i])):
            raise UnsafePathError(f"{rel}: parent directory {'/'.join(parts[:i])} is a symlink", where=where,
                                  hint="forktool does not write through symlinks; replace the link with a directory")
    target = root / rel
    if os.path.islink(target):
        real = os.path.realpath(target)
        if os.path.commonpath([real, os.path.realpath(root)]) != os.path.realpath(root):
            raise UnsafePathError(f"{rel} is a symlink pointing outside the vendored root ({real})", where=where,
                                  hint="remove the symlink")
    return target


def scan(root: Path) -> Manifest:
    """Manifest of every regular file and symlink under root (directories are implied)."""
    out: Manifest = {}
    check_root(root)
    if not root.exists():
        return out
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                rel = Path(e.path).relative_to(root).as_posix()
                check_name(rel, root)
                if e.is_symlink():
                    target = os.readlink(e.path)
                    check_link(rel, target, root)
                    out[rel] = Entry(sha256_bytes(target.encode()), SYMLINK)
                elif e.is_dir():
                    stack.append(Path(e.path))
                elif e.is_file():
                    st = e.stat()
                    mode = EXECUTABLE if st.st_mode & stat.S_IXUSR else REGULAR
                    out[rel] = Entry(sha256_file(Path(e.path)), mode)
                else:
                    raise special_file(rel, root)
    return out


def check_root(root: Path) -> None:
    if root.is_symlink():
        raise UnsafePathError(f"{root} is a symlink; the vendored tree must be a real directory", where=str(root),
                              hint=f"remove the link (`rm {root}`) and run `forktool apply`")
    if os.path.lexists(root) and not root.is_dir():
        raise UnsafePathError(f"{root} is not a directory; the vendored tree must be a real directory",
                              where=str(root), hint=f"move it away (`mv {root} {root}.moved`) and run `forktool apply`")


def special_file(rel: str, root: Path) -> UnsafePathError:
    return UnsafePathError(f"{rel} in the vendored tree is not a file, directory or symlink (a FIFO, socket or "
                           "device)", where=str(root / rel),
                           hint=f"remove it (`rm {root / rel}`); forktool never reads such files")


def check_link(rel: str, target: str, root: Path) -> None:
    """A symlink in the vendored tree must point inside it, judged from its own directory (never followed)."""
    inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    if target.startswith("/") or inside == ".." or inside.startswith("../"):
        raise UnsafePathError(f"{rel} in the vendored tree is a symlink pointing outside it ({target})",
                              where=str(root / rel), hint=f"remove the link (`rm {root / rel}`)")


UNRECORDABLE = re.compile("[\n\r\\\\\udc80-\udcff]")  # newline, backslash, or a byte that is not UTF-8


def check_name(rel: str, root: Path) -> None:
    if UNRECORDABLE.search(rel):
        raise UnsafePathError(f"{rel!r} in the vendored tree has a name forktool cannot record (a newline, backslash "
                              "or bytes that are not UTF-8)", where=str(root),
                              hint="rename or remove that file")


def digest(manifest: Mapping[str, Entry]) -> str:
    h = hashlib.sha256()
    for path in sorted(manifest):
        e = manifest[path]
        h.update(f"{e.mode} {e.sha256} {path}\n".encode())
    return h.hexdigest()


def manifest_to_json(manifest: Mapping[str, Entry]) -> dict[str, list[str]]:
    return {p: manifest[p].to_json() for p in sorted(manifest)}


def manifest_from_json(raw: Mapping[str, list[str]]) -> Manifest:
    return {p: Entry(v[0], v[1]) for p, v in raw.items()}


def diff_manifests(old: Mapping[str, Entry], new: Mapping[str, Entry]) -> list[tuple[str, str]]:
    """Sorted (status, path) with status in added / removed / modified."""
    if old == new:  # the usual answer, found at C speed
        return []
    out = []
    for p in sorted(set(old) | set(new)):
        if p not in old:
            out.append(("added", p))
        elif p not in new:
            out.append(("removed", p))
        elif old[p] != new[p]:
            out.append(("modified", p))
    return out


# tempfile and shutil are not imported: with what they pull in (random, bz2, lzma) they cost every command about
# 4 ms of start-up, for the two small things below


TEMP_PREFIX, TEMP_SUFFIX = ".forktool-", ".tmp"  # the temporary file of one write: atomic_write's, and a journal's
STALE_TEMP_S = 600  # a temporary file untouched this long belongs to no running write: one lasts seconds at most


def make_temp(parent: Path, prefix: str = TEMP_PREFIX, suffix: str = TEMP_SUFFIX) -> tuple[int, str]:
    """A new file with a random name in parent, open for writing (as tempfile's mkstemp: O_EXCL, mode 0600)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        name = os.path.join(parent, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            return os.open(name, flags, 0o600), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {parent}")


def stale_temps(top: Path, *, depth: int, now: float, skip: frozenset[str] = frozenset()) -> list[Path]:
    """The temporary files of writes cut short by a kill, in top and up to `depth` directory levels below it (not
    into `skip`ped names, never through a link): regular files named as make_temp names them, untouched for
    STALE_TEMP_S. A directory that cannot be read is passed over."""
    found: list[Path] = []
    try:
        entries = list(os.scandir(top))
    except OSError:
        return found
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                if depth > 0 and e.name not in skip:
                    found += stale_temps(Path(e.path), depth=depth - 1, now=now, skip=skip)
            elif (e.name.startswith(TEMP_PREFIX) and e.name.endswith(TEMP_SUFFIX) and e.is_file(follow_symlinks=False)
                  and now - e.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S):
                found.append(Path(e.path))
        except OSError:
            continue
    return found


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A new directory with a random name in parent (as tempfile's mkdtemp: mode 0700)."""
    for _ in range(100):
        path = parent / f"{prefix}{os.urandom(6).hex()}"
        try:
            path.mkdir(0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {parent}")


def remove_tree(path: Path | str) -> None:
    """Remove a directory and everything under it, never following a symlink (as shutil's rmtree)."""
    for d, dirs, files in os.walk(path, topdown=False, onerror=_raise):
        for n in files:
            os.unlink(os.path.join(d, n))
        for n in dirs:
            p = os.path.join(d, n)
            if os.path.islink(p):
                os.unlink(p)
            else:
                os.rmdir(p)
    os.rmdir(path)


def _raise(e: OSError) -> None:
    raise e


def pid_alive(pid: int) -> bool:
    """Is process pid running? (another user's process counts as running)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_dead_work_dirs(parent: Path, shape: re.Pattern[str]) -> list[str]:
    """Remove the work directories in parent that a kill left: those whose name matches shape, group 1 the id of the
    process that made them, and whose process is gone. A link, a file or another name is never touched; one that
    cannot be removed is left for the next run. Their names."""
    gone: list[str] = []
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return gone
    for p in entries:
        m = shape.match(p.name)
        if m and not pid_alive(int(m.group(1))) and p.is_dir() and not p.is_symlink():
            try:
                remove_tree(p)
            except OSError:
                continue
            gone.append(p.name)
    return gone


class NotRegularFileError(OSError):
    """Where forktool reads or writes a file, something else is (a FIFO, device, socket or directory). An OSError,
    so that a cache which treats an unreadable entry as absent treats this one so too; the CLI reports it as a
    refusal (exit 1) naming the path."""


def file_kind(mode: int) -> str:
    """What a stat mode that is not a regular file is, in words."""
    return ("directory" if stat.S_ISDIR(mode) else "FIFO" if stat.S_ISFIFO(mode) else
            "socket" if stat.S_ISSOCK(mode) else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "special file")


def _open_regular(path: Path) -> io.BufferedReader:
    """path opened for reading when it is a regular file (a last symlink is followed). Anything else raises
    NotRegularFileError before it is opened, and the file is opened without blocking and checked again once open, so
    a FIFO planted where a cache entry or a state file belongs is refused, never waited on."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(errno.EINVAL, f"a {file_kind(st.st_mode)} where a file belongs", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # swapped since the stat
        os.close(fd)
        raise NotRegularFileError(errno.EINVAL, f"a {file_kind(mode)} where a file belongs", str(path))
    return os.fdopen(fd, "rb")


def read_file(path: Path) -> bytes:
    """The bytes of the regular file at path (see _open_regular: anything else is refused, never waited on)."""
    with _open_regular(path) as f:
        return f.read()


def read_checked(path: Path, sha: str) -> bytes | None:
    """The bytes of the regular file at path when they hash to sha, else None. Hashed as a stream first, so a file of
    other bytes, however large, is never held in memory; then read whole from the same open file and hashed again:
    what is returned is what was checked. OSError (NotRegularFileError for a FIFO, directory or device) when it cannot
    be read."""
    with _open_regular(path) as f:
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        if h.hexdigest() != sha:
            return None
        f.seek(0)
        data = f.read()
    return data if sha256_bytes(data) == sha else None


def sha256_regular(path: Path) -> str:
    """sha256 of the regular file at path, hashed as a stream (see _open_regular: anything else is refused)."""
    h = hashlib.sha256()
    with _open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def holds(path: Path, sha: str) -> bool:
    """Does the file at path hold the bytes of sha? (hashed as a stream, opened without blocking: a FIFO or directory
    there holds nothing, and is never waited on; an empty sha is held by nothing)"""
    if not sha:
        return False
    try:
        return sha256_regular(path) == sha
    except OSError:  # missing, unreadable, or not a regular file
        return False


@contextmanager
def signals_held(*caught: int) -> Iterator[None]:
    """The signals in caught that arrive inside the block are delivered when it ends, each once, to the handler it
    had before (SIGKILL cannot be held). Handlers can be set in the main thread only: elsewhere nothing is held."""
    import signal

    pending: list[int] = []
    prev: dict[int, object] = {}
    try:
        for sig in caught:
            prev[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, handler in prev.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # type: ignore[arg-type]
        for signum in dict.fromkeys(pending):
            os.kill(os.getpid(), signum)


def atomic_write(path: Path, data: bytes, mode: str = REGULAR, *, durable: bool = True,
                 temp_dir: Path | None = None) -> None:
    """Write via a temp file in the same directory (or temp_dir, on the same filesystem) and os.replace it into place.

    durable=False skips the fsync: for caches only (a stat index, a derived value), whose loss or truncation after
    a crash costs a recomputation and is detected by their own checks; never for state, plans or backups.
    temp_dir: where a kill before the rename leaves the temp file (a journal puts it inside itself, so that its
    removal takes it).
    A durable write holds a SIGTERM or SIGHUP, which run no clean-up, until the file is in place (a Ctrl-C removes
    the temp file on its way out): only a SIGKILL can leave its temp file in registry/, vendor/ or patches/. A
    cache write does not wait (holding costs it about 5 %); what a signal leaves there is never read.
    """
    import signal

    path.parent.mkdir(parents=True, exist_ok=True)
    with signals_held(signal.SIGTERM, signal.SIGHUP) if durable else nullcontext():
        fd, tmp = make_temp(temp_dir or path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.chmod(tmp, 0o755 if mode == EXECUTABLE else 0o644)
            try:
                os.replace(tmp, path)
            except IsADirectoryError:  # a directory where this file belongs: not replaced, and said so
                raise NotRegularFileError(errno.EISDIR, "a directory where a file belongs", str(path)) from None
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def run_all(fn: Callable[..., object], items: Sequence[object], lanes: int = 8) -> None:
    """fn(item) for every item, on up to `lanes` threads; after all have run, raises the first exception.

    For system calls that mostly wait on the filesystem (fsync, a rename that frees the replaced file's blocks):
    they release the interpreter lock, and the filesystem serves concurrent ones together. The calling thread
    runs one lane, plain threads started for this call run the others and are joined before it returns. Not a
    concurrent.futures pool: its import loads logging (with traceback, tokenize, textwrap), about 7 ms of every
    `apply` and `unapply`; a tree move's three calls with a pool took 9.2 ms of CPU, with threads started per
    call 3.2 ms (medians of 21 processes, both with their imports).
    """
    import threading

    errors: list[Exception] = []
    lanes = min(len(items), lanes)

    def lane(k: int) -> None:
        for item in items[k::lanes]:
            try:
                fn(item)
            except Exception as e:  # handed to the calling thread below
                errors.append(e)

    others = [threading.Thread(target=lane, args=(k,), name="forktool-lane", daemon=True) for k in range(1, lanes)]
    for t in others:
        t.start()
    if lanes:
        lane(0)
    for t in others:
        t.join()
    if errors:
        raise errors[0]


def fsync_all(fds: list[int]) -> None:
    """fsync every descriptor, several at once: the filesystem commits concurrent fsyncs together, so the
    update waits for about one disk flush instead of one per file. Raises the first failure."""
    run_all(os.fsync, fds)


# files open at once while they wait for one fsync together (well under the usual limit of 1024 descriptors)
FSYNC_BATCH = 256


def write_many(items: list[tuple[Path, bytes]]) -> None:
    """atomic_write for several files: every temp file of a batch is written and all are fsynced together before
    any is renamed into place, so each file appears whole and durable, as with atomic_write."""
    for i in range(0, len(items), FSYNC_BATCH):
        _write_batch(items[i:i + FSYNC_BATCH])


def _write_batch(items: list[tuple[Path, bytes]]) -> None:
    fds: list[int] = []
    temps: list[tuple[str, Path]] = []
    try:
        try:
            for path, data in items:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = make_temp(path.parent)
                fds.append(fd)
                temps.append((tmp, path))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            fsync_all(fds)
        finally:
            for fd in fds:
                os.close(fd)
        for tmp, path in temps:
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise


def remove_empty_parents(root: Path, paths: Iterable[str]) -> None:
    for rel in paths:
        d = (root / rel).parent
        while d != root and d.is_dir() and not any(d.iterdir()):
            d.rmdir()
            d = d.parent
