"""Upstream sync: trial the whole series on another upstream, patch by patch, and say what needs a human."""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import json
import re
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from forktool import backup as bk
from forktool import git as fgit
from forktool import proc, series, txn, vendor
from forktool.apply import apply_file, reverse
from forktool.errors import ApplyError, ConfigError, ForktoolError, UsageError
from forktool.project import COMMIT_RE, Component, Project, parse_component
from forktool.series import FileDiff, Patch
from forktool.tree import REGULAR, Entry, Manifest, atomic_write, digest, sha256_bytes, sha256_file

STATUSES = ("clean", "offset", "merged", "conflict", "upstreamed", "blocked")
# offset is drift the refreshed patch absorbs; everything past it needs a maintainer's eye
NEEDS_HUMAN = ("merged", "conflict", "upstreamed", "blocked")
LABELS = ("patch (on the pinned upstream)", "pinned upstream", "new upstream")
CONFLICT_LINES_MAX = 80

# the CMake targets the profiles build: (target, CMakeLists path in the component, add_library name or None
# for "the whole file", directory the listed sources are relative to)
CMAKE_TARGETS = (
    ("llama", "src/CMakeLists.txt", "llama", "src"),
    ("common", "common/CMakeLists.txt", None, "common"),
    ("ggml-base", "ggml/src/CMakeLists.txt", "ggml-base", "ggml/src"),
    ("ggml-cpu", "ggml/src/ggml-cpu/CMakeLists.txt", None, "ggml/src"),
    ("ggml-cuda", "ggml/src/ggml-cuda/CMakeLists.txt", None, "ggml/src/ggml-cuda"),
)
SOURCE_EXTS = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh")


# ---------------------------------------------------------------- the other upstream


@dataclass
class Target:
    """The upstream to trial: the pinned component and its replacement, fetched into the object store."""

    old: Component
    new: Component
    manifest: Manifest  # whole vendored root: other components as pinned, this one from the new upstream
    component_files: int
    fetch_seconds: float
    from_cache: bool


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve_spec(project: Project, spec: str) -> tuple[Component, Component]:
    """(pinned component, the same component moved to SPEC); an sdist's sha256 stays empty until fetched."""
    spec = spec.strip()
    comps = project.vendor.components
    sdists = [c for c in comps if c.kind == "sdist"]
    gits = [c for c in comps if c.kind == "git"]
    hint = ("SPEC is PACKAGE==VERSION (or PACKAGE alone for its newest release) for an sdist component, "
            "or COMMIT / URL@COMMIT (40 hex digits) for a git component")
    if COMMIT_RE.match(spec) or "@" in spec:
        url, _, commit = spec.rpartition("@")
        pick = [c for c in gits if not url or c.url == url] or (gits if len(gits) == 1 else [])
        if len(pick) != 1 or not COMMIT_RE.match(commit):
            raise UsageError(f"cannot match {spec!r} to one git component", where="--to", hint=hint)
        old = pick[0]
        keep_up = old.upstream_commit == old.commit
        return old, dataclasses.replace(old, url=url or old.url, commit=commit,
                                        upstream_commit=commit if keep_up else "")
    pkg, _, version = spec.partition("==")
    pick = [c for c in sdists if _norm(c.package) == _norm(pkg)]
    if len(pick) != 1 or (version and not re.match(r"^[0-9A-Za-z.+!-]+$", version)):
        raise UsageError(f"cannot match {spec!r} to one sdist component", where="--to", hint=hint)
    old = pick[0]
    return old, dataclasses.replace(old, version=version, sha256="", upstream_commit="")


def _by_spec(project: Project, comp: Component) -> Path:
    return project.cache_dir / "sdist" / "by-spec" / f"{_norm(comp.package)}=={comp.version}"


