"""Build profiles, the rebuild each patch forces, and make runs that prove the rest kept its bytes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from forktool import output, proc, schema
from forktool.errors import ConfigError, ForktoolError, UsageError
from forktool.project import Project
from forktool.tree import atomic_write, sha256_bytes, sha256_file
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


def touched_paths(raw: bytes) -> list[str]:
    """The vendored paths a patch touches, read from its diff (new, changed and deleted files)."""
    try:
        ps = PatchSet(raw.decode("utf-8"))
    except (UnicodeDecodeError, UnidiffParseError) as e:
        raise ForktoolError(f"cannot read the diff: {e}", hint="run `forktool refresh ID` to rewrite it") from e
    return sorted({f.path for f in ps})


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
    files = touched_paths(raw)
    arts, unmatched = cfg.feeding(files)
    by_name = {a.name: a for a in cfg.artifacts}
    found = {i for n in arts for i in by_name[n].impact}
    return PatchImpact(pid, name, title, sha256_bytes(raw), files, arts, [i for i in IMPACTS if i in found],
                       unmatched, declared)


# ---------------------------------------------------------------- the stamp


def stamp(upstream_commit: str, applied: list[tuple[str, str, str]], dirty: bool) -> tuple[str, int]:
    """(LLAMA_BUILD_COMMIT, LLAMA_BUILD_NUMBER) for the applied (id, name, sha256) prefix of the series."""
    h = hashlib.sha256()
    for _pid, name, sha in applied:
        h.update(f"{name} {sha}\n".encode())  # the same recipe as workspace.series_digest
    base = upstream_commit[:8] or "unknown"
    commit = f"{base}+{applied[-1][0]}.{h.hexdigest()[:8]}" if applied else f"{base}+pristine"
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
    try:
        return json.loads((bdir / RECORD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def launcher() -> str | None:
    """ccache or sccache when installed; FORKTOOL_LAUNCHER names one (or 'none' to turn it off)."""
    want = os.environ.get("FORKTOOL_LAUNCHER", "").strip()
    if want == "none":
        return None
    if want:
        found = shutil.which(want)
        if not found:
            raise UsageError(f"FORKTOOL_LAUNCHER={want} is not installed",
                             hint="install it or set FORKTOOL_LAUNCHER=none")
        return found
    return shutil.which("ccache") or shutil.which("sccache")


def configure_flags(profile: Profile) -> list[str]:
    """The profile's CMake flags as this machine resolves them (launcher, CUDA architectures); no stamp."""
    flags = list(profile.flags)
    if profile.cuda_architectures:
        archs = os.environ.get("FORKTOOL_CUDA_ARCHITECTURES", profile.cuda_architectures)
        flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={archs}")
    lch = launcher()
    if lch:
        langs = ("C", "CXX", "CUDA") if profile.has_cuda else ("C", "CXX")
        flags += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={lch}" for lang in langs]
    return flags


def cmake_inputs_digest(src: Path) -> str:
    """Digest of every CMakeLists.txt and *.cmake file: a change there means configuring again."""
    h = hashlib.sha256()
    found = []
    for d, dirs, files in os.walk(src):
        dirs.sort()
        for f in files:
            if f == "CMakeLists.txt" or f.endswith(".cmake"):
                found.append(Path(d, f))
    for p in sorted(found):
        h.update(f"{p.relative_to(src).as_posix()} {sha256_file(p)}\n".encode())
    return h.hexdigest()


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


