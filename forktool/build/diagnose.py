"""The cause of a failed cmake or make run: the first real error in its output, with the file and line it names."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ERROR_RE = re.compile(r"\berror\b|\bError\b:|undefined reference|multiple definition")
# gcc/clang `FILE:LINE:COL: error:`, nvcc's front end `FILE(LINE): error:`, CMake `CMake Error at FILE:LINE (cmd):`
_AT_RE = re.compile(r"^(?:CMake Error at )?(?P<file>[^\s:()]+?)(?::(?P<line>\d+)(?::\d+)?|\((?P<line2>\d+)\))"
                    r"(?::| \()")
_CMAKE_RE = re.compile(r"^CMake Error\b")


@dataclass(frozen=True)
class Cause:
    text: str  # the error, on one line
    file: str  # the file it names ("" when none)
    line: int  # 0 when none

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file and self.line else self.file


def _is_real(line: str) -> bool:
    # make's and collect2's own lines only say that something before them failed; CMake's `-- ` status lines only
    # relay what a step printed (the web UI's npm install says "npm error" and the configure goes on without it)
    return bool(_ERROR_RE.search(line)) and not line.startswith(("make", "collect2:", "gmake", "--"))


def _cause(line: str, text: str) -> Cause:
    m = _AT_RE.match(line)
    if not m:
        return Cause(text, "", 0)
    return Cause(text, m.group("file"), int(m.group("line") or m.group("line2")))


def first_error(lines: list[str]) -> Cause | None:
    """The first compiler, linker or CMake error (CMake's with the indented lines that explain it), else None. An
    error that names its file and line comes before one that names none (a tool's message that only mentions an
    error), wherever that one stands."""
    fallback: Cause | None = None
    for i, raw in enumerate(lines):
        line = raw.strip()
        if _CMAKE_RE.match(line):
            said = [line]
            for nxt in lines[i + 1:]:
                if nxt and not nxt[0].isspace():
                    break
                if nxt.strip().startswith("Possible reasons"):
                    break
                if nxt.strip():
                    said.append(nxt.strip())
                if len(said) >= 5:
                    break
            return _cause(line, " ".join(said))
        if _is_real(line):
            cause = _cause(line, line)
            if cause.file:
                return cause
            fallback = fallback or cause
    return fallback


class FirstError:
    """Watches a stream of lines and keeps the first real error (a compile's log can run to thousands of lines):
    the first that names its file and line, else the first that names none."""

    def __init__(self) -> None:
        self.located: Cause | None = None
        self.unlocated: Cause | None = None

    @property
    def cause(self) -> Cause | None:
        return self.located or self.unlocated

    def feed(self, line: str) -> None:
        line = line.strip()
        if self.located is None and _is_real(line) and not _CMAKE_RE.match(line):
            cause = _cause(line, line)
            if cause.file:
                self.located = cause
            elif self.unlocated is None:
                self.unlocated = cause


def owners(cause: Cause | None, tree_root: str, patches: list[tuple[str, list[str]]]) -> list[str]:
    """The ids of the patches that change the file an error names (paths in patches are relative to tree_root)."""
    if cause is None or not cause.file:
        return []
    rel = cause.file.removeprefix(tree_root.rstrip("/") + "/")
    return [pid for pid, files in patches if rel in files]


def compile_hint(cause: Cause | None, tree_root: str, patches: list[tuple[str, list[str]]]) -> str:
    """The next step for a compile error: fix the patch that changes the failing file, or the one whose change
    an unpatched upstream file no longer accepts."""
    ids = owners(cause, tree_root, patches)
    if ids:
        return (f"the error is in a file patch {ids[-1]} changes: edit it in vendor/llamafile, then "
                f"`forktool refresh {ids[-1]}` and build again")
    if cause is not None and cause.file.startswith(tree_root):
        return ("the error is in an upstream file no patch changes: a patch's header or call no longer fits "
                "upstream (look for the patch that touches what it includes), fix that patch, then refresh it")
    return "read the full log; fix the cause, then build again"


def configure_hint(profile_has_cuda: bool) -> str:
    if profile_has_cuda:
        return ("CMake could not configure the CUDA backend: check that nvcc and cuBLAS are found "
                "(`make setup` installs the nvidia-cublas wheel where nvcc exists), then build again")
    return "CMake could not configure the tree: fix the cause it names (a flag in registry/build.yaml, or a " \
           "CMake file a patch changes), then build again"
