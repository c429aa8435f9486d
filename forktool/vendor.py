"""The pinned upstream: fetch by package name with pip, check sha256, safe filtered extract, pristine cache."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from forktool import schema
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
    digest,
    make_temp_dir,
    manifest_from_json,
    manifest_to_json,
    pid_alive,
    read_checked,
    remove_dead_work_dirs,
    remove_tree,
    resolve_inside,
    sha256_bytes,
    sha256_file,
    sha256_regular,
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


TMP = "tmp"  # in .opencoti/: the temporary directories of downloads and fetches
_OWNER_RE = re.compile(r"^[a-z-]+?-(\d+)-")


@contextmanager
def temp_dir(project: Project, prefix: str) -> Iterator[Path]:
    """A temporary directory under .opencoti/tmp/, never $TMPDIR: its name carries this process's id, so one that
    a kill leaves is removed by the next forktool that makes one there (or starts a sync)."""
    import tempfile

    parent = project.state_dir / TMP
    parent.mkdir(parents=True, exist_ok=True)
    clean_temp(project)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-", dir=parent) as tmp:
        yield Path(tmp)


def clean_temp(project: Project) -> list[str]:
    """Remove the temporary directories under .opencoti/tmp/ whose process is gone; their names."""
    parent = project.state_dir / TMP
    gone = []
    for p in sorted(parent.iterdir()) if parent.is_dir() and not parent.is_symlink() else []:
        m = _OWNER_RE.match(p.name)
        if m and pid_alive(int(m.group(1))):
            continue
        if p.is_dir() and not p.is_symlink():
            remove_tree(p)
        else:
            p.unlink()
        gone.append(p.name)
    return gone


def pip_download(requirement: str, dest: Path, progress: Callable[[str], None] | None = None) -> Path:
    """The one place forktool downloads: `pip download` of one source distribution into dest; returns its path.
    pip's own lines (what it collects, the size, where it saved it) go to `progress` as they come; pip's own
    temporary files go under dest too (TMPDIR), so a kill leaves nothing outside it."""
    from forktool import proc  # the download, extraction and git machinery load only when a fetch needs them

    argv: list[str | Path] = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                              "--disable-pip-version-check", "--progress-bar", "off", "-d", dest, requirement]
    (dest / "pip-tmp").mkdir(exist_ok=True)
    env = {"TMPDIR": str(dest / "pip-tmp")}
    if progress is None:
        proc.run(argv, env=env)
    else:
        proc.stream(argv, env=env, on_line=lambda line: progress(f"pip: {line}") if line.strip() else None)
    found = sorted(dest.glob("*.tar.gz"))
    if len(found) != 1:
        raise ForktoolError(f"pip did not produce one sdist for {requirement}", where=str(dest),
                            details=[p.name for p in found],
                            hint="check the component's package and version in vendor/vendor.yaml; pip's lines "
                                 "above say what it fetched")
    return found[0]


def _pinned_bytes(path: Path, sha: str) -> bytes | None:
    """The bytes of the cache entry at path when they hash to sha, else None (absent, not a regular file, other bytes):
    tree.read_checked, so an entry of other bytes is never held in memory and what is used is what was checked."""
    if not sha:
        return None
    try:
        return read_checked(path, sha)
    except OSError:
        return None


def sdist_bytes(project: Project, comp: Component, local: Path | None = None,
                progress: Callable[[str], None] | None = None) -> bytes:
    """The pinned sdist's bytes: the cache's entry when it holds them, else the local file or pip's download by name,
    refused on a sha256 mismatch and kept in the cache. Never read again by name after the hash: a shared cache
    cannot swap them between the check and the use."""
    dest = sdist_path(project, comp)
    data = _pinned_bytes(dest, comp.sha256)
    if data is not None:
        return data
    with temp_dir(project, "forktool-dl-") as tmp:
        if local is None and progress is not None:
            progress(f"downloading {comp.spec} with pip")
        candidate = local if local is not None else pip_download(comp.spec, tmp, progress)
        data = candidate.read_bytes()
        got = sha256_bytes(data)
        if got != comp.sha256:
            raise ForktoolError(
                f"sha256 mismatch for {comp.spec}: pinned {comp.sha256}, got {got}",
                where=str(candidate), hint="nothing was written; check the pin in vendor/vendor.yaml "
                "(a changed upstream release must be re-pinned on purpose, e.g. with `forktool sync --accept`)")
    # a temporary file of a random name, created exclusively: a link planted in the cache is never written through
    atomic_write(dest, data)
    return data


def download_sdist(project: Project, comp: Component, local: Path | None = None,
                   progress: Callable[[str], None] | None = None) -> Path:
    """The sdist in the cache, downloaded by name with pip when missing; refuses a sha256 mismatch."""
    sdist_bytes(project, comp, local, progress)
    return sdist_path(project, comp)


def url_bytes(project: Project, comp: Component, progress: Callable[[str], None] = lambda _m: None) -> bytes:
    """A tarball component's archive (content-addressed by its sha256 in the cache), fetched from its URL when the
    cache does not hold the pinned bytes; refuses a sha256 mismatch. Hashed as read, never read again by name."""
    import shutil
    import tempfile
    import urllib.error
    import urllib.request

    dest = project.cache_dir / "tarball" / f"{comp.sha256}.tar"
    data = _pinned_bytes(dest, comp.sha256)
    if data is not None:
        return data
    progress(f"downloading {comp.url}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="forktool-dl-", dir=dest.parent) as tmp:
        part = Path(tmp) / "archive"
        try:
            with urllib.request.urlopen(comp.url, timeout=120) as r, part.open("wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ForktoolError(f"cannot download {comp.url}: {getattr(e, 'reason', e)}", where=comp.url,
                                hint="check the URL (https://, http:// or file://) and the network") from None
        data = part.read_bytes()
        got = sha256_bytes(data)
        if comp.sha256 and got != comp.sha256:
            raise ForktoolError(f"sha256 mismatch for {comp.url}: pinned {comp.sha256}, got {got}", where=comp.url,
                                hint="nothing was written; a changed archive must be pinned again on purpose")
    # as for an sdist: a temporary file of a random name, and a directory there is refused naming it
    atomic_write(dest.parent / f"{got}.tar", data)
    return data


def dir_archive(project: Project, comp: Component) -> bytes:
    """A directory component as an in-memory tar (without .git), so that it passes the same member checks and
    filters as an archive does."""
    import io
    import tarfile

    root = source_dir(project, comp)
    buf = io.BytesIO()

    def skip_git(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if ".git" in ti.name.split("/") else ti

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(os.listdir(root)):
            tar.add(root / child, arcname=child, filter=skip_git)
    return buf.getvalue()


def source_dir(project: Project, comp: Component) -> Path:
    """A directory component's path (relative ones from the project root); refused when it is not a directory."""
    root = (project.root / comp.path) if not os.path.isabs(comp.path) else Path(comp.path)
    if not root.is_dir():
        raise ConfigError(f"component {comp.name!r}: {comp.path} is not a directory", where=str(root),
                          hint="point path: at the upstream's source directory (relative to the project root)")
    return root