def make_plan(project: Project, cfg: BuildConfig, profile: Profile, patches: list[Any], dirty: list[str]) -> Plan:
    """What a build of the applied patches (workspace Patch objects, in order) and local edits will do."""
    impacts = [patch_impact(cfg, p.id, p.name, p.title, p.raw, p.trailers().get("Build-Impact", ""))
               for p in patches]
    bdir = build_dir(project, profile.name)
    comp = project.vendor.components[0]
    stamp_, number = stamp(comp.upstream_commit, [(p.id, p.name, p.sha256) for p in impacts], bool(dirty))
    flags = configure_flags(profile)
    src = project.tree / "llama.cpp"
    reason = _configure_reason(bdir, _flags_key(profile, flags), cmake_inputs_digest(src), stamp_)
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
                    reason or "first build", flags, rec)
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
                list(dict.fromkeys(targets)), reason, flags, rec)


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

    def objects_by_target(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.objects:
            m = re.search(r"CMakeFiles/([^/]+)\.dir/", o)
            t = m.group(1) if m else "?"
            out[t] = out.get(t, 0) + 1
        return dict(sorted(out.items()))


def _env(project: Project) -> dict[str, str]:
    # the vendored tree sits inside the forktool repository: without a ceiling, llama.cpp's CMake would stamp
    # ggml and libllama with *forktool's* git commit and dirty flag, and restamp ggml on every forktool commit
    return {"GIT_CEILING_DIRECTORIES": str(project.tree)}


def _hash_outputs(bdir: Path, arts: list[ArtifactSpec]) -> dict[str, str]:
    return {o: sha256_file(bdir / o) for a in arts for o in a.outputs if (bdir / o).is_file()}


def run_build(project: Project, cfg: BuildConfig, plan: Plan, jobs: int) -> BuildResult:
    t0 = time.monotonic()
    bdir = plan.build_dir
    bdir.mkdir(parents=True, exist_ok=True)
    src = project.tree / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        raise ForktoolError(f"no llama.cpp sources at {src}", where=str(src), hint="run `forktool apply` first")
    env = _env(project)
    in_profile = cfg.artifacts_in(plan.profile)
    before = _hash_outputs(bdir, in_profile)
    if plan.configure_reason:
        argv: list[str | os.PathLike[str]] = ["cmake", "-S", src, "-B", bdir, "-G", plan.profile.generator, *plan.flags,
                f"-DLLAMA_BUILD_COMMIT={plan.stamp}", f"-DLLAMA_BUILD_NUMBER={plan.build_number}"]
        if plan.configure_reason == "profile flags changed":
            # a flag dropped from the profile would otherwise live on in CMakeCache.txt
            argv.insert(1, "--fresh")
        with output.step(f"cmake ({plan.configure_reason})"):
            proc.run(argv, cwd=bdir, env=env)
        atomic_write(bdir / CONFIGURE_RECORD, json.dumps({
            "flags_key": _flags_key(plan.profile, plan.flags), "inputs_key": cmake_inputs_digest(src),
            "stamp": plan.stamp, "flags": plan.flags}, indent=1, sort_keys=True).encode())
    objects: list[str] = []
    linked: list[str] = []

    def on_line(line: str) -> None:
        m = _OBJECT_RE.search(line)
        if m:
            objects.append(m.group(1))
            output.info(line.strip())
            return
        m = _LINK_RE.search(line)
        if m:
            linked.append(m.group(1))
            output.info(line.strip())

    t1 = time.monotonic()
    proc.stream(["make", f"-j{jobs}", *plan.targets], cwd=bdir, env=env, on_line=on_line)
    make_seconds = time.monotonic() - t1
    after = _hash_outputs(bdir, in_profile)
    missing = [o for a in in_profile for o in a.outputs if o not in after]
    if missing:
        raise ConfigError(f"make finished but {', '.join(missing)} is missing", where=str(bdir),
                          hint="check the artifacts' outputs and the profile's targets in registry/build.yaml")
    changed = sorted(o for o in after if before.get(o) != after[o])
    kept_arts = [a for a in in_profile if a.name in plan.keep]
    unexpected = sorted(o for a in kept_arts for o in a.outputs if o in before and before[o] != after[o])
    result = BuildResult(objects, linked, plan.configure_reason, time.monotonic() - t0, make_seconds, changed,
                         [a.name for a in kept_arts], unexpected, after)
    record = {"profile": plan.profile.name, "stamp": plan.stamp, "dirty": plan.dirty,
              "applied": [{"id": p.id, "name": p.name, "sha256": p.sha256, "files": p.files} for p in plan.patches],
              "outputs": after, "flags": plan.flags, "targets": list(plan.profile.targets)}
    atomic_write(bdir / RECORD, json.dumps(record, indent=1, sort_keys=True).encode())
    return result