def _fetch_sdist(project: Project, comp: Component, progress: Callable[[str], None]) -> tuple[Component, Path, bool]:
    """The sdist for comp in the cache, its sha256 computed (PyPI never replaces a released file)."""
    if comp.sha256:  # the pin itself: vendor checks the pinned sha256
        cached = vendor.sdist_path(project, comp).is_file()
        return comp, vendor.download_sdist(project, comp), cached
    if comp.version:
        known = _by_spec(project, comp)
        sha = known.read_text().strip() if known.is_file() else ""
        if sha:
            comp = dataclasses.replace(comp, sha256=sha)
            path = vendor.sdist_path(project, comp)
            if path.is_file() and sha256_file(path) == sha:
                return comp, path, True
    with tempfile.TemporaryDirectory(prefix="forktool-sync-dl-") as tmp:
        want = f"{comp.package}=={comp.version}" if comp.version else comp.package
        progress(f"downloading {want} with pip")
        found = [vendor.pip_download(want, Path(tmp))]
        m = re.match(r"^(.+)-([^-]+)\.tar\.gz$", found[0].name)
        version = comp.version or (m.group(2) if m else "")
        if not version:
            raise ForktoolError(f"cannot read the version from {found[0].name}", where=want)
        comp = dataclasses.replace(comp, version=version, sha256=sha256_file(found[0]))
        path = vendor.download_sdist(project, comp, found[0])
    atomic_write(_by_spec(project, comp), (comp.sha256 + "\n").encode())
    return comp, path, False


def _sdist_upstream_commit(data: bytes, comp: Component) -> str:
    """The commit of the submodule at comp.subdir, read from the .git the sdist carries ('' when absent)."""
    if not comp.subdir:
        return ""
    with tempfile.TemporaryDirectory(prefix="forktool-sync-git-") as tmp, \
            tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        root = Path(tmp)
        for m in tar:
            parts = m.name.split("/")
            # only the top-level .git/ of the sdist, regular files, no funny names
            if len(parts) < 3 or parts[1] != ".git" or not m.isfile() or ".." in parts or m.name.startswith("/"):
                continue
            f = tar.extractfile(m)
            if f is None:
                continue
            dest = root.joinpath(*parts[1:])
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read())
        if not (root / ".git" / "HEAD").is_file():
            return ""
        return fgit.gitlink_commit(root / ".git", comp.subdir) or ""


def component_manifest(project: Project, comp: Component,
                       progress: Callable[[str], None] = lambda _m: None) -> tuple[Component, Manifest, bool]:
    """One component's files (relative to its root) in the object store, cached by its lock key."""
    store = vendor.objects(project)
    from_cache = False
    if comp.kind == "sdist":
        comp, path, from_cache = _fetch_sdist(project, comp, progress)
    key = sha256_bytes(json.dumps(vendor.component_lock_key(comp), sort_keys=True).encode())
    cache = project.cache_dir / "sync" / f"{key}.json"
    if cache.is_file():
        raw = json.loads(cache.read_text())
        files = {p: Entry(v[0], v[1]) for p, v in raw["files"].items()}
        if all(store.has(e.sha256) for e in files.values()):
            return dataclasses.replace(comp, upstream_commit=raw.get("upstream_commit", "")), files, from_cache
    if comp.kind == "sdist":
        data = path.read_bytes()
        progress(f"extracting {comp.spec}")
        files = vendor.extract(data, comp, store, strip_top=True).manifest
        # the pin's own upstream_commit is authoritative; a new version's is read from the sdist
        comp = dataclasses.replace(comp, upstream_commit=comp.upstream_commit or _sdist_upstream_commit(data, comp))
    else:
        progress(f"archiving {comp.spec} with git")
        data = fgit.archive_commit(comp.url, comp.commit, project.cache_dir)
        files = vendor.extract(data, comp, store, strip_top=False).manifest
    atomic_write(cache, json.dumps({"files": {p: e.to_json() for p, e in sorted(files.items())},
                                    "upstream_commit": comp.upstream_commit}, sort_keys=True).encode())
    return comp, files, False


def pinned_manifest(project: Project, progress: Callable[[str], None] = lambda _m: None) -> Manifest:
    """The pinned pristine: vendor.lock's cached manifest when it matches the pin, else fetched without
    writing vendor.lock (a sync never changes the user's project)."""
    lock = vendor.load_lock(project)
    keys = {c.name: vendor.component_lock_key(c) for c in project.vendor.components}
    if lock.get("pristine_digest") and lock.get("components") == keys \
            and vendor.pristine_path(project, lock["pristine_digest"]).is_file():
        return vendor.read_pristine(project)[0]
    out: Manifest = {}
    for comp in project.vendor.components:
        _, files, _ = component_manifest(project, comp, progress)
        out.update({f"{comp.name}/{p}": e for p, e in files.items()})
    return out


