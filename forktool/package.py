"""Deterministic release directories and archives: binaries, manifest, SHA256SUMS, notes, patched source."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import jinja2

from forktool import archive, schema, txn
from forktool.errors import ForktoolError, UnsafePathError, VerifyError
from forktool.project import Project
from forktool.series import series_digest, series_digest_of
from forktool.tree import EXECUTABLE, REGULAR, SYMLINK, Entry, digest, remove_dead_work_dirs, sha256_bytes, sha256_file

if TYPE_CHECKING:
    from forktool.build import BuildConfig, Profile

FORMAT = 1
SUMS = "SHA256SUMS"
MANIFEST = "manifest.json"
NOTES = "RELEASE_NOTES.md"
TEMPLATES = Path(__file__).parent / "templates"


@dataclass
class ReleaseSpec:
    """Everything a release is made from; the same spec gives the same bytes."""

    name: str
    files: dict[str, Path]  # release path (bin/llama-cli) -> file to copy
    source_tree: Path  # archived as <name>-source.tar.gz, entries under <name>-source/
    manifest: dict[str, Any]  # upstream pin, series, build facts; `files` and the source facts are added here
    notes: dict[str, Any]  # extra context for the release notes template
    epoch: int = 0  # mtime of every archive entry (SOURCE_DATE_EPOCH)


def source_date_epoch() -> int:
    raw = os.environ.get("SOURCE_DATE_EPOCH", "0")
    if not raw.isdigit():
        raise ForktoolError(f"SOURCE_DATE_EPOCH={raw!r} is not a whole number of seconds", where="SOURCE_DATE_EPOCH",
                            hint="unset it or give seconds since 1970")
    return int(raw)


# ---------------------------------------------------------------- deterministic tar.gz


def _info(name: str, kind: bytes, mode: int, epoch: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.mtime = epoch
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.size = size
    ti.linkname = link
    return ti


def tree_entries(root: Path) -> list[tuple[str, Path]]:
    """(relative posix path, path) of every directory, file and symlink under root, sorted by path."""
    out = []
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(d, n)
            out.append((p.relative_to(root).as_posix(), p))
    return sorted(out)


def write_targz(root: Path, prefix: str, dest: Path, epoch: int) -> None:
    """root as a tar.gz with entries under prefix/: sorted, fixed mtime and owner, no gzip name or time."""
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(prefix, tarfile.DIRTYPE, 0o755, epoch))
        for rel, p in tree_entries(root):
            name = f"{prefix}/{rel}"
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(p)
                # invariant: nothing in an archive may point outside its root
                if target.startswith("/") or ".." in PurePosixPath(rel).parent.joinpath(target).parts:
                    raise UnsafePathError(f"symlink {rel} -> {target} points outside the tree", where=str(p),
                                          hint="remove the link or make it point inside the tree; `forktool verify` "
                                               "names what changed there")
                tar.addfile(_info(name, tarfile.SYMTYPE, 0o777, epoch, link=target))
            elif stat.S_ISDIR(st.st_mode):
                tar.addfile(_info(name, tarfile.DIRTYPE, 0o755, epoch))
            elif stat.S_ISREG(st.st_mode):
                mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                with open(p, "rb") as src:
                    tar.addfile(_info(name, tarfile.REGTYPE, mode, epoch, size=st.st_size), src)
    os.replace(tmp, dest)


def archive_tree_digest(path: Path, prefix: str) -> str:
    """The forktool tree digest of what an archive holds under prefix/ (files and symlinks; dirs implied)."""
    manifest: dict[str, Entry] = {}
    for m in archive.members(path, str(path), subdir=prefix):
        if m.kind == "symlink":
            manifest[m.rel] = Entry(sha256_bytes(m.data), SYMLINK)
        elif m.kind == "file":
            manifest[m.rel] = Entry(sha256_bytes(m.data), EXECUTABLE if m.executable else REGULAR)
    return digest(manifest)


# ---------------------------------------------------------------- release


def render_notes(context: dict[str, Any]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, autoescape=False, trim_blocks=True,
                             lstrip_blocks=True)
    return env.get_template("release_notes.md.j2").render(**context)


def sums_text(files: dict[str, str]) -> str:
    return "".join(f"{files[p]}  {p}\n" for p in sorted(files))


def _refuse_odd_places(out_dir: Path, final: Path, arc: Path) -> None:
    """Before anything is written: the output directory is a directory (or absent), and where the release's
    directory and archive go there is nothing, or an older copy of the same kind (never a link, file or directory
    where the other belongs)."""
    hint = "move it away (forktool replaces only a release directory and archive it wrote) or pass another --out"
    if os.path.lexists(out_dir) and not out_dir.is_dir():
        what = "a symlink to nothing" if out_dir.is_symlink() else "not a directory"
        raise ForktoolError(f"the output directory {out_dir} is {what}", where=str(out_dir),
                            hint="pass --out a directory (or a path where one can be made)")
    for path, kind in ((final, "the release directory"), (arc, "the release archive")):
        if not os.path.lexists(path):
            continue
        if path.is_symlink():
            raise ForktoolError(f"{path.name} is a symlink where {kind} belongs", where=str(path), hint=hint)
        if kind == "the release directory" and not path.is_dir():
            raise ForktoolError(f"{path.name} is a file where {kind} belongs", where=str(path), hint=hint)
        if kind == "the release archive" and not path.is_file():
            raise ForktoolError(f"{path.name} is not a regular file where {kind} belongs", where=str(path),
                                hint=hint)


def write_release(spec: ReleaseSpec, out_dir: Path) -> dict[str, Any]:
    """Write out_dir/<name>/ and out_dir/<name>.tar.gz, replacing an older copy only once the new one is whole.

    The older directory is moved aside whole (one rename) before the new one is renamed in, so a kill never leaves
    a half-removed release under the release's name; the work directory's name carries this process's id, and the
    next run for the same release removes one whose process is gone."""
    final = out_dir / spec.name
    arc = out_dir / f"{spec.name}.tar.gz"
    _refuse_odd_places(out_dir, final, arc)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise ForktoolError(f"cannot make the output directory {out_dir}: {e.strerror}", where=str(out_dir),
                            hint="pass --out a directory (or a path where one can be made)") from e
    # the work directories of earlier runs for this release that a kill left
    remove_dead_work_dirs(out_dir, re.compile(rf"^\.{re.escape(spec.name)}\.(\d+)-"))
    work = Path(tempfile.mkdtemp(prefix=f".{spec.name}.{os.getpid()}-", dir=out_dir))
    try:
        stage = work / spec.name
        stage.mkdir()
        for rel, src in sorted(spec.files.items()):
            dst = stage / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755 if os.stat(src).st_mode & stat.S_IXUSR else 0o644)
        src_name = f"{spec.name}-source"
        write_targz(spec.source_tree, src_name, stage / f"{src_name}.tar.gz", spec.epoch)
        manifest = dict(spec.manifest, format=FORMAT, name=spec.name, source_date_epoch=spec.epoch,
                        source_archive={"file": f"{src_name}.tar.gz", "prefix": src_name,
                                        "tree_digest": archive_tree_digest(stage / f"{src_name}.tar.gz", src_name)})
        binaries = {rel: sha256_file(stage / rel) for rel in sorted(spec.files)}
        notes = render_notes(dict(spec.notes, manifest=manifest, binaries=binaries))
        (stage / NOTES).write_text(notes, encoding="utf-8")
        files = {rel: sha256_file(stage / rel) for rel, p in tree_entries(stage) if p.is_file()}
        manifest["files"] = files
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        files[MANIFEST] = sha256_file(stage / MANIFEST)
        (stage / SUMS).write_text(sums_text(files), encoding="utf-8")
        for _rel, p in tree_entries(stage):
            if p.is_dir():
                os.chmod(p, 0o755)
            elif p.is_file() and not os.stat(p).st_mode & stat.S_IXUSR:
                os.chmod(p, 0o644)
        archive = work / f"{spec.name}.tar.gz"
        write_targz(stage, spec.name, archive, spec.epoch)
        if os.path.lexists(final):
            os.rename(final, work / "replaced")  # whole, in one step; removed with the work directory
        txn.fault("package-replacing")
        os.replace(stage, final)
        os.replace(archive, arc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"dir": str(final), "archive": str(out_dir / f"{spec.name}.tar.gz"),
            "archive_sha256": sha256_file(out_dir / f"{spec.name}.tar.gz"), "files": len(files) + 1,
            "name": spec.name}


# ---------------------------------------------------------------- verify


_SUM_RE = re.compile(r"^([0-9a-f]{64})  (.+)$")


def _safe_rel(rel: str, where: str) -> str:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or rel != p.as_posix():
        raise VerifyError(f"unsafe path {rel!r}", where=where, hint="this release was not made by forktool")
    return rel


def verify_release(directory: Path, work: Path | None = None) -> dict[str, Any]:
    """Re-check every sum and the manifest of a release directory (or its .tar.gz); raise on any difference.
    work: where an archive is extracted (else $TMPDIR)."""
    if directory.is_file() and directory.name.endswith(".tar.gz"):
        with tempfile.TemporaryDirectory(prefix="forktool-verify-", dir=work) as tmp:
            archive.extract_to_dir(directory, Path(tmp))  # checked member by member before the first write
            # the reader keeps no directory entry: make the archive's directories too, so that one holding no
            # listed file is seen as in a directory (the names passed the reader's checks above)
            with tarfile.open(directory) as tar:
                for member in tar:
                    if member.isdir() and member.name.strip("/"):
                        Path(tmp, member.name.strip("/")).mkdir(parents=True, exist_ok=True)
            tops = os.listdir(tmp)
            if len(tops) != 1:
                raise VerifyError("the archive must hold exactly one release directory", where=str(directory),
                                  hint="give the archive `forktool package` wrote, unchanged")
            res = verify_release(Path(tmp, tops[0]))
            return dict(res, directory=str(directory))
    if not directory.is_dir():
        raise VerifyError(f"{directory} is not a release directory", where=str(directory),
                          hint="pass the directory `forktool package` printed (dist/NAME) or its .tar.gz")
    problems: list[str] = []
    try:
        text = (directory / SUMS).read_text(encoding="utf-8")
    except (FileNotFoundError, UnicodeDecodeError) as e:
        raise VerifyError(f"{SUMS} is missing or unreadable", where=str(directory),
                          hint="give the whole directory `forktool package` wrote (or its archive)") from e
    sums: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        m = _SUM_RE.match(line)
        if not m:
            problems.append(f"{SUMS}:{n}: malformed line")
            continue
        rel = _safe_rel(m.group(2), f"{SUMS}:{n}")
        if rel in sums:  # every line is a claim `sha256sum -c` checks: one kept over another would go unchecked
            problems.append(f"{SUMS}:{n}: {rel} is listed again")
            continue
        sums[rel] = m.group(1)
    entries = tree_entries(directory)
    # a symlink is an entry of its own even where it leads to a directory (os.walk does not enter it), and every real
    # directory must hold a listed file: what `sha256sum -c` never looks at is still shipped with the directory
    dirs = {rel for rel, p in entries if p.is_dir() and not p.is_symlink()}
    on_disk = {rel for rel, _p in entries if rel not in dirs} - {SUMS}
    for rel in sorted(on_disk - set(sums)):
        problems.append(f"{rel}: present but not listed in {SUMS}")
    needed = {"/".join(rel.split("/")[:k]) for rel in sums for k in range(1, rel.count("/") + 1)}
    for rel in sorted(dirs - needed):
        problems.append(f"{rel}/: a directory that holds no file listed in {SUMS}")
    for rel in sorted(set(sums) - on_disk):
        problems.append(f"{rel}: listed in {SUMS} but missing")
    for rel in sorted(set(sums) & on_disk):
        p = directory / rel
        if p.is_symlink() or not p.is_file():
            problems.append(f"{rel}: not a regular file")
        elif sha256_file(p) != sums[rel]:
            problems.append(f"{rel}: sha256 differs from {SUMS}")
    manifest: dict[str, Any] = {}
    try:
        path = directory / MANIFEST
        text = schema.decode(schema.read_regular(path, MANIFEST, schema.STATE_LIMIT, directory), path)
        manifest = schema.check(schema.parse_json(text, str(path)), "release", str(path))
    except ForktoolError as e:
        problems.append(f"{MANIFEST}: {e.what}" + (f" ({e.where})" if e.where and e.where != str(path) else ""))
    if manifest:
        problems += _check_manifest(directory, manifest, sums)
    if problems:
        raise VerifyError(f"release {directory.name} failed verification: {len(problems)} problem(s)",
                          where=str(directory), details=problems,
                          hint="do not ship it; rebuild the release with `forktool package`")
    return {"ok": True, "directory": str(directory), "name": manifest.get("name"), "files": len(sums),
            "series_digest": manifest.get("series_digest"), "stamp": manifest.get("stamp"),
            "source_tree_digest": manifest["source_archive"]["tree_digest"]}


def _check_manifest(directory: Path, manifest: dict[str, Any], sums: dict[str, str]) -> list[str]:
    from forktool.build import stamp

    problems = []
    if manifest.get("format") != FORMAT:
        problems.append(f"{MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT}")
    listed = manifest.get("files") or {}
    expected = {k: v for k, v in sums.items() if k != MANIFEST}
    if listed != expected:
        diff = sorted(set(listed.items()) ^ set(expected.items()))
        problems.append(f"{MANIFEST}: its file list disagrees with {SUMS} on {', '.join(sorted({k for k, _ in diff}))}")
    patches = manifest.get("patches") or []
    try:
        series = [(p["id"], p["name"], p["sha256"]) for p in patches]
    except (KeyError, TypeError):
        return problems + [f"{MANIFEST}: malformed patches list"]
    if series_digest((name, sha) for _pid, name, sha in series) != manifest.get("series_digest"):
        problems.append(f"{MANIFEST}: series_digest does not match its patch list")
    commit = (manifest.get("upstream") or {}).get("upstream_commit", "")
    if stamp(commit, series, False)[0] != manifest.get("stamp"):
        problems.append(f"{MANIFEST}: stamp does not match the upstream commit and patch list")
    src = manifest.get("source_archive") or {}
    arc = directory / str(src.get("file", ""))
    if not src.get("file") or not arc.is_file():
        problems.append(f"{MANIFEST}: source archive missing")
    elif sums.get(src["file"]) and sha256_file(arc) == sums[src["file"]]:
        try:
            if archive_tree_digest(arc, str(src.get("prefix"))) != src.get("tree_digest"):
                problems.append(f"{src['file']}: its tree digest differs from the manifest")
        except (tarfile.TarError, OSError, EOFError, ForktoolError) as e:
            problems.append(f"{src['file']}: unreadable archive ({e})")
    return problems


# ---------------------------------------------------------------- from a forktool build


def compilers(bdir: Path) -> dict[str, str]:
    """Compiler id and version per language, as CMake detected them at configure time."""
    out = {}
    for p in sorted(bdir.glob("CMakeFiles/*/CMake*Compiler.cmake")):
        text = p.read_text(errors="replace")
        m = re.match(r"CMake(\w+)Compiler\.cmake$", p.name)
        if not m:
            continue
        lang = m.group(1)
        cid = re.search(rf'set\(CMAKE_{lang}_COMPILER_ID "([^"]*)"\)', text)
        ver = re.search(rf'set\(CMAKE_{lang}_COMPILER_VERSION "([^"]*)"\)', text)
        if cid and ver:
            out[lang.lower()] = f"{cid.group(1)} {ver.group(1)}"
    return out


def registry_notes(project: Project) -> tuple[str | None, dict[str, dict[str, str]]]:
    """(sha256 of registry/UPSTREAM_SYNC.yaml or None, patch id -> {status, summary}) for the release notes."""
    from forktool import registry
    path = project.registry_dir / "UPSTREAM_SYNC.yaml"
    if not os.path.lexists(path):
        return None, {}
    reg = registry.load(path)
    out = {p.id: {"status": p.status, "summary": " ".join(p.description.split())} for p in reg.patches}
    return sha256_file(path), out


def spec_from_build(project: Project, cfg: BuildConfig, profile: Profile, applied: list[Any],
                    pristine_digest: str) -> ReleaseSpec:
    """The release of the last `forktool build` of this profile; refuses when it is not of the applied series."""
    from forktool.build import RECORD, build_dir, patch_impact, read_record, release_files, stamp

    bdir = build_dir(project, profile.name)
    rec = read_record(bdir)
    if not rec:
        raise ForktoolError(f"no forktool build of profile {profile.name}", where=str(bdir),
                            hint=f"run `forktool build --profile {profile.name}` first")
    now = [(p.id, p.sha256) for p in applied]
    if [(a["id"], a["sha256"]) for a in rec.get("applied", [])] != now or rec.get("dirty"):
        raise ForktoolError("the last build is not of the applied series", where=str(bdir),
                            hint=f"run `forktool build --profile {profile.name}` again")
    comp = project.vendor.components[0]
    st, number = stamp(comp.upstream_commit, [(p.id, p.name, p.sha256) for p in applied], False)
    # the same patches on another upstream (a sync whose patches kept their bytes) are another build
    if rec.get("stamp") != st or rec.get("pristine") != pristine_digest:
        built = rec.get("pristine") or "an upstream it did not record (made by an older forktool)"
        raise ForktoolError("the last build is not of the upstream the tree is made from", where=str(bdir),
                            details=[f"built: stamp {rec.get('stamp')}, pristine {str(built)[:64]}",
                                     f"tree: stamp {st}, pristine {pristine_digest}"],
                            hint=f"run `forktool build --profile {profile.name}` again")
    outputs = [o for a in cfg.artifacts_in(profile) for o in a.outputs]
    moved = [o for o in outputs if not (bdir / o).is_file() or sha256_file(bdir / o) != rec["outputs"].get(o)]
    if moved:
        raise ForktoolError(f"{', '.join(moved)} changed since `forktool build` recorded it", where=str(bdir),
                            hint=f"run `forktool build --profile {profile.name}` again")
    # what ships is more than the outputs (every shared library in bin/, a tool's -impl library among them): each
    # file, by its bytes, must be one the build recorded, and nothing it recorded may be gone
    files = release_files(bdir, outputs)
    recorded = rec.get("shipped")
    if recorded is None:
        raise ForktoolError(f"the last build of profile {profile.name} did not record the files a release ships "
                            "(made by an older forktool)", where=str(bdir / RECORD),
                            hint=f"run `forktool build --profile {profile.name}` again")
    sums: dict[str, str | None] = {rel: sha256_file(f) if f.is_file() else None for rel, f in files.items()}
    differ = sorted(rel for rel in set(sums) | set(recorded) if sums.get(rel) != recorded.get(rel))
    if differ:
        raise ForktoolError(f"{', '.join(differ)}: not what `forktool build` recorded (added, removed or changed "
                            "since the build)", where=str(bdir),
                            hint=f"run `forktool build --profile {profile.name}` again")
    reg_digest, reg = registry_notes(project)
    patches = []
    for p in applied:
        declared = p.trailers().get("Build-Impact", "")
        label = declared or patch_impact(cfg, p.id, p.name, p.title, p.raw).label
        patches.append({"id": p.id, "name": p.name, "title": p.title, "sha256": p.sha256, "build_impact": label})
    manifest = {
        "profile": profile.name, "stamp": st, "build_number": number,
        "top": applied[-1].id if applied else None, "series_digest": series_digest_of(applied),
        "pristine_digest": pristine_digest, "patches": patches, "registry_digest": reg_digest,
        "upstream": {"component": comp.name, "package": comp.package, "version": comp.version,
                     "sdist_sha256": comp.sha256, "upstream_commit": comp.upstream_commit},
        "build": {"generator": profile.generator, "targets": list(profile.targets), "compilers": compilers(bdir),
                  "flags": [*rec.get("flags", []), f"-DLLAMA_BUILD_COMMIT={st}", f"-DLLAMA_BUILD_NUMBER={number}"]},
    }
    name = f"llama.cpp-{st}-{profile.name}"
    return ReleaseSpec(name, files, project.tree, manifest, {"registry": reg},
                       source_date_epoch())