def component_archive(project: Project, comp: Component, local_sdist: Path | None = None,
                      progress: Callable[[str], None] = lambda _m: None) -> tuple[bytes, bool]:
    """(a tar archive of the component's source, whether its top directory is dropped): every kind ends as one
    archive that `extract` checks and filters the same way."""
    if comp.kind == "sdist":
        return sdist_bytes(project, comp, local_sdist, progress), True
    if comp.kind == "tarball":
        return url_bytes(project, comp, progress), False
    if comp.kind == "dir":
        progress(f"reading {comp.path}")
        return dir_archive(project, comp), False
    progress(f"archiving {comp.spec} with git")
    from forktool import git as fgit

    return fgit.archive_commit(comp.url, comp.commit, project.cache_dir), False


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


_MODES = frozenset((REGULAR, EXECUTABLE, SYMLINK))
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _memo_manifest(plain: object) -> Manifest | None:
    """A remembered manifest, or None unless each entry has the shape whose digest line reads back one way only: a
    mode string of the three, 64 hex digits, a path string without a newline. Then a manifest that hashes to the name
    is the one named; without it a line could be folded into the next entry's mode (a file dropped, the digest the
    same) or a mode be an int that prints alike."""
    if type(plain) is not dict:
        return None
    out: Manifest = {}
    for rel, e in plain.items():
        if type(e) is not tuple or len(e) != 2:
            return None
        sha, mode = e
        if (type(rel) is not str or "\n" in rel or type(mode) is not str or mode not in _MODES
                or type(sha) is not str or not _SHA256.fullmatch(sha)):
            return None
        out[rel] = Entry(sha, mode)
    return out