def fetch_target(project: Project, old: Component, new: Component, pinned: Manifest,
                 progress: Callable[[str], None] = lambda _m: None) -> Target:
    """Fetch the other upstream into the object store; the whole vendored root's manifest for it."""
    t0 = time.monotonic()
    new, comp_manifest, from_cache = component_manifest(project, new, progress)
    prefix = f"{old.name}/"
    manifest = {p: e for p, e in pinned.items() if not p.startswith(prefix)}
    manifest.update({prefix + p: e for p, e in comp_manifest.items()})
    return Target(old, new, manifest, len(comp_manifest), time.monotonic() - t0, from_cache)


# ---------------------------------------------------------------- the trial


@dataclass
class FileResult:
    path: str
    status: str  # clean, offset, merged, conflict, upstreamed
    hunks: list[dict[str, object]] = field(default_factory=list)  # {hunk, how: exact|offset|changed, offset}
    conflicts: list[dict] = field(default_factory=list)  # {line, text}
    reason: str = ""

    def to_json(self) -> dict:
        return {"file": self.path, "status": self.status, "hunks": self.hunks, "conflicts": self.conflicts,
                "reason": self.reason}


@dataclass
class PatchResult:
    patch: Patch
    status: str
    files: list[FileResult] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)
    drift: list[dict] = field(default_factory=list)
    refreshed: Patch | None = None
    note: str = ""

    @property
    def changed(self) -> bool:
        return self.refreshed is not None and self.refreshed.raw != self.patch.raw

    def to_json(self) -> dict:
        return {"id": self.patch.id, "name": self.patch.name, "title": self.patch.title, "status": self.status,
                "files": [f.to_json() for f in self.files], "blocked_by": self.blocked_by, "drift": self.drift,
                "refreshed": self.refreshed is not None, "changed": self.changed,
                "refreshed_sha256": self.refreshed.sha256 if self.refreshed else None, "note": self.note}


Reader = Callable[[str], bytes | None]


def _hunk_places(patch: Patch, fd: FileDiff, theirs: bytes | None) -> list[dict]:
    """Where each hunk's pre-image stands in the new text: exact, at an offset, or changed upstream."""
    out: list[dict[str, object]] = []
    for n, h in enumerate(fd.hunks, 1):
        one = dataclasses.replace(fd, hunks=[h])
        try:
            if theirs is None:
                raise ApplyError("absent")
            _, drift = apply_file(patch, one, theirs)
            off = drift[0].offset if drift else 0
            out.append({"hunk": n, "how": "offset" if off else "exact", "offset": off})
        except ApplyError:
            out.append({"hunk": n, "how": "changed", "offset": None})
    return out


def _reverse_applies(patch: Patch, fd: FileDiff, cur: bytes | None) -> bool:
    """True when the new upstream already holds this file's post-image (the change was upstreamed)."""
    if fd.is_new:
        return cur is not None and cur == b"".join(t for h in fd.hunks for t in h.new_lines())
    if fd.is_deleted:
        return cur is None
    if cur is None:
        return False
    rfd = FileDiff(fd.path, fd.new_mode, fd.old_mode, fd.new_index, fd.old_index, [reverse(h) for h in fd.hunks])
    try:
        apply_file(patch, rfd, cur)
    except ApplyError:
        return False
    return True


def _conflict_blocks(merged: bytes) -> list[dict]:
    """Each `<<<<<<< … >>>>>>>` block of a merge-file result, with its first line number."""
    blocks: list[dict] = []
    cur: list[str] | None = None
    start = 0
    for n, line in enumerate(merged.decode("utf-8", "replace").split("\n"), 1):
        if line.startswith("<<<<<<< "):
            cur, start = [], n
        if cur is not None:
            cur.append(line)
            if line.startswith(">>>>>>> "):
                blocks.append({"line": start, "text": "\n".join(cur)})
                cur = None
    return blocks


