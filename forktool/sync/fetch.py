"""The other upstream: resolve a SPEC against the pin, fetch it with pip or git into the object store."""

from __future__ import annotations

import io
import re
import tarfile
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
from forktool.tree import Entry, Manifest, atomic_write, holds, sha256_file


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


# the subdir of a new source not given with SPEC: found in its archive by the pinned component's top-level names
DETECT = "\x00detect"
OPTIONS = ("subdir", "sha256", "upstream_commit")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")
HINT = ("SPEC names the upstream to move to: PACKAGE==VERSION (the pinned package at another version, or another "
        "PyPI package), PACKAGE alone (its newest release), a local sdist, tarball or directory (a path), an "
        "https:// or file:// URL of a tar archive with its sha256, or a git COMMIT / URL@COMMIT (40 hex digits); "
        "options: --subdir DIR (where the llama.cpp tree sits in the source), --sha256 HEX, --upstream-commit COMMIT")


def spec_with(spec: str | None, subdir: str | None = None, sha256: str | None = None,
              upstream_commit: str | None = None) -> str | None:
    """SPEC with the options that qualify it written after '#' (as pip writes #sha256= and #subdirectory=), so the
    recorded SPEC names the upstream completely."""
    given = {"subdir": subdir, "sha256": sha256, "upstream_commit": upstream_commit}
    extra = "&".join(f"{k}={v}" for k, v in given.items() if v is not None)
    if not extra:
        return spec
    if spec is None:
        named = ", ".join("--" + k.replace("_", "-") for k, v in given.items() if v is not None)
        raise UsageError(f"{named} qualify(ies) --to SPEC, which is not given", where="forktool sync",
                         hint="e.g. `forktool sync --to ./llama.cpp-b1234.tar.gz --upstream-commit COMMIT --start`")
    return f"{spec}&{extra}" if "#" in spec else f"{spec}#{extra}"


def _split_options(spec: str) -> tuple[str, dict[str, str]]:
    base, sep, frag = spec.partition("#")
    opts: dict[str, str] = {}
    for part in frag.split("&") if sep else []:
        key, eq, value = part.partition("=")
        if key == "subdirectory":
            key = "subdir"
        if not eq or key not in OPTIONS:
            raise UsageError(f"unknown option {part!r} after '#' in {spec!r}", where="--to",
                             hint=f"known: {', '.join(OPTIONS)} (e.g. URL#sha256=HEX)")
        opts[key] = value
    if "sha256" in opts and not re.fullmatch(r"[0-9a-f]{64}", opts["sha256"]):
        raise UsageError(f"--sha256 {opts['sha256']!r} is not 64 lowercase hex digits", where="--to", hint=HINT)
    if opts.get("upstream_commit") is not None and not COMMIT_RE.match(opts["upstream_commit"]):
        raise UsageError(f"--upstream-commit {opts['upstream_commit']!r} is not a full 40-hex commit id",
                         where="--to", hint="give llama.cpp's commit the source carries, e.g. from its release page")
    sub = opts.get("subdir")
    if sub is not None:
        parts = [x for x in sub.strip("/").split("/") if x]
        if any(x in (".", "..") for x in parts) or sub.startswith("/") or "\\" in sub:
            raise UsageError(f"--subdir {sub!r} must be a relative path inside the source", where="--to", hint=HINT)
        opts["subdir"] = "/".join(parts)
    return base.strip(), opts


def _pick(project: Project, spec: str, match: Callable[[Component], bool]) -> Component:
    """The component SPEC moves: the one it names, else the only one there is."""
    comps = project.vendor.components
    named = [c for c in comps if match(c)]
    if len(named) == 1:
        return named[0]
    if len(comps) == 1:
        return comps[0]
    raise UsageError(f"cannot tell which component {spec!r} replaces", where="--to",
                     details=[f"{c.name}: {c.kind} {c.spec}" for c in comps],
                     hint="vendor/vendor.yaml has several components and SPEC names none of them (same package "
                          "or git URL); move one at a time by naming its package or URL")


