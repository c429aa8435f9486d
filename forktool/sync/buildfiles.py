"""Build-file drift: the source lists of the CMake targets the profiles build, compared between upstreams."""

from __future__ import annotations

import fnmatch
import re

from forktool.sync.trial import Reader

# the CMake targets the profiles build: (target, CMakeLists path in the component, add_library name or None
# for "the whole file", directory the listed sources are relative to)
CMAKE_TARGETS = (
    ("llama", "src/CMakeLists.txt", "llama", "src"),
    ("common", "common/CMakeLists.txt", None, "common"),
    ("ggml-base", "ggml/src/CMakeLists.txt", "ggml-base", "ggml/src"),
    ("ggml-cpu", "ggml/src/ggml-cpu/CMakeLists.txt", None, "ggml/src"),
    ("ggml-cuda", "ggml/src/ggml-cuda/CMakeLists.txt", None, "ggml/src/ggml-cuda"),
)

_COMMENT_RE = re.compile(rb"#[^\n]*")
_GLOB_RE = re.compile(rb"file\s*\(\s*GLOB(?:_RECURSE)?\s+(\w+)([^)]*)\)", re.S)
_SET_RE = re.compile(rb"\b(?:set\s*\(|list\s*\(\s*APPEND\s)\s*(\w+)[^)]*\)", re.S)
_SRC_RE = re.compile(rb"[A-Za-z0-9_${}./+-]+\.(?:c|cc|cpp|cxx|h|hpp|cu|cuh)(?![A-Za-z0-9_])")


def _block(text: bytes, name: str) -> bytes | None:
    m = re.search(rb"add_library\s*\(\s*" + re.escape(name.encode()) + rb"[\s)]", text)
    if not m:
        return None
    depth = 0
    for i in range(m.start(), len(text)):
        if text[i:i + 1] == b"(":
            depth += 1
        elif text[i:i + 1] == b")":
            depth -= 1
            if depth == 0:
                return text[m.start():i + 1]
    return text[m.start():]


def cmake_sources(text: bytes, library: str | None, cmake_dir: str, files: list[str]) -> set[str]:
    """Source names a target lists (as written) plus what its file(GLOB) patterns match in `files`."""
    text = _COMMENT_RE.sub(b"", text)
    scope = _block(text, library) if library else text
    if scope is None:
        return set()
    if library:
        # follow the lists the target names: set(VAR ...) / list(APPEND VAR ...), a few levels deep
        for _ in range(3):
            names = set(re.findall(rb"\$\{(\w+)\}", scope))
            extra = [m.group(0) for m in _SET_RE.finditer(text) if m.group(1) in names and m.group(0) not in scope]
            if not extra:
                break
            scope += b"\n" + b"\n".join(extra)
    found = {m.group(0).decode() for m in _SRC_RE.finditer(scope)}
    for m in _GLOB_RE.finditer(text):
        var = m.group(1)
        if library and b"${" + var + b"}" not in scope:
            continue
        found -= {m2.group(0).decode() for m2 in _SRC_RE.finditer(m.group(0))}
        for pat in re.findall(rb'"([^"]+)"', m.group(2)):
            pattern = pat.decode()
            for f in files:
                rel = f[len(cmake_dir) + 1:] if cmake_dir else f
                if (not cmake_dir or f.startswith(cmake_dir + "/")) and fnmatch.fnmatchcase(rel, pattern) \
                        and rel.count("/") == pattern.count("/"):
                    found.add(rel)
    return found


def build_file_drift(old_read: Reader, new_read: Reader, old_files: list[str], new_files: list[str],
                     prefix: str) -> list[dict]:
    out = []
    for target, cmake, library, src_dir in CMAKE_TARGETS:
        rel = prefix + cmake
        cdir = prefix + cmake.rsplit("/", 1)[0]
        old, new = old_read(rel), new_read(rel)
        row = {"target": target, "cmake": cmake, "relative_to": src_dir, "added": [], "removed": [],
               "note": ""}
        if old is None and new is None:
            continue
        if new is None:
            row["note"] = "the CMake file is gone in the new upstream"
        elif old is None:
            row["note"] = "the CMake file is new in the new upstream"
        else:
            a = cmake_sources(old, library, cdir, old_files)
            b = cmake_sources(new, library, cdir, new_files)
            row["added"], row["removed"] = sorted(b - a), sorted(a - b)
        out.append(row)
    return out