def _patch_status(files: list[FileResult]) -> str:
    st = [f.status for f in files]
    if "conflict" in st:
        return "conflict"
    if st and all(s == "upstreamed" for s in st):
        return "upstreamed"
    if "merged" in st or "upstreamed" in st:
        return "merged"
    return "offset" if "offset" in st else "clean"


def trial(patches: list[Patch], old_read: Reader, new_read: Reader, mode_of: Callable[[str], str]) -> list[PatchResult]:
    """Apply the series cumulatively on both upstreams; classify each patch on the new one, never stopping."""
    old_state: dict[str, bytes | None] = {}
    new_state: dict[str, bytes | None] = {}
    tainted: dict[str, str] = {}  # path -> the failed patch that left it as it is
    results: list[PatchResult] = []

    def old_cur(rel: str) -> bytes | None:
        return old_state[rel] if rel in old_state else old_read(rel)

    def new_cur(rel: str) -> bytes | None:
        return new_state[rel] if rel in new_state else new_read(rel)

    for p in patches:
        old_pre = {fd.path: old_cur(fd.path) for fd in p.files}
        old_post: dict[str, bytes | None] = {}
        old_error = ""
        try:
            for fd in p.files:
                old_post[fd.path], _ = apply_file(p, fd, old_pre[fd.path])
            old_state.update(old_post)
        except ApplyError as e:
            # the series is already broken on the pin: later pre-images come without this patch
            old_error = f"does not apply on the pinned upstream either: {e.what}"
        blockers = sorted({tainted[f] for f in p.paths if f in tainted})
        if blockers:
            for f in p.paths:
                tainted.setdefault(f, p.id)
            results.append(PatchResult(p, "blocked", blocked_by=blockers,
                                       note="touches " + ", ".join(f for f in p.paths if tainted[f] in blockers)
                                       + " left unpatched by " + ", ".join(blockers)))
            continue
        files: list[FileResult] = []
        after: dict[str, bytes | None] = {}
        drift: list[dict] = []
        for fd in p.files:
            cur = new_cur(fd.path)
            try:
                after[fd.path], d = apply_file(p, fd, cur)
                drift += [x.to_json() for x in d]
                files.append(FileResult(fd.path, "offset" if d else "clean",
                                        [{"hunk": x.hunk, "how": "offset", "offset": x.offset} for x in d]))
                continue
            except ApplyError:
                pass
            places = _hunk_places(p, fd, cur)
            if _reverse_applies(p, fd, cur):
                after[fd.path] = cur
                files.append(FileResult(fd.path, "upstreamed", places, reason="the new upstream already has this change"))
                continue
            if old_error:
                files.append(FileResult(fd.path, "conflict", places, reason=old_error))
                continue
            if cur is None:
                files.append(FileResult(fd.path, "conflict", places, reason="the new upstream has no such file "
                                        "(removed or moved); search for its code elsewhere"))
                continue
            merged, n = fgit.merge_file(old_post[fd.path] or b"", old_pre[fd.path] or b"", cur, LABELS)
            if n == 0:
                after[fd.path] = merged
                files.append(FileResult(fd.path, "merged", places, reason="3-way merge (git merge-file) without "
                                        "conflict; hunks marked 'changed' met new upstream text: review them"))
            else:
                files.append(FileResult(fd.path, "conflict", places, _conflict_blocks(merged),
                                        reason=f"{n} conflict(s) in the 3-way merge"))
        status = _patch_status(files)
        res = PatchResult(p, status, files, drift=drift)
        if status == "conflict":
            for f in p.paths:
                tainted.setdefault(f, p.id)
            res.note = old_error
        elif status == "upstreamed":
            new_state.update(after)
            res.note = "every change is already in the new upstream: propose dropping it from the series"
        else:
            pre = {rel: new_cur(rel) for rel in after}
            new_state.update(after)
            fds = []
            for fd in p.files:
                mode = mode_of(fd.path) if pre[fd.path] is not None else (fd.new_mode or REGULAR)
                new_fd = series.diff_file(fd.path, pre[fd.path], after[fd.path], mode, mode)
                if new_fd is not None:
                    fds.append(new_fd)
            res.refreshed = series.with_files(p, fds)
            if status == "merged" and any(f.status == "upstreamed" for f in files):
                res.note = "part of it is already upstream; the refreshed patch carries only the rest"
        results.append(res)
    return results


