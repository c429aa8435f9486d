"""The other upstream: resolve a SPEC against the pin, fetch it with pip or git into the object store."""

from __future__ import annotations

import io
import re
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forktool import git as fgit
from forktool import vendor
from forktool.cache import Cache, caches_root, key_of
from forktool.errors import ForktoolError, UsageError
from forktool.project import COMMIT_RE, Component, Project
from forktool.tree import Entry, Manifest, atomic_write, sha256_file


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
        return old, old._replace(url=url or old.url, commit=commit,
                                        upstream_commit=commit if keep_up else "")
    pkg, _, version = spec.partition("==")
    pick = [c for c in sdists if _norm(c.package) == _norm(pkg)]
    if len(pick) != 1 or (version and not re.match(r"^[0-9A-Za-z.+!-]+$", version)):
        raise UsageError(f"cannot match {spec!r} to one sdist component", where="--to", hint=hint)
    old = pick[0]
    return old, old._replace(version=version, sha256="", upstream_commit="")


def _by_spec(project: Project, comp: Component) -> Path:
    """Which sdist PACKAGE==VERSION resolved to (its sha256): kept with the project's own state, since an entry
    in the shared cache would choose the upstream bytes for whoever can write that cache."""
    return project.state_dir / "cache" / "sdist-by-spec" / f"{_norm(comp.package)}=={comp.version}"


def _fetch_sdist(project: Project, comp: Component, progress: Callable[[str], None]) -> tuple[Component, Path, bool]:
    """The sdist for comp in the cache, its sha256 computed (PyPI never replaces a released file)."""
    if comp.sha256:  # the pin itself: vendor checks the pinned sha256
        cached = vendor.sdist_path(project, comp).is_file()
        return comp, vendor.download_sdist(project, comp), cached
    if comp.version:
        known = _by_spec(project, comp)
        sha = known.read_text().strip() if known.is_file() else ""
        if sha:
            comp = comp._replace(sha256=sha)
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
        comp = comp._replace(version=version, sha256=sha256_file(found[0]))
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
    # the extraction is derived from the component's bytes and filters, so it is remembered with the project's
    # own state (.opencoti/cache/), never in the shared cache, and an entry that is not exactly what was stored is
    # ignored (extracted again)
    extracted = Cache(caches_root(project.state_dir), "sync-component")
    key = key_of("sync-component", vendor.component_lock_key(comp))
    hit: Any = extracted.get(key)
    try:
        files = {str(p): Entry(str(v[0]), str(v[1])) for p, v in hit["files"].items()}
        commit = str(hit["upstream_commit"])
    except (TypeError, KeyError, IndexError, AttributeError):
        files = {}
    if files and all(store.has(e.sha256) for e in files.values()):
        return comp._replace(upstream_commit=commit), files, from_cache
    if comp.kind == "sdist":
        data = path.read_bytes()
        progress(f"extracting {comp.spec}")
        files = vendor.extract(data, comp, store, strip_top=True).manifest
        # the pin's own upstream_commit is authoritative; a new version's is read from the sdist
        comp = comp._replace(upstream_commit=comp.upstream_commit or _sdist_upstream_commit(data, comp))
    else:
        progress(f"archiving {comp.spec} with git")
        data = fgit.archive_commit(comp.url, comp.commit, project.cache_dir)
        files = vendor.extract(data, comp, store, strip_top=False).manifest
    extracted.put(key, {"files": {p: e.to_json() for p, e in sorted(files.items())},
                        "upstream_commit": comp.upstream_commit})
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
