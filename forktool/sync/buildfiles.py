"""Build-file drift: the source lists of the CMake targets the profiles build, compared between upstreams."""

from __future__ import annotations

import fnmatch
import os
import re
import tempfile
from pathlib import Path

from forktool import proc
from forktool.build import cmakeapi, diagnose
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
_UNITY_RE = re.compile(re.escape(cmakeapi.BUILD) + r"/(?:.*/)?CMakeFiles/[^/]+\.dir/Unity/unity_[^/]*\Z")
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
    """One row per target of CMAKE_TARGETS; a row whose source list neither upstream's CMake text gives (the file
    absent from both, or neither defining the target) says why in `not_checked` and is never read as unchanged."""
    out = []
    for target, cmake, library, src_dir in CMAKE_TARGETS:
        rel = prefix + cmake
        cdir = prefix + cmake.rsplit("/", 1)[0]
        old, new = old_read(rel), new_read(rel)
        row = {"target": target, "cmake": cmake, "relative_to": src_dir, "added": [], "removed": [],
               "note": "", "not_checked": ""}
        if old is None and new is None:
            row["not_checked"] = f"neither upstream has {cmake}"
        elif library and old is not None and new is not None and not any(
                _block(_COMMENT_RE.sub(b"", t), library) for t in (old, new)):
            row["not_checked"] = f"neither upstream's {cmake} defines add_library({library} ...)"
        elif new is None:
            row["note"] = "the CMake file is gone in the new upstream"
        elif old is None:
            row["note"] = "the CMake file is new in the new upstream"
        else:
            a = cmake_sources(old, library, cdir, old_files)
            b = cmake_sources(new, library, cdir, new_files)
            row["added"], row["removed"] = sorted(b - a), sorted(a - b)
        out.append(row)
    return out



# ---------------------------------------------------------------- from CMake itself


def configured_sources(src: Path, bdir: Path, flags: list[str]) -> dict[str, set[str]] | str:
    """target -> its sources (relative to src), as CMake configures src with flags; a string: why it did not.
    Sources reached through include(), variables, globs and generator logic all count: CMake evaluated them."""
    if not (src / "CMakeLists.txt").is_file():
        return "no top-level CMakeLists.txt"
    cmakeapi.request(bdir)
    res = proc.run(["cmake", "-S", src, "-B", bdir, *flags], check=False)
    if res.returncode != 0:
        cause = diagnose.first_error((res.stdout + res.stderr).decode("utf-8", "replace").splitlines())
        return f"cmake failed: {cause.text if cause else 'exit code ' + str(res.returncode)}"
    model = cmakeapi.targets(bdir)
    if model is None:
        return "cmake wrote no codemodel (CMake 3.14 or newer is needed)"
    # the unity files CMake writes into the build directory batch the real sources (their count follows the
    # batch size, not upstream's changes): the sources they batch are listed too, so they are left out
    out = {name: {f for f in t.sources if not _UNITY_RE.match(f)} for name, t in model.items()}
    return {name: srcs for name, srcs in out.items() if srcs}


def cmake_drift(old: dict[str, set[str]], new: dict[str, set[str]]) -> list[dict]:
    """One row per target whose sources differ between two configured trees (sources relative to the top)."""
    out = []
    for target in sorted(set(old) | set(new)):
        a, b = old.get(target), new.get(target)
        row = {"target": target, "cmake": "", "relative_to": "", "added": [], "removed": [], "note": "",
               "not_checked": "", "from": "CMake (both trees configured)"}
        if a is None:
            row["note"] = "a new target in the new upstream"
            row["added"] = sorted(b or ())
        elif b is None:
            row["note"] = "the target is gone in the new upstream"
            row["removed"] = sorted(a)
        else:
            row["added"], row["removed"] = sorted(b - a), sorted(a - b)
        if row["added"] or row["removed"] or row["note"]:
            out.append(row)
    return out


def _materialise(read: Reader, files: list[str], prefix: str, dest: Path) -> None:
    for rel in files:
        if not rel.startswith(prefix):
            continue
        data = read(rel)
        if data is None:
            continue
        out = dest / rel[len(prefix):]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)


def drift_from_cmake(old_read: Reader, new_read: Reader, old_files: list[str], new_files: list[str], prefix: str,
                     flags: list[str], work: Path | None = None) -> list[dict] | str:
    """Configure both trees (written to a temporary directory, in `work` when given) with flags and compare every
    target's sources; a string says why CMake could not tell (the caller falls back to reading the CMake text)."""
    with tempfile.TemporaryDirectory(prefix="forktool-drift-", dir=work) as tmp:
        got = []
        for side, read, files in (("old", old_read, old_files), ("new", new_read, new_files)):
            src = Path(tmp, side, "src")
            _materialise(read, files, prefix, src)
            r = configured_sources(src, Path(tmp, side, "build"), flags)
            if isinstance(r, str):
                return f"the {side} upstream does not configure: {r}"
            got.append(r)
    if not got[0] and not got[1]:  # nothing configured to compare: no source list is unchanged
        return "CMake configured no target with sources in either upstream"
    rows = cmake_drift(got[0], got[1])
    # a target the profile's flags do not build (ggml-cuda under the cpu profile's) was configured on neither
    # side: its sources are compared from the CMake text instead, and the row says so. A name configured on
    # neither side whose CMake file's directory feeds a configured target (upstream's `common` became
    # `llama-common`) is built under that other name: CMake's rows above compare it, and its text is not read
    # again as a target the flags do not build
    configured_dirs = {f.rsplit("/", 1)[0] for side in got for srcs in side.values() for f in srcs if "/" in f}
    unbuilt = [t for t, cmake, *_ in CMAKE_TARGETS if t not in got[0] and t not in got[1]
               and not _feeds(cmake.rsplit("/", 1)[0], configured_dirs)]
    for row in build_file_drift(old_read, new_read, old_files, new_files, prefix):
        if row["target"] in unbuilt:
            row["from"] = "the CMake text (the flags the trial configured with do not build this target)"
            rows.append(row)
    return rows


def _feeds(cmake_dir: str, source_dirs: set[str]) -> bool:
    """Whether a configured target has a source in cmake_dir or below it."""
    return any(d == cmake_dir or d.startswith(cmake_dir + "/") for d in source_dirs)


def drift(project_flags: list[str] | None, old_read: Reader, new_read: Reader, old_files: list[str],
          new_files: list[str], prefix: str, work: Path | None = None) -> list[dict]:
    """The drift report's rows: from CMake when both trees configure with the profile's flags, else from the CMake
    text of the profiles' targets, each row saying which. work: where the configured trees are written."""
    why = "cmake is not installed" if not _cmake() else ""
    if project_flags is not None and not why:
        rows = drift_from_cmake(old_read, new_read, old_files, new_files, prefix, project_flags, work)
        if not isinstance(rows, str):
            return rows
        why = rows
    rows = build_file_drift(old_read, new_read, old_files, new_files, prefix)
    for r in rows:
        r["from"] = f"the CMake text ({why or 'no build profile'})"
    return rows


def _cmake() -> bool:
    return any(os.access(os.path.join(d, "cmake"), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep))