# ---------------------------------------------------------------- hooks and build files


def _component_sources(manifest: Manifest, prefix: str) -> list[str]:
    return sorted(p for p in manifest if p.startswith(prefix) and p.endswith(SOURCE_EXTS))


def relocate_hooks(project: Project, read: Reader, manifest: Manifest, prefix: str) -> tuple[dict, str | None]:
    """Find every registered hook site's symbol again in the new tree (advisory line numbers); also the
    registry text with the sites that were found moved to their new place (None without a registry)."""
    path = project.registry_dir / "UPSTREAM_SYNC.yaml"
    if not path.is_file():
        return {"registry": False, "sites": []}, None
    from forktool import registry, symbols
    try:
        reg = registry.load(path)
    except ConfigError as e:
        # the trial is still worth reporting; the broken registry is one more thing for a human
        return {"registry": True, "sites": [], "error": str(e)}, None
    candidates = _component_sources(manifest, prefix)
    sites = []
    for hid, hook in sorted(reg.hooks.items()):
        for s in hook.sites:
            rel = s.file if s.file in manifest or not prefix or s.file.startswith(prefix) else prefix + s.file
            row = {"hook": hid, "patch": hook.patch, "symbol": s.symbol, "file": s.file, "line": s.line,
                   "new_file": None, "new_line": None, "status": "vanished"}
            data = read(rel)
            line = symbols.find_symbol(data, s.symbol) if data is not None else None
            if line is not None:
                row.update(new_file=s.file, new_line=line, status="found" if line == s.line else "moved_lines")
            else:
                needle = re.split(r"::|\.", s.symbol)[-1].encode()
                for other in candidates:
                    if other == rel:
                        continue
                    text = read(other)
                    if text is None or needle not in text:
                        continue
                    hit = symbols.find_symbol(text, s.symbol)
                    if hit is not None:
                        shown = other if s.file.startswith(prefix) or not prefix else other[len(prefix):]
                        row.update(new_file=shown, new_line=hit, status="moved_file")
                        break
            sites.append(row)
    moved = iter(sites)
    for hid, hook in sorted(reg.hooks.items()):
        new_sites = []
        for site in hook.sites:
            row = next(moved)
            if row["new_line"] is not None:
                site = dataclasses.replace(site, file=str(row["new_file"]), line=int(row["new_line"]))
            new_sites.append(site)
        reg.hooks[hid] = dataclasses.replace(hook, sites=tuple(new_sites))
    return {"registry": True, "sites": sites}, registry.dump(reg)


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


# ---------------------------------------------------------------- the cpu build


def _repin_text(text: str, name: str, new: Component) -> str:
    """vendor.yaml with one component's pin moved, comments and layout kept; checked by re-parsing."""
    lines = text.split("\n")
    start = next((i for i, ln in enumerate(lines)
                  if re.match(r"^\s*-\s*name:\s*['\"]?" + re.escape(name) + r"['\"]?\s*$", ln)), None)
    if start is None:
        raise ConfigError(f"cannot find component {name!r} in vendor.yaml", where="vendor/vendor.yaml")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].lstrip().startswith("#")
                                or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    keys = ("version", "sha256", "upstream_commit") if new.kind == "sdist" else ("url", "commit", "upstream_commit")
    values = {k: getattr(new, k) for k in keys}
    block = lines[start:end]
    key_indent = " " * (indent + 2)
    seen = set()
    out = []
    for ln in block:
        m = re.match(r"^(\s*)(version|sha256|upstream_commit|url|commit):", ln)
        if m and m.group(2) in values:
            seen.add(m.group(2))
            key_indent = m.group(1)
            if values[m.group(2)]:
                out.append(f"{m.group(1)}{m.group(2)}: {json.dumps(values[m.group(2)])}")
            continue  # an unknown upstream commit: drop the stale line rather than keep a wrong one
        out.append(ln)
    missing = [k for k in keys if k not in seen and values[k]]
    if missing:
        anchor = next(i for i, ln in enumerate(out) if re.match(r"^\s*(sha256|commit):", ln))
        for k in reversed(missing):
            out.insert(anchor + 1, f"{key_indent}{k}: {json.dumps(values[k])}")
    result = "\n".join(lines[:start] + out + lines[end:])
    raw = yaml.safe_load(result)
    got = next(parse_component(c, "vendor.yaml") for c in raw["components"] if c.get("name") == name)
    if got != new:
        raise ConfigError("rewriting vendor.yaml did not give the intended pin", where="vendor/vendor.yaml",
                          details=[f"wanted {new}", f"got {got}"], hint="edit the pin by hand")
    return result