def load_pristine_manifest(path: Path, use_cache: bool = True) -> Manifest:
    """A cached pristine manifest, named by its digest (pristine/DIGEST.json); one that is damaged or does not hash
    to its name is refused (`forktool vendor fetch` derives it again and writes it over).

    The manifest of exactly these bytes, once parsed and checked against its schema, is remembered in marshal
    form (forktool.cache.Memo, keyed by the bytes' sha256 and the checking code): about a quarter of the time
    of parsing, measuring and checking its thousand entries again. The memo sits in the shared user cache, so a
    remembered manifest is used only when it hashes to the name: it is verified against its content, not trusted.
    """
    from forktool import cache, schemas, tree

    hint = "run `forktool vendor fetch`: it derives the manifest again from the pinned upstream and writes it over"
    want = path.name.removesuffix(".json")
    data = schema.read_regular(path, path.name, schema.STATE_LIMIT)
    memo = cache.Memo(cache.user_cache_dir() if use_cache else None, "pristine-manifest")
    key = cache.key_of("pristine-manifest", cache.code_stamp(schema, schemas, tree), sha256_bytes(data))
    remembered = _memo_manifest(memo.get(key))
    if remembered is not None and digest(remembered) == want:
        return remembered
    try:
        raw = schema.check(schema.parse_json(schema.decode(data, path), str(path)), "pristine", str(path), hint=hint)
    except ConfigError as e:
        if not e.hint:
            e.hint = hint
        raise
    manifest = manifest_from_json(raw)
    got = digest(manifest)
    if got != want:
        raise ConfigError(f"cached pristine manifest {path.name} hashes to {got[:12]}, not to its name", where=str(path),
                          hint=hint)
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


def pin_moves(project: Project) -> list[str]:
    """For each component whose pin or filters in vendor/vendor.yaml differ from what vendor.lock records the tree
    was made from: "NAME: pinned SPEC, the tree holds LOCKED" (empty when they agree, or before the first fetch)."""
    recorded = load_lock(project).get("components") or {}
    out = []
    for c in project.vendor.components:
        was = recorded.get(c.name)
        now = component_lock_key(c)
        if was is None or was == now:
            continue
        was = was if isinstance(was, dict) else {}
        if was.get("spec") != c.spec:
            out.append(f"{c.name}: vendor.yaml pins {c.spec}, the tree holds {was.get('spec', '?')}")
        else:  # the same spec: say which of the pin's other keys differ
            keys = ", ".join(k for k in now if was.get(k) != now[k])
            out.append(f"{c.name}: vendor.yaml pins {c.spec} with another {keys} than the tree was made from")
    return out


class FetchResult(NamedTuple):
    manifest: Manifest
    digest: str
    files: int
    from_cache: bool
    skipped: int