def _is_path(base: str) -> bool:
    return "/" in base or base.startswith(".") or base.endswith(ARCHIVE_SUFFIXES) or Path(base).exists()


def resolve_spec(project: Project, spec: str) -> tuple[Component, Component]:
    """(pinned component, the component SPEC names in its place); an sdist's sha256 stays empty until fetched, a
    subdir not given is DETECT until the source is read (fetch_target finds it)."""
    base, opts = _split_options(spec.strip())
    keep_commit = opts.get("upstream_commit", "")
    if not base:
        raise UsageError("--to names no upstream", where="--to", hint=HINT)
    if base.startswith(("http://", "https://", "file://")) and not _git_commit_spec(base):
        if "sha256" not in opts:
            raise UsageError(f"{base} needs its sha256 to be pinned", where="--to",
                             hint="add --sha256 HEX (the digest of the archive, from its release page or "
                                  "`sha256sum`); forktool refuses a download it cannot check")
        if not base.endswith(ARCHIVE_SUFFIXES):
            raise UsageError(f"{base} does not name a tar archive", where="--to",
                             hint=f"a URL of a tar archive ({', '.join(ARCHIVE_SUFFIXES)}) is expected; " + HINT)
        old = _pick(project, spec, lambda c: c.kind == "tarball" and c.url == base)
        same = old.kind == "tarball"
        return old, _moved(old, opts, same, kind="tarball", url=base, sha256=opts["sha256"],
                           upstream_commit=keep_commit)
    if not _git_commit_spec(base) and _is_path(base):
        local = Path(base).expanduser()
        local = local if local.is_absolute() else Path.cwd() / local
        if local.is_dir():
            old = _pick(project, spec, lambda c: c.kind == "dir")
            return old, _moved(old, opts, old.kind == "dir", kind="dir", path=str(local.resolve()),
                               upstream_commit=keep_commit)
        if not local.is_file():
            raise UsageError(f"{base} looks like a path, but there is no such file or directory", where="--to",
                             hint=HINT)
        if not local.name.endswith(ARCHIVE_SUFFIXES):
            raise UsageError(f"{base} is not a tar archive (by its name) nor a directory", where="--to",
                             hint=f"a local sdist or tarball ends in one of {', '.join(ARCHIVE_SUFFIXES)}")
        sha = sha256_file(local)
        if opts.get("sha256", sha) != sha:
            raise UsageError(f"{base} has sha256 {sha}, not the {opts['sha256']} given", where="--to",
                             hint="check that this is the archive you meant")
        old = _pick(project, spec, lambda c: False)
        url = local.resolve().as_uri()
        # a local archive's layout (its top directory, the sdist's vendor/llama.cpp) is found in it
        return old, _moved(old, opts, False, kind="tarball", url=url, sha256=sha, upstream_commit=keep_commit)
    if _git_commit_spec(base):
        url, _, commit = base.rpartition("@")
        old = _pick(project, spec, lambda c: c.kind == "git" and (not url or c.url == url))
        if not url and old.kind != "git":
            raise UsageError(f"{base} is a bare commit, but the pinned component {old.name!r} is a {old.kind}, "
                             "not a git repository", where="--to",
                             hint="name the repository too: URL@COMMIT (a local path or a git URL)")
        url = url or old.url
        if not keep_commit and old.kind == "git" and old.upstream_commit == old.commit:
            keep_commit = commit  # the repository is llama.cpp itself: its commit is the upstream commit
        return old, _moved(old, opts, old.kind == "git" and old.url == url, kind="git", url=url, commit=commit,
                           upstream_commit=keep_commit)
    pkg, eq, version = base.partition("==")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", pkg) or (eq and not re.fullmatch(r"[0-9A-Za-z.+!-]+", version)):
        raise UsageError(f"{spec!r} is not PACKAGE==VERSION, a path, a URL or a commit", where="--to", hint=HINT)
    old = _pick(project, spec, lambda c: c.kind == "sdist" and _norm(c.package) == _norm(pkg))
    same = old.kind == "sdist" and _norm(old.package) == _norm(pkg)
    return old, _moved(old, opts, same, kind="sdist", package=pkg if not same else old.package, version=version,
                       sha256="", upstream_commit=keep_commit)


