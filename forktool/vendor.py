"""The pinned upstream: fetch by package name with pip, check sha256, safe filtered extract, pristine cache."""

from __future__ import annotations

import fnmatch
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from forktool import git as fgit
from forktool import proc, schema
from forktool.errors import ConfigError, ForktoolError, UnsafePathError
from forktool.project import Component, Project
from forktool.store import ObjectStore
from forktool.tree import (
    EXECUTABLE,
    REGULAR,
    SYMLINK,
    Entry,
    Manifest,
    atomic_write,
    check_rel_path,
    digest,
    manifest_from_json,
    manifest_to_json,
    sha256_file,
)


def matches(rel: str, patterns: tuple[str, ...]) -> bool:
    """True when a pattern matches rel itself or one of its parent directories."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(p, pat) for pat in patterns for p in prefixes)


def keep(rel: str, comp: Component) -> bool:
    return matches(rel, comp.include) and not matches(rel, comp.exclude)


# ---------------------------------------------------------------- download


def sdist_path(project: Project, comp: Component) -> Path:
    return project.cache_dir / "sdist" / f"{comp.sha256}.tar.gz"


def download_sdist(project: Project, comp: Component, local: Path | None = None) -> Path:
    """The sdist in the cache, downloaded by name with pip when missing; refuses a sha256 mismatch."""
    dest = sdist_path(project, comp)
    if dest.is_file() and sha256_file(dest) == comp.sha256:
        return dest
    with tempfile.TemporaryDirectory(prefix="forktool-dl-") as tmp:
        if local is not None:
            candidate = local
        else:
            proc.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                      "--disable-pip-version-check", "-d", tmp, comp.spec])
            found = sorted(Path(tmp).glob("*.tar.gz"))
            if len(found) != 1:
                raise ForktoolError(f"pip did not produce one sdist for {comp.spec}",
                                    where=tmp, details=[p.name for p in found])
            candidate = found[0]
        got = sha256_file(candidate)
        if got != comp.sha256:
            raise ForktoolError(
                f"sha256 mismatch for {comp.spec}: pinned {comp.sha256}, got {got}",
                where=str(candidate), hint="nothing was written; check the pin in vendor/vendor.yaml "
                "(a changed upstream release must be re-pinned on purpose, e.g. with `forktool sync --accept`)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp_dest = dest.with_suffix(".part")
        shutil.copyfile(candidate, tmp_dest)
        tmp_dest.replace(dest)
    return dest


# ---------------------------------------------------------------- safe extract


@dataclass
class Extracted:
    manifest: Manifest  # relative to the component root
    skipped: int


def _member_rel(name: str, comp: Component, strip_top: bool) -> str | None:
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafePathError(f"archive member {name!r} has an absolute name", where=comp.spec,
                              hint="the archive is unsafe; nothing was extracted")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePathError(f"archive member {name!r} contains '..'", where=comp.spec,
                              hint="the archive is unsafe; nothing was extracted")
    if strip_top:
        parts = parts[1:]
    sub = comp.subdir.split("/") if comp.subdir else []
    if parts[: len(sub)] != sub or len(parts) <= len(sub):
        return None
    return "/".join(parts[len(sub):])


def extract(data: bytes, comp: Component, store: ObjectStore, strip_top: bool) -> Extracted:
    """Filtered extraction into the object store; never touches the filesystem outside the store."""
    manifest: Manifest = {}
    skipped = 0
    links: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for m in tar:
            rel = _member_rel(m.name, comp, strip_top)
            if m.ischr() or m.isblk() or m.isfifo():
                raise UnsafePathError(f"archive member {m.name!r} is a device or fifo", where=comp.spec,
                                      hint="the archive is unsafe; nothing was extracted")
            if rel is None or m.isdir():
                continue
            if not keep(rel, comp):
                skipped += 1
                continue
            if m.issym() or m.islnk():
                target = m.linkname
                base = PurePosixPath(rel).parent if m.issym() else PurePosixPath()
                resolved: list[str] = []
                for part in (base / target).parts if not target.startswith("/") else ["/"]:
                    if part == "/":
                        resolved = ["..", ".."]
                        break
                    if part == "..":
                        if not resolved:
                            resolved = [".."]
                            break
                        resolved.pop()
                    elif part != ".":
                        resolved.append(part)
                if not resolved or resolved[0] == "..":
                    raise UnsafePathError(f"archive link {m.name!r} -> {target!r} leaves the root",
                                          where=comp.spec, hint="the archive is unsafe; nothing was extracted")
                if m.issym():
                    manifest[rel] = Entry(store.put(target.encode()), SYMLINK)
                else:
                    links[rel] = "/".join(resolved)
                continue
            if not m.isfile():
                raise UnsafePathError(f"archive member {m.name!r} has an unsupported type", where=comp.spec)
            f = tar.extractfile(m)
            assert f is not None
            manifest[rel] = Entry(store.put(f.read()), EXECUTABLE if m.mode & 0o100 else REGULAR)
    for rel, target in links.items():
        if target not in manifest:
            raise UnsafePathError(f"hard link {rel!r} points at {target!r}, which is not extracted",
                                  where=comp.spec)
        manifest[rel] = manifest[target]
    if not manifest:
        raise ConfigError(f"the filters of component {comp.name!r} keep no file", where=comp.spec,
                          hint="check subdir/include/exclude in vendor/vendor.yaml")
    return Extracted(manifest, skipped)


# ---------------------------------------------------------------- pristine cache


def objects(project: Project) -> ObjectStore:
    return ObjectStore(project.cache_dir / "objects")


def pristine_path(project: Project, tree_digest: str) -> Path:
    return project.cache_dir / "pristine" / f"{tree_digest}.json"


def load_lock(project: Project) -> dict:
    """vendor/vendor.lock checked against its schema ({} before the first fetch)."""
    if not os.path.lexists(project.vendor_lock):
        return {}
    return schema.load_json(project.vendor_lock, "vendor-lock", root=project.root,
                            hint="restore vendor/vendor.lock from git, or delete it and run `forktool vendor fetch`")


def load_pristine_manifest(path: Path) -> Manifest:
    """A cached pristine manifest; a damaged one is refused (the cache is rebuilt by `forktool vendor fetch`)."""
    raw = schema.load_json(path, "pristine", limit=schema.STATE_LIMIT,
                           hint="delete it and run `forktool vendor fetch` to rebuild the pristine cache")
    return manifest_from_json(raw)


def write_lock(project: Project, lock: dict) -> None:
    atomic_write(project.vendor_lock, (json.dumps(lock, indent=2, sort_keys=True) + "\n").encode())


def component_lock_key(comp: Component) -> dict:
    return {"kind": comp.kind, "spec": comp.spec, "sha256": comp.sha256, "upstream_commit": comp.upstream_commit,
            "include": list(comp.include), "exclude": list(comp.exclude), "subdir": comp.subdir}


@dataclass
class FetchResult:
    manifest: Manifest
    digest: str
    files: int
    from_cache: bool
    skipped: int


def fetch_pristine(project: Project, *, local_sdist: Path | None = None,
                   progress: Callable[[str], None] = lambda _m: None) -> FetchResult:
    """Pristine manifest of all components (cached by the lock's digest), downloading as needed."""
    lock = load_lock(project)
    comps = project.vendor.components
    pinned = {c.name: component_lock_key(c) for c in comps}
    cached_digest = lock.get("pristine_digest")
    if cached_digest and lock.get("components") == pinned:
        p = pristine_path(project, cached_digest)
        if p.is_file():
            cached = load_pristine_manifest(p)
            if all(objects(project).has(e.sha256) for e in cached.values()):
                return FetchResult(cached, cached_digest, len(cached), True, 0)
    store = objects(project)
    manifest: Manifest = {}
    skipped = 0
    for comp in comps:
        if comp.kind == "sdist":
            progress(f"downloading {comp.spec} with pip")
            archive = download_sdist(project, comp, local_sdist).read_bytes()
            strip_top = True
        else:
            progress(f"archiving {comp.spec} with git")
            archive = fgit.archive_commit(comp.url, comp.commit, project.cache_dir)
            strip_top = False
        progress(f"extracting {comp.name} (filters: {len(comp.include)} include, {len(comp.exclude)} exclude)")
        ex = extract(archive, comp, store, strip_top)
        skipped += ex.skipped
        for rel, e in ex.manifest.items():
            manifest[f"{comp.name}/{rel}"] = e
    d = digest(manifest)
    if cached_digest and lock.get("components") == pinned and cached_digest != d:
        raise ForktoolError(
            f"pristine digest {d[:12]} differs from vendor.lock ({cached_digest[:12]}) for the same pin",
            where=str(project.vendor_lock), hint="the upstream archive changed under the same pin; investigate "
            "before trusting it (delete the lock only if the change is understood)")
    atomic_write(pristine_path(project, d), json.dumps(manifest_to_json(manifest), sort_keys=True).encode())
    if lock.get("components") != pinned or lock.get("pristine_digest") != d:
        lock = {"components": pinned, "pristine_digest": d, "pristine_files": len(manifest),
                "patched": lock.get("patched", {})}
        write_lock(project, lock)
    return FetchResult(manifest, d, len(manifest), False, skipped)


def read_pristine(project: Project) -> tuple[Manifest, str]:
    """The pristine manifest named by vendor.lock, which must already be in the cache."""
    lock = load_lock(project)
    d = lock.get("pristine_digest")
    if not d:
        raise ForktoolError("no pristine upstream recorded yet", where=str(project.vendor_lock),
                            hint="run `forktool vendor fetch`")
    p = pristine_path(project, d)
    if not p.is_file():
        res = fetch_pristine(project)
        return res.manifest, res.digest
    return load_pristine_manifest(p), d


def materialise(project: Project, manifest: Manifest) -> None:
    """Write the pristine tree to the vendored root, into a temp dir renamed into place."""
    store = objects(project)
    dest = project.tree
    if dest.exists():
        raise ForktoolError("the vendored tree already exists", where=str(dest))
    tmp = Path(tempfile.mkdtemp(prefix=".llamafile-", dir=dest.parent))
    try:
        for rel in sorted(manifest):
            check_rel_path(rel, "pristine manifest")
            e = manifest[rel]
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            data = store.get(e.sha256)
            if e.mode == SYMLINK:
                p.symlink_to(data.decode())
            else:
                p.write_bytes(data)
                if e.mode == EXECUTABLE:
                    p.chmod(0o755)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def verify_pristine_cache(project: Project) -> list[str]:
    """Problems with the cached pristine tree against vendor.lock (empty when fine)."""
    lock = load_lock(project)
    problems = []
    d = lock.get("pristine_digest")
    if not d:
        return ["vendor.lock has no pristine_digest"]
    pinned = {c.name: component_lock_key(c) for c in project.vendor.components}
    if lock.get("components") != pinned:
        problems.append("vendor.lock does not match vendor/vendor.yaml (pin or filters changed); "
                        "run `forktool vendor fetch`")
    p = pristine_path(project, d)
    if not p.is_file():
        return problems + [f"pristine manifest {d[:12]} is not in the cache; run `forktool vendor fetch`"]
    manifest = load_pristine_manifest(p)
    if digest(manifest) != d:
        problems.append(f"cached pristine manifest {p} does not hash to {d[:12]}")
    if len(manifest) != lock.get("pristine_files"):
        problems.append(f"pristine has {len(manifest)} files, vendor.lock says {lock.get('pristine_files')}")
    store = objects(project)
    for rel, e in sorted(manifest.items()):
        op = store.path(e.sha256)
        if not op.is_file():
            problems.append(f"{rel}: object {e.sha256[:12]} missing from the cache")
        elif sha256_file(op) != e.sha256:
            problems.append(f"{rel}: cached object {e.sha256[:12]} is corrupt")
    return problems


def pristine_bytes(project: Project, manifest: Manifest, rel: str) -> bytes | None:
    e = manifest.get(rel)
    return None if e is None else objects(project).get(e.sha256)