def fetch_pristine(project: Project, *, local_sdist: Path | None = None,
                   progress: Callable[[str], None] = lambda _m: None, use_cache: bool = True) -> FetchResult:
    """Pristine manifest of all components (cached by the lock's digest), downloading as needed. use_cache=False: the
    cached manifest is not taken; the pinned archives are extracted and the digest compared with the lock's."""
    lock = load_lock(project)
    comps = project.vendor.components
    if local_sdist is not None:
        check_local_sdist(comps, local_sdist)
    pinned = {c.name: component_lock_key(c) for c in comps}
    cached_digest = lock.get("pristine_digest")
    # a directory has no digest of its own: it is read again, and the lock's digest then checks it. The cached
    # manifest is named by the lock's digest, not by the pin: where the lock is not the user's own (CI on a pull
    # request, with a cache a pull request can write), --no-cache derives it from the pinned bytes instead
    if use_cache and cached_digest and lock.get("components") == pinned and not any(c.kind == "dir" for c in comps):
        p = pristine_path(project, cached_digest)
        try:
            cached = load_pristine_manifest(p) if p.is_file() else None
        except ConfigError as bad:  # damaged, or not the manifest its name says: derived again and written over
            progress(f"the cached pristine manifest is not usable ({bad.what}): fetching the upstream again")
            cached = None
        if cached is not None:
            store = objects(project)
            # every object read and hashed (23 MB, about 0.2 s): "from cache" vouches for bytes it has checked
            damaged = sorted({e.sha256 for e in cached.values() if not store.intact(e.sha256)})
            if not damaged:
                return FetchResult(cached, cached_digest, len(cached), True, 0)
            for sha in damaged:
                store.discard(sha)
            progress(f"{len(damaged)} cached object(s) of the pristine upstream missing or damaged: fetching it again")
    store = objects(project)
    manifest: Manifest = {}
    skipped = 0
    for comp in comps:
        archive, strip_top = component_archive(project, comp, local_sdist if comp.kind == "sdist" else None, progress)
        progress(f"extracting {comp.name} (filters: {len(comp.include)} include, {len(comp.exclude)} exclude)")
        ex = extract(archive, comp, store, strip_top)
        skipped += ex.skipped
        for rel, e in ex.manifest.items():
            manifest[f"{comp.name}/{rel}"] = e
    d = digest(manifest)
    if cached_digest and lock.get("components") == pinned and cached_digest != d:
        raise ForktoolError(
            f"pristine digest {d} differs from vendor.lock ({cached_digest}) for the same pin",
            where=str(project.vendor_lock), hint="the upstream archive changed under the same pin; investigate "
            "before trusting it (delete the lock only if the change is understood)")
    atomic_write(pristine_path(project, d), json.dumps(manifest_to_json(manifest), sort_keys=True).encode())
    if lock.get("components") != pinned or lock.get("pristine_digest") != d:
        # the patched tree digest is of the series on the pristine it was recorded over: on another pristine (a pin
        # moved by `sync --accept`) it no longer holds, and the next `apply` of the whole series records it again
        lock = {"components": pinned, "pristine_digest": d, "pristine_files": len(manifest),
                "patched": lock.get("patched", {}) if lock.get("pristine_digest") == d else {}}
        write_lock(project, lock)
    return FetchResult(manifest, d, len(manifest), False, skipped)