def names_target(project: Project, spec: str, recorded: Component) -> bool:
    """Whether SPEC (with its #options) names the recorded target: both in the form the state records (the
    component's own spec, and each option given equal to the recorded field)."""
    _, new = resolve_spec(project, spec)
    _, opts = _split_options(spec.strip())
    if new.kind == "sdist" and not new.version:  # PACKAGE alone: its newest release, whichever the start found
        new = new._replace(version=recorded.version)
    if new.kind != recorded.kind or new.spec != recorded.spec:
        return False
    if new.kind == "sdist" and _norm(new.package) != _norm(recorded.package):
        return False
    return all(getattr(recorded, k) == v for k, v in opts.items())


def _git_commit_spec(base: str) -> bool:
    url, at, commit = base.rpartition("@")
    return COMMIT_RE.match(commit) is not None and (bool(at) or not url)


def _moved(old: Component, opts: dict[str, str], same_source: bool, **fields: str) -> Component:
    """old with its source replaced; filters kept. Another source's layout is not assumed: its subdir is found
    in it unless given."""
    f = {k: "" for k in ("package", "version", "sha256", "url", "commit", "path", "upstream_commit")} | fields
    return old._replace(kind=f["kind"], package=f["package"], version=f["version"], sha256=f["sha256"],
                        url=f["url"], commit=f["commit"], path=f["path"], upstream_commit=f["upstream_commit"],
                        subdir=opts.get("subdir", old.subdir if same_source else DETECT))


def _by_spec(project: Project, comp: Component) -> Path:
    """Which sdist PACKAGE==VERSION resolved to (its sha256): kept with the project's own state, since an entry
    in the shared cache would choose the upstream bytes for whoever can write that cache."""
    return project.state_dir / "cache" / "sdist-by-spec" / f"{_norm(comp.package)}=={comp.version}"


def _fetch_sdist(project: Project, comp: Component, progress: Callable[[str], None]) -> tuple[Component, Path, bool]:
    """The sdist for comp in the cache, its sha256 computed (PyPI never replaces a released file)."""
    if comp.sha256:  # the pin itself: vendor checks the pinned sha256
        # "cached" only for bytes checked here: a damaged or planted entry under the name is downloaded again
        path = vendor.sdist_path(project, comp)
        if holds(path, comp.sha256):
            return comp, path, True
        return comp, vendor.download_sdist(project, comp), False
    if comp.version:
        known = _by_spec(project, comp)
        sha = known.read_text().strip() if known.is_file() else ""
        if sha:
            comp = comp._replace(sha256=sha)
            path = vendor.sdist_path(project, comp)
            if holds(path, sha):
                return comp, path, True
    with vendor.temp_dir(project, "forktool-sync-dl-") as tmp:
        want = f"{comp.package}=={comp.version}" if comp.version else comp.package
        progress(f"downloading {want} with pip")
        found = [vendor.pip_download(want, tmp)]
        m = re.match(r"^(.+)-([^-]+)\.tar\.gz$", found[0].name)
        version = comp.version or (m.group(2) if m else "")
        if not version:
            raise ForktoolError(f"cannot read the version from {found[0].name}", where=want,
                                hint="name the version in the target: `--to PACKAGE==VERSION`")
        comp = comp._replace(version=version, sha256=sha256_file(found[0]))
        path = vendor.download_sdist(project, comp, found[0])
    atomic_write(_by_spec(project, comp), (comp.sha256 + "\n").encode())
    return comp, path, False


