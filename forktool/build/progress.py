"""How many objects a make run will compile, for the progress display, decided before make starts."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from forktool import proc

_OBJECT_RE = re.compile(r"Building (?:C|CXX|CUDA|ASM) object (\S+)")


def objects_to_do(bdir: Path, targets: list[str], env: dict[str, str]) -> int | None:
    """How many objects `make TARGETS` would compile now, None when neither CMake's files nor make can tell.

    Read from CMake's own dependency data (stale_objects); only where that is not there (a CMake older than 3.20,
    a generator file missing) make is asked with a dry run."""
    stale = stale_objects(bdir, targets)
    if stale is not None:
        return len(stale)
    return _dry_run_objects(bdir, targets, env)


def _dry_run_objects(bdir: Path, targets: list[str], env: dict[str, str]) -> int | None:
    # -k: before the first build a dry run stops at a link whose library does not exist yet
    res = proc.run(["make", "-n", "-k", *targets], cwd=bdir, env=env, check=False)
    found = {m.group(1).strip('"\'') for m in _OBJECT_RE.finditer(res.stdout.decode("utf-8", "replace"))}
    if res.returncode == 0:
        return len(found)
    # before the first build the dry run stops at libraries that do not exist yet and sees only part of the
    # objects; the objects compile_commands.json names and nobody built yet bound the rest from above
    return max(len(found), unbuilt_objects(bdir)) or None


# CMake's Makefile generator (3.20+): CMakeFiles/Makefile2 names each target's directory (`NAME: DIR/rule`) and
# what it needs built first (`DIR/all: DEP/all`); DIR/DependInfo.cmake lists every object with its source and the
# compiler's depfile (`"SOURCE" "OBJECT" "COMPILER" "DEPFILE"`); each object also depends on DIR/flags.make and
# DIR/compiler_depend.ts (DIR/build.make)
_MK_RULE_RE = re.compile(rb"^([^\s:#]+): (\S+)/rule$", re.M)
_MK_ALL_RE = re.compile(rb"^(\S+): (\S+)/all$", re.M)
_DEPINFO_RE = re.compile(rb'^\s*"([^"]*)" "([^"]+)" "[^"]*" "([^"]+)"$', re.M)
_DEPFILE_TOKEN_RE = re.compile(rb"(?:\\.|[^\s\\])+")
_SCANNED_RE = re.compile(rb"set\(CMAKE_DEPENDS_LANGUAGES([^)]*)\)")


def stale_objects(bdir: Path, targets: list[str]) -> set[str] | None:
    """The objects (paths relative to bdir) `make TARGETS` would compile now, decided as make decides: an object
    is stale when it is missing, or its source, its target's flags, or any file its depfile names is newer or
    gone. Reads CMake's generated makefiles and the compiler's depfiles, runs nothing. None when those files are
    not there or not of the expected form (make must be asked then)."""
    try:
        makefile2 = (bdir / "CMakeFiles" / "Makefile2").read_bytes()
    except OSError:
        return None
    dirs = {m.group(1): m.group(2) for m in _MK_RULE_RE.finditer(makefile2)}
    needs: dict[bytes, list[bytes]] = {}
    for m in _MK_ALL_RE.finditer(makefile2):
        needs.setdefault(m.group(1).removesuffix(b"/all"), []).append(m.group(2))
    todo = []
    for t in targets:
        node = dirs.get(t.encode()) if t != "all" else b"all"
        if node is None:
            return None
        todo.append(node)
    seen: set[bytes] = set()
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(needs.get(node, ()))
    root = os.fsencode(bdir) + b"/"
    objects: list[tuple[bytes, list[bytes]]] = []  # (object, its prerequisites), one per object of the targets
    for node in sorted(n for n in seen if n.endswith(b".dir")):
        try:
            info = (bdir / os.fsdecode(node) / "DependInfo.cmake").read_bytes()
        except OSError:
            return None
        scanned = _SCANNED_RE.search(info)
        if b"CMAKE_DEPENDS_DEPENDENCY_FILES" not in info or (scanned and scanned.group(1).strip()):
            return None  # some dependencies scanned by CMake itself, not in a depfile (before 3.20): only make knows
        common = [root + node + b"/flags.make", root + node + b"/compiler_depend.ts"]
        for m in _DEPINFO_RE.finditer(info):
            source, obj, depfile = m.groups()
            objects.append((obj, [*common, _under(root, source), *_depfile_paths(root, obj, depfile)]))
    mtimes: dict[bytes, int] = {}
    for path in {p for _, prereqs in objects for p in prereqs}.union(root + o for o, _ in objects):
        try:
            mtimes[path] = os.stat(path).st_mtime_ns
        except OSError:
            mtimes[path] = _GONE
    # stale: missing, or a prerequisite newer than it or gone (a vanished header remakes the object too)
    return {os.fsdecode(obj) for obj, prereqs in objects
            if mtimes[root + obj] == _GONE or max(map(mtimes.__getitem__, prereqs)) > mtimes[root + obj]}


_GONE = 1 << 126  # the mtime given to a file that is not there: newer than any object


def _under(root: bytes, path: bytes) -> bytes:
    return path if path.startswith(b"/") else root + path


def _depfile_paths(root: bytes, obj: bytes, depfile: bytes) -> list[bytes]:
    """The prerequisites a compiler's depfile (`OBJ: DEP DEP \\`) names, absolute; [] when it cannot be read."""
    try:
        with open(_under(root, depfile), "rb") as f:
            text = f.read()
    except OSError:
        return []
    _target, colon, rest = text.replace(b"\\\n", b" ").partition(b": ")
    if not colon:
        return []
    if b"\\" in rest or b"$$" in rest:  # escaped spaces, hashes or dollars in a name
        tokens = [re.sub(rb"\\(.)", rb"\1", t).replace(b"$$", b"$") for t in _DEPFILE_TOKEN_RE.findall(rest)]
    else:
        tokens = rest.split()
    if b":" in rest:  # phony targets for headers (-MP), or a path with a colon
        tokens = [t for t in tokens if not t.endswith(b":")]
    if b" ".join([b"", *tokens]).count(b" /") != len(tokens):
        # relative to where the compiler ran: the directory holding CMakeFiles/
        cwd = root + obj.rpartition(b"CMakeFiles/")[0]
        tokens = [t if t.startswith(b"/") else cwd + t for t in tokens]
    return tokens


def unbuilt_objects(bdir: Path) -> int:
    """How many objects of bdir's compile_commands.json do not exist yet (every configured target's, so an upper
    bound for a subset of targets); 0 when there is no readable compile_commands.json."""
    try:
        entries = json.loads((bdir / "compile_commands.json").read_bytes())
    except (OSError, ValueError):
        return 0
    n = 0
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict):
            continue
        out = e.get("output")
        if not isinstance(out, str):
            args = e.get("arguments") or shlex.split(str(e.get("command") or ""))
            out = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "-o"), None)
        if isinstance(out, str) and not (Path(str(e.get("directory") or bdir)) / out).exists():
            n += 1
    return n