def _series_text(results: list[PatchResult], original: str, spec: str) -> str:
    """patches/series with upstreamed patches commented out (kept on disk, so nothing is lost)."""
    dropped = {r.patch.name for r in results if r.status == "upstreamed"}
    out = []
    for line in original.splitlines():
        name = line.split("#", 1)[0].strip().split(" ")[0] if line.split("#", 1)[0].strip() else ""
        if name in dropped:
            out.append(f"# {line.strip()}  # upstreamed in {spec} (forktool sync)")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def run_build(project: Project, scratch: Path, yaml_text: str, results: list[PatchResult], series_text: str,
              progress: Callable[[str], None]) -> dict:
    """cpu build of the fully applied result in a scratch project (the user's tree is never touched)."""
    import importlib.util
    if importlib.util.find_spec("forktool.build") is None:
        return {"status": "not_run", "reason": "forktool.build is not available in this checkout"}
    for sub in ("patches", "registry"):
        if (scratch / sub).exists():
            shutil.rmtree(scratch / sub)
    (scratch / "patches").mkdir(parents=True)
    if project.registry_dir.is_dir():
        shutil.copytree(project.registry_dir, scratch / "registry")
    # same pin as last time: keep the scratch tree, so apply writes only changed files and make stays
    # incremental; another pin: start the tree afresh (the workspace refuses a tree from another upstream)
    pin = scratch / "vendor" / "vendor.yaml"
    if not pin.is_file() or pin.read_text(encoding="utf-8") != yaml_text:
        for stale in ("vendor/llamafile", "vendor/vendor.lock", ".opencoti/state.json"):
            p = scratch / stale
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    atomic_write(scratch / "vendor" / "vendor.yaml", yaml_text.encode())
    for res in results:
        if res.refreshed is not None:
            atomic_write(scratch / "patches" / res.patch.name, res.refreshed.raw)
    atomic_write(scratch / "patches" / "series", series_text.encode())
    env = {"FORKTOOL_ROOT": str(scratch), "FORKTOOL_CACHE": str(project.cache_dir)}
    t0 = time.monotonic()
    steps = (["vendor", "fetch"], ["apply"], ["build", "--profile", "cpu"])
    for step in steps:
        progress(f"scratch build: forktool {' '.join(step)}")
        r = proc.run([sys.executable, "-m", "forktool", *step, "--json"], cwd=scratch, env=env, check=False)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).decode("utf-8", "replace").strip().splitlines()[-20:]
            return {"status": "failed", "step": " ".join(step), "exit_code": r.returncode, "log_tail": tail,
                    "seconds": round(time.monotonic() - t0, 1), "project": str(scratch)}
    try:
        data = json.loads(r.stdout)
    except json.JSONDecodeError:
        data = {}
    return {"status": "ok", "seconds": round(time.monotonic() - t0, 1), "project": str(scratch),
            "objects": len(data.get("objects", [])), "outputs": data.get("outputs", {})}


# ---------------------------------------------------------------- outputs