def _archive_commit(project: Project, data: bytes, strip_top: bool, subdir: str) -> str:
    """The upstream commit an archive carries for the tree at subdir ('' when it carries none): the gitlink of a
    .git directory the archive holds above subdir (an sdist's submodule), else, for a tree at the archive's root
    or its one top directory, the commit `git archive` writes in the pax header (GitHub's release archives)."""
    parts = [p for p in subdir.split("/") if p]
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        names = tar.getnames()
        found = next((k for k in range(len(parts)) if any(
            _member_parts(n, strip_top)[: k + 1] == parts[:k] + [".git"] for n in names)), None)
        if found is not None:
            return _gitlink_in(project, tar, strip_top, parts[:found], "/".join(parts[found:]))
        comment = tar.pax_headers.get("comment", "")
    if len(parts) <= 1 and COMMIT_RE.match(comment):
        return comment
    return ""


def _sdist_upstream_commit(project: Project, data: bytes, comp: Component) -> str:
    """The commit of the submodule at comp.subdir of an sdist, read from the .git it carries ('' when absent)."""
    return _archive_commit(project, data, True, comp.subdir) if comp.subdir else ""


def _member_parts(name: str, strip_top: bool) -> list[str]:
    parts = [p for p in name.split("/") if p and p != "."]
    return parts[1:] if strip_top else parts


def _gitlink_in(project: Project, tar: tarfile.TarFile, strip_top: bool, above: list[str], rel: str) -> str:
    """The commit that the .git at `above` records for the submodule at rel (read from a temporary copy)."""
    with vendor.temp_dir(project, "forktool-sync-git-") as root:
        prefix = [*above, ".git"]
        for m in tar:
            parts = _member_parts(m.name, strip_top)
            # only that .git's regular files, no funny names
            if parts[: len(prefix)] != prefix or len(parts) <= len(prefix) or not m.isfile() or ".." in parts \
                    or m.name.startswith("/"):
                continue
            f = tar.extractfile(m)
            if f is None:
                continue
            dest = root.joinpath(".git", *parts[len(prefix):])
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read())
        if not (root / ".git" / "HEAD").is_file():
            return ""
        return fgit.gitlink_commit(root / ".git", rel) or ""


def _dir_commit(project: Project, comp: Component) -> str:
    """The commit of a directory source that is a git checkout (its HEAD, or the submodule at subdir)."""
    root = vendor.source_dir(project, comp)
    if not (root / ".git").exists():
        return ""
    if comp.subdir:
        return fgit.gitlink_commit(root / ".git", comp.subdir) or ""
    return fgit.head_commit(root) or ""


def detect_subdir(data: bytes, strip_top: bool, landmarks: set[str], where: str) -> str:
    """The directory of the archive that holds most of landmarks (the pinned tree's top-level names), the
    shallowest on a tie; refused when none holds half of them."""
    from forktool import archive

    paths: set[str] = set()
    dirs: set[str] = {""}
    for m in archive.members(data, where, strip_top):
        parts = m.rel.split("/")
        for k in range(1, len(parts) + 1):
            paths.add("/".join(parts[:k]))
            if k < len(parts):
                dirs.add("/".join(parts[:k]))
    def score(d: str) -> int:
        return sum(1 for t in landmarks if (f"{d}/{t}" if d else t) in paths)
    best = min(dirs, key=lambda d: (-score(d), d.count("/"), d))
    if landmarks and score(best) * 2 >= len(landmarks):
        return best
    top = sorted({p.split("/")[0] for p in paths})
    raise UsageError(f"cannot find the upstream tree in {where}", where="--to",
                     details=[f"expected a directory holding the pinned tree's top-level entries: "
                              f"{', '.join(sorted(landmarks))}", f"the source's top level holds: {', '.join(top[:30])}"],
                     hint="name the directory with --subdir DIR (e.g. --subdir llama.cpp or --subdir vendor/llama.cpp)")


