"""The series file and patches in canonical form: parse, format, and generate diffs, all in bytes."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from forktool.errors import ConfigError, PatchFormatError
from forktool.tree import EXECUTABLE, REGULAR, check_rel_path, sha256_bytes

FROM_LINE = b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
NAME_RE = re.compile(r"^(\d{4})-([a-z0-9][a-z0-9._-]*)\.patch$")
HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
NO_EOL = b"\\ No newline at end of file"
ZERO = "0" * 40
CONTEXT = 3


# ---------------------------------------------------------------- series


class SeriesEntry(NamedTuple):
    id: str
    name: str
    line: int


def read_series(path: Path) -> list[SeriesEntry]:
    from forktool import schema
    text = schema.decode(schema.read_regular(path, "patches/series", schema.CONFIG_LIMIT, path.parent.parent,
                                             "create it (one patch name a line)"), path, "patches/series")
    if "\r" in text:  # splitlines would read CRLF as LF, and `forktool new` would write the file back with LF
        n = text[: text.index("\r")].count("\n") + 1
        raise ConfigError("patches/series contains CR (CRLF line endings); the series uses LF only, as patches do",
                          where=f"{path}:{n}", hint="convert it with `sed -i 's/\\r$//' patches/series` (or "
                          "`dos2unix patches/series`) and run the command again; nothing was changed")
    out: list[SeriesEntry] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        # quilt allows options after the name (-p1); forktool patches are always -p1
        name = line.split()[0]
        rest = line.split()[1:]
        m = NAME_RE.match(name)
        if not m:  # checked first: a line of words is a bad name before it is a name with options
            raise ConfigError(f"bad patch name {name!r}" + (f" (the line is {line[:80]!r})" if rest else ""),
                              where=f"{path}:{n}", hint="one patch file name a line, NNNN-slug.patch (four digits, "
                              "lowercase slug); comment the rest out with `#`")
        if rest and rest != ["-p1"]:
            raise ConfigError(f"unsupported series option(s) {' '.join(rest)!r}", where=f"{path}:{n}",
                              hint=f"forktool patches are -p1 only: leave `{name}` alone on the line")
        pid = m.group(1)
        if pid in seen:
            first = out[[e.id for e in out].index(pid)].name
            raise ConfigError(f"duplicate patch id {pid}: {name} (line {n}) and {first} (line {seen[pid]})",
                              where=f"{path}:{n}", hint="a patch id appears once in the series: remove or "
                              "comment out one of the two lines, or give one patch a free id")
        seen[pid] = n
        out.append(SeriesEntry(pid, name, n))
    return out


# ---------------------------------------------------------------- patch model


class Hunk:
    __slots__ = ("old_start", "old_count", "new_start", "new_count", "lines")

    def __init__(self, old_start: int, old_count: int, new_start: int, new_count: int,
                 lines: list[tuple[bytes, bytes]]):
        self.old_start = old_start
        self.old_count = old_count
        self.new_start = new_start
        self.new_count = new_count
        # (op, text) with op in b" -+" and text including its b"\n" unless it ends a file without one
        self.lines = lines

    def __eq__(self, other: object) -> bool:
        return type(other) is Hunk and ((self.old_start, self.old_count, self.new_start, self.new_count, self.lines)
                                        == (other.old_start, other.old_count, other.new_start, other.new_count,
                                            other.lines))

    def old_lines(self) -> list[bytes]:
        return [t for op, t in self.lines if op in b" -"]

    def new_lines(self) -> list[bytes]:
        return [t for op, t in self.lines if op in b" +"]


class FileDiff:
    __slots__ = ("path", "old_mode", "new_mode", "old_index", "new_index", "hunks")

    def __init__(self, path: str, old_mode: str | None, new_mode: str | None, old_index: str = ZERO,
                 new_index: str = ZERO, hunks: list[Hunk] | None = None):
        self.path = path
        self.old_mode = old_mode  # None: file is new
        self.new_mode = new_mode  # None: file is deleted
        self.old_index = old_index
        self.new_index = new_index
        self.hunks: list[Hunk] = [] if hunks is None else hunks

    def __eq__(self, other: object) -> bool:
        return type(other) is FileDiff and ((self.path, self.old_mode, self.new_mode, self.old_index, self.new_index,
                                             self.hunks) == (other.path, other.old_mode, other.new_mode,
                                                             other.old_index, other.new_index, other.hunks))

    @property
    def is_new(self) -> bool:
        return self.old_mode is None

    @property
    def is_deleted(self) -> bool:
        return self.new_mode is None


class Patch:
    __slots__ = ("id", "name", "header", "files", "raw")

    def __init__(self, id: str, name: str, header: bytes, files: list[FileDiff], raw: bytes = b""):
        self.id = id
        self.name = name
        self.header = header  # everything before the b"---\n" separator
        self.files = files
        self.raw = raw

    def __eq__(self, other: object) -> bool:
        return type(other) is Patch and ((self.id, self.name, self.header, self.files, self.raw)
                                         == (other.id, other.name, other.header, other.files, other.raw))

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.raw or format_patch(self))

    @property
    def diff_sha256(self) -> str:
        """Digest of the diff part alone: a message-only edit leaves it unchanged."""
        return sha256_bytes(b"".join(format_file(f) for f in sorted(self.files, key=lambda f: f.path)))

    @property
    def title(self) -> str:
        for line in self.header.split(b"\n"):
            if line.startswith(b"Subject: "):
                return re.sub(r"^\[PATCH[^\]]*\]\s*", "", line[9:].decode("utf-8", "replace")).strip()
        return ""

    def trailers(self) -> dict[str, str]:
        out = {}
        for line in self.header.decode("utf-8", "replace").split("\n"):
            m = re.match(r"^([A-Z][A-Za-z-]+): (.*)$", line)
            if m and m.group(1) not in ("From", "Date", "Subject"):
                out[m.group(1)] = m.group(2).strip()
        return out

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]


def series_digest(items: Iterable[tuple[str, str]]) -> str:
    """The digest of a series prefix from its (patch file name, sha256 of the patch bytes) in order.

    The one recipe behind vendor.lock's patched record, the build stamp and release manifests.
    """
    h = hashlib.sha256()
    for name, sha in items:
        h.update(f"{name} {sha}\n".encode())
    return h.hexdigest()


def series_digest_of(patches: Iterable[Patch]) -> str:
    return series_digest((p.name, p.sha256) for p in patches)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ---------------------------------------------------------------- parse


def _unreadable_hint(name: str) -> str:
    # not `refresh`: every command reads the whole series first, so it refuses the same file
    return (f"restore the file (`git checkout -- patches/{name}`, or from the commit that last had it whole) or "
            "fix that line by hand; `forktool refresh` cannot rewrite a patch it cannot read")


def _fail(name: str, line: int, what: str, hint: str = "") -> PatchFormatError:
    return PatchFormatError(what, where=f"patches/{name}:{line}", hint=hint or _unreadable_hint(name))


def parse_patch(data: bytes, name: str) -> Patch:
    m = NAME_RE.match(name)
    if not m:
        raise PatchFormatError(f"bad patch file name {name!r}", where=f"patches/{name}",
                               hint="names are NNNN-slug.patch")
    if b"\r" in data:
        n = data[: data.index(b"\r")].count(b"\n") + 1
        raise _fail(name, n, "patch contains CR (CRLF line endings); canonical patches use LF only",
                    f"convert it with `dos2unix` if the upstream files it changes are LF, or {_unreadable_hint(name)}")
    if b"\0" in data:
        raise _fail(name, data[: data.index(b"\0")].count(b"\n") + 1, "patch contains NUL bytes (binary)")
    if data and not data.endswith(b"\n"):
        raise _fail(name, data.count(b"\n") + 1, "patch is truncated (no final newline)")
    lines = data.split(b"\n")[:-1] if data else []
    if not lines or lines[0] + b"\n" != FROM_LINE:
        raise _fail(name, 1, "missing the canonical `From 0000… Mon Sep 17 00:00:00 2001` line")
    try:
        sep = lines.index(b"---")
    except ValueError:
        raise _fail(name, len(lines), "missing the `---` line that separates the message from the diff") from None
    header = b"\n".join(lines[:sep]) + b"\n"
    try:
        header.decode("utf-8")
    except UnicodeDecodeError as e:
        n = header[:e.start].count(b"\n") + 1
        raise _fail(name, n, f"the patch message is not UTF-8 (byte 0x{header[e.start]:02x} on line {n})",
                    "fix that line of the patch file: it must be UTF-8 text") from None
    if not any(ln.startswith(b"Subject: ") for ln in lines[:sep]):
        raise _fail(name, 1, "missing a `Subject:` line")
    files: list[FileDiff] = []
    i = sep + 1
    while i < len(lines):
        line = lines[i]
        if not line.startswith(b"diff --git "):
            raise _fail(name, i + 1, f"expected `diff --git`, found {line[:60]!r}")
        fd, i = _parse_file(lines, i, name)
        files.append(fd)
    seen = set()
    for f in files:
        if f.path in seen:
            raise _fail(name, 1, f"file {f.path} appears twice in one patch")
        seen.add(f.path)
    return Patch(m.group(1), name, header, files, data)


def to_plain(p: Patch) -> tuple:
    """The parsed patch as plain tuples (for forktool.cache.Memo; its raw bytes are the memo's key)."""
    return (p.id, p.name, p.header, tuple((f.path, f.old_mode, f.new_mode, f.old_index, f.new_index,
                                          tuple((h.old_start, h.old_count, h.new_start, h.new_count, tuple(h.lines))
                                                for h in f.hunks)) for f in p.files))


def from_plain(t: tuple, raw: bytes) -> Patch:
    """The Patch to_plain gave t for; raises TypeError or ValueError when t is not of that shape."""
    pid, name, header, files = t
    if not (type(pid) is str and type(name) is str and type(header) is bytes and type(files) is tuple):
        raise TypeError("not a parsed patch")
    out = []
    for path, old_mode, new_mode, old_index, new_index, hunks in files:
        fd = FileDiff(path, old_mode, new_mode, old_index, new_index)
        for os_, oc, ns, nc, lines in hunks:
            fd.hunks.append(Hunk(os_, oc, ns, nc, list(lines)))
        out.append(fd)
    return Patch(pid, name, header, out, raw)


def _parse_file(lines: list[bytes], i: int, name: str) -> tuple[FileDiff, int]:
    start = i
    head = lines[i].decode("utf-8", "replace")
    m = re.match(r"^diff --git a/(\S+) b/(\S+)$", head)
    if not m:
        raise _fail(name, i + 1, f"cannot read paths from {head!r} (quoted or spaced paths are not supported)")
    a, b = m.group(1), m.group(2)
    where = f"patches/{name}:{i + 1}"
    if a != b:
        raise _fail(name, i + 1, f"rename or copy {a} -> {b} is not supported",
                    "express it as a deletion and an addition")
    check_rel_path(a, where)
    fd = FileDiff(a, REGULAR, REGULAR)
    i += 1
    saw_index = False
    while i < len(lines) and not lines[i].startswith(b"@@") and not lines[i].startswith(b"diff --git "):
        ln = lines[i].decode("utf-8", "replace")
        if ln.startswith("new file mode "):
            fd.old_mode, fd.new_mode = None, _mode(ln[14:], name, i)
        elif ln.startswith("deleted file mode "):
            fd.old_mode, fd.new_mode = _mode(ln[18:], name, i), None
        elif ln.startswith(("old mode ", "new mode ")):
            raise _fail(name, i + 1, f"mode change in {a} is not supported", "leave file modes as upstream has them")
        elif ln.startswith(("rename ", "copy ", "similarity index", "dissimilarity index")):
            raise _fail(name, i + 1, f"rename/copy of {a} is not supported", "express it as a deletion and an addition")
        elif ln.startswith("Binary files ") or ln == "GIT binary patch":
            raise _fail(name, i + 1, f"binary patch for {a} is not supported", "binary files cannot be carried as patches")
        elif ln.startswith("index "):
            im = re.match(r"^index ([0-9a-f]{7,40})\.\.([0-9a-f]{7,40})(?: (\d{6}))?$", ln)
            if not im:
                raise _fail(name, i + 1, f"malformed index line {ln!r}")
            fd.old_index, fd.new_index = im.group(1), im.group(2)
            if im.group(3):
                mode = _mode(im.group(3), name, i)
                fd.old_mode = mode if fd.old_mode else None
                fd.new_mode = mode if fd.new_mode else None
            saw_index = True
        elif ln.startswith("--- "):
            want = "/dev/null" if fd.is_new else f"a/{a}"
            if ln[4:] != want:
                raise _fail(name, i + 1, f"`--- {ln[4:]}` does not match the diff header (expected {want})")
        elif ln.startswith("+++ "):
            want = "/dev/null" if fd.is_deleted else f"b/{b}"
            if ln[4:] != want:
                raise _fail(name, i + 1, f"`+++ {ln[4:]}` does not match the diff header (expected {want})")
        else:
            raise _fail(name, i + 1, f"unexpected line in the header of {a}: {ln[:60]!r}")
        i += 1
    if not saw_index:
        raise _fail(name, start + 1, f"{a}: missing the `index` line")
    while i < len(lines) and lines[i].startswith(b"@@"):
        h, i = _parse_hunk(lines, i, name, a, len(fd.hunks) + 1)
        fd.hunks.append(h)
    if not fd.hunks and not (fd.is_new or fd.is_deleted):
        raise _fail(name, start + 1, f"{a}: no hunks")
    for n, h in enumerate(fd.hunks, 1):
        if fd.is_new and (h.old_start or h.old_count or any(op != b"+" for op, _ in h.lines)):
            raise _fail(name, start + 1, f"{a}: hunk #{n} of a new file carries context or '-' lines",
                        "a new file's hunk is `@@ -0,0 +1,N @@` with '+' lines only")
        if fd.is_deleted and (h.new_start or h.new_count or any(op != b"-" for op, _ in h.lines)):
            raise _fail(name, start + 1, f"{a}: hunk #{n} of a deleted file carries context or '+' lines",
                        "a deleted file's hunk is `@@ -1,N +0,0 @@` with '-' lines only")
    return fd, i  # the file and the index of the line after it


def _mode(s: str, name: str, i: int) -> str:
    if s not in (REGULAR, EXECUTABLE):
        raise _fail(name, i + 1, f"unsupported file mode {s} (symlinks and submodules cannot be patched)")
    return s


def _parse_hunk(lines: list[bytes], i: int, name: str, path: str, number: int) -> tuple[Hunk, int]:
    m = HUNK_RE.match(lines[i])
    if not m:
        raise _fail(name, i + 1, f"{path} hunk #{number}: malformed @@ line {lines[i][:60]!r}")
    os_, oc, ns, nc = (int(m.group(1)), int(m.group(2) or 1) if m.group(2) is not None else 1,
                       int(m.group(3)), int(m.group(4)) if m.group(4) is not None else 1)
    if max(os_, oc, ns, nc) > 100_000_000:
        raise _fail(name, i + 1, f"{path} hunk #{number}: line numbers or counts beyond any real file")
    h = Hunk(os_, oc, ns, nc, [])
    i += 1
    old = new = 0
    while i < len(lines) and (old < oc or new < nc):
        ln = lines[i]
        op = ln[:1]
        if op == b"\\":
            raise _fail(name, i + 1, f"{path} hunk #{number}: misplaced `\\ No newline` marker")
        if op not in (b" ", b"-", b"+"):
            if ln == b"":  # some editors strip the space of empty context lines
                raise _fail(name, i + 1, f"{path} hunk #{number}: empty line inside a hunk (context lines "
                            "need a leading space); the hunk counts do not match its body")
            raise _fail(name, i + 1, f"{path} hunk #{number}: unexpected line {ln[:60]!r}; "
                        f"the header promises {oc} old / {nc} new lines, found {old} / {new}")
        text = ln[1:] + b"\n"
        no_eol = i + 1 < len(lines) and lines[i + 1] == NO_EOL
        if no_eol:
            text = ln[1:]
            i += 1
        h.lines.append((op, text))
        if op in b" -":
            old += 1
        if op in b" +":
            new += 1
        # the marker may only follow the last line of the side(s) that line belongs to
        if no_eol and ((op in b" -" and old != oc) or (op in b" +" and new != nc)):
            raise _fail(name, i + 1, f"{path} hunk #{number}: `\\ No newline` marker after a line that is not "
                        "the last of its file")
        i += 1
    if old != oc or new != nc:
        raise _fail(name, i, f"{path} hunk #{number}: header promises {oc} old / {nc} new lines, "
                    f"the body has {old} / {new} (truncated or hand-edited patch)")
    if i < len(lines) and lines[i][:1] in (b" ", b"-", b"+") and not lines[i].startswith(b"--- "):
        raise _fail(name, i + 1, f"{path} hunk #{number}: more lines than its header counts "
                    f"({oc} old / {nc} new)")
    return h, i


# ---------------------------------------------------------------- format


def _range(start: int, count: int) -> bytes:
    if count == 1:
        return b"%d" % start
    return b"%d,%d" % (start, count)


def format_hunk(h: Hunk) -> bytes:
    out = [b"@@ -" + _range(h.old_start, h.old_count) + b" +" + _range(h.new_start, h.new_count) + b" @@\n"]
    for op, text in h.lines:
        if text.endswith(b"\n"):
            out.append(op + text)
        else:
            out.append(op + text + b"\n" + NO_EOL + b"\n")
    return b"".join(out)


def format_file(f: FileDiff) -> bytes:
    out = [b"diff --git a/%s b/%s\n" % (f.path.encode(), f.path.encode())]
    if f.is_new:
        out.append(b"new file mode %s\n" % f.new_mode.encode())  # type: ignore[union-attr]
        out.append(b"index %s..%s\n" % (f.old_index.encode(), f.new_index.encode()))
        out.append(b"--- /dev/null\n+++ b/%s\n" % f.path.encode())
    elif f.is_deleted:
        out.append(b"deleted file mode %s\n" % f.old_mode.encode())  # type: ignore[union-attr]
        out.append(b"index %s..%s\n" % (f.old_index.encode(), f.new_index.encode()))
        out.append(b"--- a/%s\n+++ /dev/null\n" % f.path.encode())
    else:
        out.append(b"index %s..%s %s\n" % (f.old_index.encode(), f.new_index.encode(), f.old_mode.encode()))  # type: ignore[union-attr]
        out.append(b"--- a/%s\n+++ b/%s\n" % (f.path.encode(), f.path.encode()))
    out.extend(format_hunk(h) for h in f.hunks)
    return b"".join(out)


def format_patch(p: Patch) -> bytes:
    return p.header + b"---\n" + b"".join(format_file(f) for f in sorted(p.files, key=lambda f: f.path))


def make_header(title: str, *, author: str, date: str, body: str = "", trailers: dict[str, str] | None = None) -> bytes:
    parts = [FROM_LINE.decode(), f"From: {author}\n", f"Date: {date}\n", f"Subject: [PATCH] {title}\n", "\n"]
    if body.strip():
        parts.append(body.strip() + "\n\n")
    for k, v in (trailers or {}).items():
        parts.append(f"{k}: {v}\n")
    return "".join(parts).encode()


def set_trailers(header: bytes, trailers: dict[str, str], where: str = "") -> bytes:
    """Header with the named trailers replaced (or appended), other lines kept."""
    try:
        lines = header.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        line = header[:e.start].count(b"\n") + 1
        raise PatchFormatError(f"the patch message is not UTF-8 (byte 0x{header[e.start]:02x} on line {line}), so its "
                               "trailers cannot be rewritten", where=f"{where}:{line}" if where else f"line {line}",
                               hint="fix that line of the patch file (it must be UTF-8 text), then run again") from None
    if lines and lines[-1] == "":
        lines.pop()
    keep = [ln for ln in lines if not any(ln.startswith(f"{k}: ") for k in trailers)]
    while keep and keep[-1] == "" and len(keep) > 5:
        keep.pop()
    add = [f"{k}: {v}" for k, v in trailers.items() if v]
    if add and keep and not re.match(r"^[A-Z][A-Za-z-]+: ", keep[-1]) or (add and len(keep) <= 4):
        keep.append("")
    return ("\n".join(keep + add) + "\n").encode()


# ---------------------------------------------------------------- diff


def split_lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def diff_file(path: str, old: bytes | None, new: bytes | None, old_mode: str | None = REGULAR,
              new_mode: str | None = REGULAR) -> FileDiff | None:
    """Canonical FileDiff from old to new bytes (None = absent); None when there is no change."""
    if old == new and old_mode == new_mode:
        return None
    if old is not None and new is not None and old_mode != new_mode:
        raise PatchFormatError(f"{path}: mode change {old_mode} -> {new_mode} cannot be expressed",
                               where=path, hint="restore the file mode")
    if (old is not None and b"\0" in old) or (new is not None and b"\0" in new):
        raise PatchFormatError(f"{path} is binary and cannot be carried in a patch", where=path,
                               hint="keep binary files out of the series: undo that change to the file")
    a = split_lines(old or b"")
    b = split_lines(new or b"")
    fd = FileDiff(path, old_mode if old is not None else None, new_mode if new is not None else None,
                  git_blob_sha1(old) if old is not None else ZERO,
                  git_blob_sha1(new) if new is not None else ZERO)
    fd.hunks = _hunks(a, b)
    return fd


def _opcodes(a: list[bytes], b: list[bytes]) -> list[tuple[str, int, int, int, int]]:
    # trimming the common prefix/suffix first keeps SequenceMatcher fast on big, lightly edited files
    pre = 0
    while pre < len(a) and pre < len(b) and a[pre] == b[pre]:
        pre += 1
    suf = 0
    while suf < len(a) - pre and suf < len(b) - pre and a[-1 - suf] == b[-1 - suf]:
        suf += 1
    import difflib  # only when a patch is re-exported

    sm = difflib.SequenceMatcher(None, a[pre:len(a) - suf], b[pre:len(b) - suf], autojunk=False)
    ops = []
    if pre:
        ops.append(("equal", 0, pre, 0, pre))
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        ops.append((tag, i1 + pre, i2 + pre, j1 + pre, j2 + pre))
    if suf:
        ops.append(("equal", len(a) - suf, len(a), len(b) - suf, len(b)))
    return ops


def _hunks(a: list[bytes], b: list[bytes]) -> list[Hunk]:
    hunks = []
    for group in _grouped(_opcodes(a, b)):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        lines: list[tuple[bytes, bytes]] = []
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                lines.extend((b" ", t) for t in a[a1:a2])
                continue
            lines.extend((b"-", t) for t in a[a1:a2])
            lines.extend((b"+", t) for t in b[b1:b2])
        oc, nc = i2 - i1, j2 - j1
        hunks.append(Hunk(i1 + 1 if oc else i1, oc, j1 + 1 if nc else j1, nc, lines))
    return hunks


def _grouped(codes: list[tuple[str, int, int, int, int]]) -> list[list[tuple[str, int, int, int, int]]]:
    """Like SequenceMatcher.get_grouped_opcodes(CONTEXT), on precomputed opcodes."""
    codes = [c for c in codes if not (c[0] == "equal" and c[1] == c[2])]
    if not codes or (len(codes) == 1 and codes[0][0] == "equal"):
        return []
    n = CONTEXT
    if codes[0][0] == "equal":
        tag, i1, i2, j1, j2 = codes[0]
        codes[0] = (tag, max(i1, i2 - n), i2, max(j1, j2 - n), j2)
    if codes[-1][0] == "equal":
        tag, i1, i2, j1, j2 = codes[-1]
        codes[-1] = (tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n))
    nn = n + n
    groups = []
    group: list[tuple[str, int, int, int, int]] = []
    for tag, i1, i2, j1, j2 in codes:
        if tag == "equal" and i2 - i1 > nn:
            group.append((tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)))
            groups.append(group)
            group = []
            i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        groups.append(group)
    return groups


def with_files(p: Patch, files: list[FileDiff]) -> Patch:
    q = Patch(p.id, p.name, p.header, files)
    q.raw = format_patch(q)
    return q
