"""How many objects a make run will compile, for the progress display, asked of make before it starts."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from forktool import proc

_OBJECT_RE = re.compile(r"Building (?:C|CXX|CUDA|ASM) object (\S+)")
# CMake's Makefile generator runs each target's dependency step first (`cmake -E cmake_depends ... DIR/DependInfo.cmake`):
# it merges the compiler's depfiles into what make reads, so a dry run before it cannot see a changed header
_DEPENDS_RE = re.compile(r"cmake_depends \"Unix Makefiles\" .* (\S+)/DependInfo\.cmake")


def objects_to_do(bdir: Path, targets: list[str], env: dict[str, str]) -> int | None:
    """How many objects `make TARGETS` would compile now, None when make cannot tell."""
    ok, found = objects_to_compile(bdir, targets, env)
    if ok:
        return len(found)
    # before the first build the dry run stops at libraries that do not exist yet and sees only part of the
    # objects; the objects compile_commands.json names and nobody built yet bound the rest from above
    return max(len(found), unbuilt_objects(bdir)) or None


def objects_to_compile(bdir: Path, targets: list[str], env: dict[str, str]) -> tuple[bool, set[str]]:
    """The objects (paths relative to bdir) `make TARGETS` would compile now, as make's own dry run names them
    once each target's dependency step (the first thing the build runs, and what it would run anyway) has
    merged the compiler's depfiles; with False when the dry run did not finish (a first build: a link needs a
    library that does not exist yet, so the targets after it are not looked at and the set is a lower bound)."""
    ok, out = _dry_run(bdir, targets, env)
    merged = False
    for step in _depend_steps(out, bdir):
        before = _mtime(bdir / step / "compiler_depend.make")
        proc.run(["make", "-s", "-f", f"{step}/build.make", f"{step}/depend"], cwd=bdir, env=env, check=False)
        merged = merged or _mtime(bdir / step / "compiler_depend.make") != before
    if merged:  # only then can make's answer differ: a no-op build pays for one dry run
        ok, out = _dry_run(bdir, targets, env)
    return ok, {m.group(1).strip('"\'') for m in _OBJECT_RE.finditer(out)}


def _mtime(path: Path) -> int | None:
    """The step's output (what make reads of the depfiles), whose change says the step merged something."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _dry_run(bdir: Path, targets: list[str], env: dict[str, str]) -> tuple[bool, str]:
    # -k: before the first build a dry run stops at a link whose library does not exist yet
    res = proc.run(["make", "-n", "-k", *targets], cwd=bdir, env=env, check=False)
    return res.returncode == 0, res.stdout.decode("utf-8", "replace")


def _depend_steps(out: str, bdir: Path) -> list[str]:
    """The target directories (relative to bdir) whose dependency step the dry run `out` names, in its order."""
    root = os.fspath(bdir.resolve()) + "/"
    steps: list[str] = []
    for m in _DEPENDS_RE.finditer(out):
        d = m.group(1)
        rel = d[len(root):] if d.startswith(root) else d
        if rel not in steps and not rel.startswith("/"):
            steps.append(rel)
    return steps


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