@dataclass
class SyncResult:
    target: Target
    results: list[PatchResult]
    hooks: dict
    build_files: list[dict]
    build: dict
    timings: dict
    series_text: str
    yaml_text: str
    registry_yaml: str | None = None  # UPSTREAM_SYNC.yaml with relocated sites (a proposal, never applied)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for r in self.results if r.status == s) for s in STATUSES}

    @property
    def needs_human(self) -> bool:
        moved = any(s["status"] in ("vanished", "moved_file") for s in self.hooks.get("sites", [])) \
            or bool(self.hooks.get("error"))
        return any(r.status in NEEDS_HUMAN for r in self.results) or moved or self.build.get("status") == "failed"

    @property
    def acceptable(self) -> bool:
        return not any(r.status in ("conflict", "blocked") for r in self.results)

    def report(self) -> dict:
        """report.json: only facts that follow from the inputs (no timings), so reruns are byte-identical."""
        t = self.target
        return {
            "schema": 1,
            "from": {"spec": t.old.spec, "sha256": t.old.sha256, "upstream_commit": t.old.upstream_commit},
            "to": {"spec": t.new.spec, "sha256": t.new.sha256, "upstream_commit": t.new.upstream_commit,
                   "files": t.component_files, "pristine_digest": digest(t.manifest)},
            "component": t.old.name,
            "counts": self.counts,
            "needs_human": self.needs_human,
            "acceptable": self.acceptable,
            "patches": [r.to_json() for r in self.results],
            "hooks": self.hooks,
            "build_files": self.build_files,
            "build": {k: v for k, v in self.build.items() if k not in ("seconds", "project")},
        }


def _conflict_excerpt(text: str) -> str:
    lines = text.split("\n")
    if len(lines) <= CONFLICT_LINES_MAX:
        return text
    return "\n".join(lines[:CONFLICT_LINES_MAX] + [f"… {len(lines) - CONFLICT_LINES_MAX} more line(s) in report.json"])