def check_local_sdist(comps: tuple[Component, ...], path: Path) -> None:
    """A local sdist given on the command line is used or refused, never ignored: it must be a readable regular
    file with the sha256 pinned for the (one) sdist component."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ForktoolError(f"--sdist {path}: {e.strerror}", where=str(path),
                            hint="give the path of the downloaded .tar.gz, or leave out --sdist to download it "
                                 "with pip") from None
    if not stat.S_ISREG(st.st_mode):
        raise ForktoolError(f"--sdist {path}: not a regular file", where=str(path),
                            hint="give the path of the downloaded .tar.gz")
    sdists = [c for c in comps if c.kind == "sdist"]
    if len(sdists) != 1:
        raise ForktoolError(f"--sdist {path}: vendor/vendor.yaml has {len(sdists)} sdist component(s), so there is "
                            "no one pinned sdist this file could stand for", where="--sdist",
                            hint="leave out --sdist (git components are archived with git)")
    try:
        got = sha256_file(path)
    except OSError as e:
        raise ForktoolError(f"--sdist {path}: cannot be read: {e.strerror}", where=str(path),
                            hint="give the path of a readable sdist file") from None
    if got != sdists[0].sha256:
        raise ForktoolError(f"sha256 mismatch for --sdist {path}: {sdists[0].spec} is pinned at {sdists[0].sha256}, "
                            f"the file is {got}", where=str(path), hint="nothing was written; give the sdist "
                            "vendor/vendor.yaml pins, or leave out --sdist to download it with pip")


def read_pristine(project: Project, use_cache: bool = True) -> tuple[Manifest, str]:
    """The pristine manifest named by vendor.lock, which must already be in the cache (use_cache=False: parsed
    and checked from its bytes, not taken from the memo of an earlier read)."""
    lock = load_lock(project)
    d = lock.get("pristine_digest")
    if not d:
        raise ForktoolError("no pristine upstream recorded yet", where=str(project.vendor_lock),
                            hint="run `forktool vendor fetch`")
    p = pristine_path(project, d)
    if not os.path.lexists(p):
        # only `vendor fetch` downloads (with progress); everything else says what is missing
        raise ForktoolError(f"the pristine upstream {d[:12]} named by vendor/vendor.lock is not in the cache",
                            where=str(p), hint="run `forktool vendor fetch` to download and unpack it "
                            "(FORKTOOL_CACHE chooses the cache directory)")
    return load_pristine_manifest(p, use_cache), d


def materialise(project: Project, manifest: Manifest) -> None:
    """Write the pristine tree to the vendored root, into a temp dir renamed into place."""
    if project.tree.is_symlink():
        raise UnsafePathError(f"{project.tree} is a symlink; the vendored tree must be a real directory",
                              where=str(project.tree), hint=f"remove the link (`rm {project.tree}`) and run again")
    materialise_to(objects(project), manifest, project.tree)


def clean_materialise_temps(dest: Path) -> list[str]:
    """Remove the temporary directories beside dest that a killed materialisation of dest left (named
    `.NAME-PID-RANDOM` by materialise_to, PID gone); their names. Nothing of another shape is touched."""
    return remove_dead_work_dirs(dest.parent, re.compile(rf"^\.{re.escape(dest.name)}-(\d+)-[0-9a-f]{{12}}$"))


def materialise_to(store: ObjectStore, manifest: Manifest, dest: Path) -> None:
    """The one materialiser: manifest's files and symlinks (each checked to stay inside) written to dest, which
    must not exist yet, through a temp dir renamed into place."""
    if os.path.lexists(dest):
        raise ForktoolError(f"{dest} already exists", where=str(dest),
                            hint="move it away and run the command again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    import shutil

    # the temp dir's name carries this process's id: one a kill left behind (a partial tree beside the real one,
    # which git would show as untracked) is removed by the next materialisation there
    prefix = f".{dest.name}-{os.getpid()}-"
    clean_materialise_temps(dest)
    tmp = make_temp_dir(dest.parent, prefix)
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
                    raise UnsafePathError(f"pristine symlink {rel} -> {target} points outside the tree", where=rel,
                                          hint="the cached pristine is damaged: `forktool vendor fetch` writes it "
                                               "again")
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


def verify_pristine_cache(project: Project, use_cache: bool = True) -> list[str]:
    """Problems with the cached pristine tree against vendor.lock (empty when fine; use_cache=False: the manifest
    is parsed and checked from its bytes)."""
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
    manifest = load_pristine_manifest(p, use_cache)  # refused unless it hashes to d
    if len(manifest) != lock.get("pristine_files"):
        problems.append(f"pristine has {len(manifest)} files, vendor.lock says {lock.get('pristine_files')}")
    store = objects(project)
    for rel, e in sorted(manifest.items()):
        try:
            got = sha256_regular(store.path(e.sha256))  # opened without blocking: a FIFO swapped in is never waited on
        except OSError:
            problems.append(f"{rel}: object {e.sha256[:12]} missing from the cache")
            continue
        if got != e.sha256:
            problems.append(f"{rel}: cached object {e.sha256[:12]} is corrupt")
    return problems


def pristine_bytes(project: Project, manifest: Manifest, rel: str) -> bytes | None:
    e = manifest.get(rel)
    return None if e is None else objects(project).get(e.sha256)
