"""The pinned upstream: fetch by package name with pip, check sha256, safe filtered extract, pristine cache."""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from forktool import schema
from forktool.errors import ConfigError, ForktoolError, UnsafePathError
from forktool.project import Component, Project
from forktool.record import NamedTuple
from forktool.store import ObjectStore
from forktool.tree import (
    EXECUTABLE,
    SYMLINK,
    Entry,
    Manifest,
    atomic_write,
    digest,
    make_temp_dir,
    manifest_from_json,
    manifest_to_json,
    resolve_inside,
    sha256_bytes,
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


def pip_download(requirement: str, dest: Path) -> Path:
    """The one place forktool downloads: `pip download` of one source distribution into dest; returns its path."""
    from forktool import proc  # the download, extraction and git machinery load only when a fetch needs them

    proc.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              "--disable-pip-version-check", "-d", dest, requirement])
    found = sorted(dest.glob("*.tar.gz"))
    if len(found) != 1:
        raise ForktoolError(f"pip did not produce one sdist for {requirement}", where=str(dest),
                            details=[p.name for p in found])
    return found[0]


def download_sdist(project: Project, comp: Component, local: Path | None = None) -> Path:
    """The sdist in the cache, downloaded by name with pip when missing; refuses a sha256 mismatch."""
    dest = sdist_path(project, comp)
    if dest.is_file() and sha256_file(dest) == comp.sha256:
        return dest
    import shutil  # the download's modules load only when something is downloaded
    import tempfile

    with tempfile.TemporaryDirectory(prefix="forktool-dl-") as tmp:
        candidate = local if local is not None else pip_download(comp.spec, Path(tmp))
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


class Extracted(NamedTuple):
    manifest: Manifest  # relative to the component root
    skipped: int


def extract(data: bytes, comp: Component, store: ObjectStore, strip_top: bool) -> Extracted:
    """Filtered extraction into the object store (forktool/archive.py checks every member first)."""
    from forktool import archive

    manifest, skipped = archive.extract_to_store(data, store, comp.spec, strip_top=strip_top, subdir=comp.subdir,
                                                 keep=lambda rel: keep(rel, comp))
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


def load_pristine_manifest(path: Path, use_cache: bool = True) -> Manifest:
    """A cached pristine manifest; a damaged one is refused (the cache is rebuilt by `forktool vendor fetch`).

    The manifest of exactly these bytes, once parsed and checked against its schema, is remembered in marshal
    form (forktool.cache.Memo, keyed by the bytes' sha256 and the checking code): about a quarter of the time
    of parsing, measuring and checking its thousand entries again."""
    from forktool import cache, schemas, tree

    hint = "delete it and run `forktool vendor fetch` to rebuild the pristine cache"
    data = schema.read_regular(path, path.name, schema.STATE_LIMIT)
    memo = cache.Memo(cache.user_cache_dir() if use_cache else None, "pristine-manifest")
    key = cache.key_of("pristine-manifest", cache.code_stamp(schema, schemas, tree), sha256_bytes(data))
    plain = memo.get(key)
    if type(plain) is dict:
        try:
            return {rel: Entry(sha, mode) for rel, (sha, mode) in plain.items()}
        except (TypeError, ValueError):
            pass
    try:
        raw = schema.check(schema.parse_json(schema.decode(data, path), str(path)), "pristine", str(path), hint=hint)
    except ConfigError as e:
        if not e.hint:
            e.hint = hint
        raise
    manifest = manifest_from_json(raw)
    memo.put(key, {rel: tuple(e) for rel, e in manifest.items()})
    return manifest


def lock_bytes(lock: dict) -> bytes:
    """vendor.lock's bytes: written directly here, or through a journal by a transaction that moves the pin."""
    return (json.dumps(lock, indent=2, sort_keys=True) + "\n").encode()


def write_lock(project: Project, lock: dict) -> None:
    atomic_write(project.vendor_lock, lock_bytes(lock))


def component_lock_key(comp: Component) -> dict:
    return {"kind": comp.kind, "spec": comp.spec, "sha256": comp.sha256, "upstream_commit": comp.upstream_commit,
            "include": list(comp.include), "exclude": list(comp.exclude), "subdir": comp.subdir}


class FetchResult(NamedTuple):
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
            from forktool import git as fgit

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


def read_pristine(project: Project, use_cache: bool = True) -> tuple[Manifest, str]:
    """The pristine manifest named by vendor.lock, which must already be in the cache (use_cache=False: parsed
    and checked from its bytes, not taken from the memo of an earlier read)."""
    lock = load_lock(project)
    d = lock.get("pristine_digest")
    if not d:
        raise ForktoolError("no pristine upstream recorded yet", where=str(project.vendor_lock),
                            hint="run `forktool vendor fetch`")
    p = pristine_path(project, d)
    if not p.is_file():
        res = fetch_pristine(project)
        return res.manifest, res.digest
    return load_pristine_manifest(p, use_cache), d


def materialise(project: Project, manifest: Manifest) -> None:
    """Write the pristine tree to the vendored root, into a temp dir renamed into place."""
    if project.tree.is_symlink():
        raise UnsafePathError(f"{project.tree} is a symlink; the vendored tree must be a real directory",
                              where=str(project.tree), hint=f"remove the link (`rm {project.tree}`) and run again")
    materialise_to(objects(project), manifest, project.tree)


def materialise_to(store: ObjectStore, manifest: Manifest, dest: Path) -> None:
    """The one materialiser: manifest's files and symlinks (each checked to stay inside) written to dest, which
    must not exist yet, through a temp dir renamed into place."""
    if os.path.lexists(dest):
        raise ForktoolError(f"{dest} already exists", where=str(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    import shutil

    tmp = make_temp_dir(dest.parent, f".{dest.name}-")
    try:
        for rel in sorted(manifest):
            p = resolve_inside(tmp, rel, "pristine manifest")
            e = manifest[rel]
            p.parent.mkdir(parents=True, exist_ok=True)
            data = store.get(e.sha256)
            if e.mode == SYMLINK:
                target = data.decode("utf-8", "surrogateescape")
                inside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
                if target.startswith("/") or inside == ".." or inside.startswith("../"):
                    raise UnsafePathError(f"pristine symlink {rel} -> {target} points outside the tree", where=rel)
                p.symlink_to(target)
            else:
                p.write_bytes(data)
                if e.mode == EXECUTABLE:
                    p.chmod(0o755)
        tmp.rename(dest)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if schema.is_no_space(e):
            raise schema.no_space(e, str(dest)) from None
        raise
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