def render_markdown(data: dict) -> str:
    import jinja2
    env = jinja2.Environment(loader=jinja2.PackageLoader("forktool", "templates"), autoescape=False,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["excerpt"] = _conflict_excerpt
    return env.get_template("sync_report.md.j2").render(r=data, statuses=STATUSES)


def write_outputs(out: Path, res: SyncResult) -> dict:
    """patches/ (refreshed ones + series), report.json, report.md; patches/ is replaced as a whole."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".patches-", dir=out))
    try:
        for r in res.results:
            if r.refreshed is not None:
                (tmp / r.patch.name).write_bytes(r.refreshed.raw)
        (tmp / "series").write_bytes(res.series_text.encode())
        old = out / "patches"
        if old.exists():
            shutil.rmtree(old)
        tmp.rename(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    proposal = out / "registry" / "UPSTREAM_SYNC.yaml"
    if res.registry_yaml is not None:
        atomic_write(proposal, res.registry_yaml.encode())
    elif proposal.exists():
        proposal.unlink()
    data = res.report()
    atomic_write(out / "report.json", (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
    atomic_write(out / "report.md", render_markdown(data).encode())
    return data


# ---------------------------------------------------------------- accept


def accept(project: Project, res: SyncResult) -> dict:
    """Move the pin and the patches to the new upstream: backed up first, then one journaled transaction."""
    if not res.acceptable:
        bad = [f"{r.patch.id} {r.status}" for r in res.results if r.status in ("conflict", "blocked")]
        raise ForktoolError(f"--accept refused: {len(bad)} patch(es) conflict or are blocked", where="forktool sync",
                            details=bad, hint="resolve them on the new upstream first (see the report), or sync "
                            "to another version")
    root = project.root
    writes: list[txn.Write] = [txn.Write("vendor/vendor.yaml", res.yaml_text.encode(), REGULAR)]
    for r in res.results:
        if r.refreshed is not None and r.changed:
            writes.append(txn.Write(f"patches/{r.patch.name}", r.refreshed.raw, REGULAR))
    writes.append(txn.Write("patches/series", res.series_text.encode(), REGULAR))
    writes = [w for w in writes if (root / w.path).read_bytes() != w.data]
    current = {w.path: Entry(sha256_file(root / w.path), REGULAR) for w in writes}
    txn_state = project.state_dir / "sync-txn"
    with txn.locked(project.state_dir):
        b = bk.create(project.state_dir / "sync-backups", root, f"accept-{res.target.new.version or 'commit'}",
                      f"before forktool sync --accept to {res.target.new.spec}", current, {},
                      {"kind": "sync-accept", "from": res.target.old.spec, "to": res.target.new.spec})
        txn.commit(root, txn_state, writes, {"accepted": res.target.new.spec})
    return {"written": [w.path for w in writes], "backup": str(b.path.relative_to(root)),
            "next": "the vendored tree still holds the old upstream: run `forktool unapply`, remove "
                    "vendor/llamafile, then `forktool vendor fetch && forktool apply`"}


# ---------------------------------------------------------------- the whole job


def sync(project: Project, spec: str, *, build: bool, out: Path,
         progress: Callable[[str], None] = lambda _m: None) -> SyncResult:
    """Fetch SPEC, trial the series on it, relocate hooks, diff the build files, optionally build; write outputs."""
    from forktool.workspace import load_patches
    t_start = time.monotonic()
    note = txn.recover(project.root, project.state_dir / "sync-txn")
    if note:
        progress(f"an interrupted --accept: {note}")
    old, new = resolve_spec(project, spec)
    pinned = pinned_manifest(project, progress)
    target = fetch_target(project, old, new, pinned, progress)
    t_fetched = time.monotonic()
    store = vendor.objects(project)

    def reader(m: Manifest) -> Reader:
        def read(rel: str) -> bytes | None:
            e = m.get(rel)
            return None if e is None else store.get(e.sha256)
        return read

    old_read, new_read = reader(pinned), reader(target.manifest)
    patches = load_patches(project, series.read_series(project.series_file))
    progress(f"trying {len(patches)} patch(es) on {target.new.spec}")
    results = trial(patches, old_read, new_read,
                    lambda rel: target.manifest[rel].mode if rel in target.manifest else REGULAR)
    t_trial = time.monotonic()
    # re-applying the refreshed patches proves they apply exactly on the new upstream
    final = _final_state(results, new_read)

    def result_read(rel: str) -> bytes | None:
        return final[rel] if rel in final else new_read(rel)

    prefix = f"{old.name}/"
    progress("relocating hook sites")
    hooks, registry_yaml = relocate_hooks(project, result_read, target.manifest, prefix)
    t_hooks = time.monotonic()
    drift = build_file_drift(old_read, new_read, sorted(pinned), sorted(target.manifest), prefix)
    series_text = _series_text(results, project.series_file.read_text(encoding="utf-8"), target.new.spec)
    yaml_text = _repin_text(project.vendor_yaml.read_text(encoding="utf-8"), old.name, target.new)
    t_analysis = time.monotonic()
    build_res: dict = {"status": "not_run", "reason": "--build not given"}
    if build:
        if any(r.status in ("conflict", "blocked") for r in results):
            build_res = {"status": "skipped", "reason": "some patches do not apply on the new upstream"}
        else:
            build_res = run_build(project, out / "build-project", yaml_text, results, series_text, progress)
    timings = {"fetch_s": round(t_fetched - t_start, 3), "trial_s": round(t_trial - t_fetched, 3),
               "hooks_s": round(t_hooks - t_trial, 3), "analysis_s": round(t_analysis - t_fetched, 3),
               "build_s": build_res.get("seconds", 0.0), "fetch_from_cache": target.from_cache}
    res = SyncResult(target, results, hooks, drift, build_res, timings, series_text, yaml_text, registry_yaml)
    write_outputs(out, res)
    res.timings["total_s"] = round(time.monotonic() - t_start, 3)
    return res


def _final_state(results: list[PatchResult], new_read: Reader) -> dict[str, bytes | None]:
    """Contents after the patches that went in (refreshed ones re-applied on the new upstream)."""
    state: dict[str, bytes | None] = {}
    for r in results:
        if r.refreshed is None:
            continue
        for fd in r.refreshed.files:
            cur = state[fd.path] if fd.path in state else new_read(fd.path)
            state[fd.path], _ = apply_file(r.refreshed, fd, cur)
    return state