def component_manifest(project: Project, comp: Component, progress: Callable[[str], None] = lambda _m: None,
                       landmarks: set[str] | None = None) -> tuple[Component, Manifest, bool]:
    """One component's files (relative to its root) in the object store, cached by its lock key (a directory,
    which has no digest of its own, is read every time); a DETECT subdir is found by landmarks first."""
    store = vendor.objects(project)
    from_cache = False
    data: bytes | None = None
    strip_top = comp.kind == "sdist"
    if comp.kind == "sdist":
        comp, path, from_cache = _fetch_sdist(project, comp, progress)
    elif comp.kind == "tarball":  # as for an sdist: cached only when the entry holds the pinned bytes
        cached_tar = project.cache_dir / "tarball" / f"{comp.sha256}.tar"
        from_cache = holds(cached_tar, comp.sha256)
    if comp.subdir == DETECT:
        data, strip_top = vendor.component_archive(project, comp, progress=progress)
        comp = comp._replace(subdir=detect_subdir(data, strip_top, landmarks or set(), comp.spec))
        progress(f"found the upstream tree at {comp.subdir or 'the top level'} of {comp.spec}")
    # the extraction is derived from the component's bytes and filters, so it is remembered with the project's
    # own state (.opencoti/cache/), never in the shared cache, and an entry that is not exactly what was stored is
    # ignored (extracted again); a directory, which has no digest of its own, is read every time
    extracted = Cache(caches_root(project.state_dir), "sync-component")
    key = key_of("sync-component", vendor.component_lock_key(comp))
    if comp.kind != "dir":
        hit: Any = extracted.get(key)
        try:
            files = {str(p): Entry(str(v[0]), str(v[1])) for p, v in hit["files"].items()}
            commit = str(hit["upstream_commit"])
        except (TypeError, KeyError, IndexError, AttributeError):
            files = {}
        if files and all(store.has(e.sha256) for e in files.values()):
            return comp._replace(upstream_commit=comp.upstream_commit or commit), files, from_cache
    if data is None:
        data, strip_top = vendor.component_archive(project, comp, progress=progress)
    progress(f"extracting {comp.spec}")
    files = vendor.extract(data, comp, store, strip_top=strip_top).manifest
    # a given (or pinned) upstream commit is authoritative; else it is read from what the source carries
    if not comp.upstream_commit:
        if comp.kind in ("sdist", "tarball"):
            commit = _archive_commit(project, data, strip_top, comp.subdir)
        elif comp.kind == "dir":
            commit = _dir_commit(project, comp)
        else:
            commit = ""
        comp = comp._replace(upstream_commit=commit)
    if comp.kind != "dir":
        extracted.put(key, {"files": {p: e.to_json() for p, e in sorted(files.items())},
                            "upstream_commit": comp.upstream_commit})
    return comp, files, from_cache


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
                 progress: Callable[[str], None] = lambda _m: None, need_commit: bool = True) -> Target:
    """Fetch the other upstream into the object store; the whole vendored root's manifest for it. need_commit:
    a source that does not say its llama.cpp commit is refused where the pin records one (a move records it in
    the pin and the build stamps); a trial, which records nothing, goes on without it and says so."""
    t0 = time.monotonic()
    prefix = f"{old.name}/"
    landmarks = {p[len(prefix):].split("/")[0] for p in pinned if p.startswith(prefix)}
    new, comp_manifest, from_cache = component_manifest(project, new, progress, landmarks)
    if need_commit and not new.upstream_commit and old.upstream_commit:
        raise UsageError(f"{new.spec} does not say which llama.cpp commit it carries", where="--to",
                         hint="give it with --upstream-commit COMMIT (from the source's release notes or "
                              "llama.cpp's tag); the pin and the build stamps record it")
    manifest = {p: e for p, e in pinned.items() if not p.startswith(prefix)}
    manifest.update({prefix + p: e for p, e in comp_manifest.items()})
    return Target(old, new, manifest, len(comp_manifest), time.monotonic() - t0, from_cache)
