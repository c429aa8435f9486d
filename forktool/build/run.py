"""Configure and make a plan, stream make's output to make.log and a progress display, check what kept its bytes."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from forktool import proc, schema
from forktool.build import cmakeapi, cuda, diagnose
from forktool.build.cachestats import CacheStats, cache_stats
from forktool.build.check import note_build
from forktool.build.config import ArtifactSpec, BuildConfig
from forktool.build.plan import (
    CONFIGURE_RECORD,
    FRESH,
    RECORD,
    RUNNING,
    Plan,
    _flags_key,
    cmake_inputs_digest,
    forget_unfinished,
    launcher,
)
from forktool.build.progress import MakeProgress
from forktool.errors import ConfigError, ForktoolError
from forktool.index import hash_indexed
from forktool.project import Project
from forktool.tree import atomic_write, sha256_file

_LINK_RE = re.compile(r"Linking \S+ (?:shared library|shared module|executable|static library) (\S+)")
MAKE_LOG = "make.log"
_ERROR_RE = re.compile(r"\berror\b|\bError\b:|undefined reference|multiple definition")
_TARGET_RE = re.compile(r"CMakeFiles/([^/]+)\.dir/")


@dataclass(frozen=True)
class BuildEvent:
    """One step of a build, for a progress display."""

    kind: str  # configure, start (make begins), object, link, made (make finished one of its goals)
    done: int  # objects compiled so far
    total: int | None  # objects to compile, when known beforehand (the scoped check's units; make does not say)
    target: str  # the CMake target of the object or link ("" for configure/start)
    text: str  # make's line, or what is being done
    percent: int | None = None  # make's own position in the whole run (0-100), from its lines; None before make


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


def release_files(bdir: Path, outputs: list[str]) -> dict[str, Path]:
    """bin/NAME -> file: what `forktool package` ships of a build, the profile's outputs plus every shared library
    in bin/ (a tool's `-impl` library, mtmd, ...), each once, under its SONAME."""
    files: dict[str, Path] = {f"bin/{Path(o).name}": (bdir / o).resolve() for o in outputs if ".so" not in o}
    names: dict[Path, list[str]] = {}
    for p in sorted((bdir / "bin").glob("*.so*")):
        names.setdefault(p.resolve(), []).append(p.name)
    for real, aliases in sorted(names.items()):
        # libllama.so -> libllama.so.0 -> libllama.so.0.0.N: binaries load the middle one, which is the SONAME
        soname = sorted((a for a in aliases if re.search(r"\.so\.\d+$", a)), key=len)
        files[f"bin/{soname[0] if soname else real.name}"] = real
    return files


def _hash_outputs(bdir: Path, arts: list[ArtifactSpec]) -> tuple[dict[str, str], dict[str, str]]:
    """(output -> sha256, release path -> sha256 of every file a release of this build ships), from one stat index."""
    outputs = [o for a in arts for o in a.outputs]
    shipped = release_files(bdir, outputs)
    top = bdir.resolve()
    inside = {rel: p.relative_to(top).as_posix() for rel, p in shipped.items() if p.is_relative_to(top)}
    sums = hash_indexed(bdir, outputs + sorted(set(inside.values())), bdir / OUTPUTS_INDEX)[0]
    out = {o: sums[o] for o in outputs if o in sums}
    ships = {rel: sums[inside[rel]] if rel in inside else sha256_file(p) for rel, p in shipped.items()
             if (rel in inside and inside[rel] in sums) or (rel not in inside and p.is_file())}
    return out, ships


T = TypeVar("T")


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
    return ForktoolError(f"{step} {proc.ended(code)}" + (f": {err}" if err else ""),
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
    fresh = plan.configure_reason in FRESH
    if fresh:
        # a flag dropped from the profile, or the nvcc of an earlier $CUDACXX, would otherwise live on in
        # CMakeCache.txt
        argv.insert(1, "--fresh")
    nvcc = cuda.find_nvcc() if plan.profile.has_cuda else None
    if nvcc and (fresh or not (bdir / "CMakeCache.txt").is_file()):
        # the nvcc forktool found and named the toolkit of, which is what CMake takes from $CUDACXX on a first
        # configure; beyond that, make_plan configures afresh when it differs from the cache's
        argv.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
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
              progress: Callable[[BuildEvent], None] | None = None, pristine: str = "") -> BuildResult:
    """Configure when needed, make the plan's targets, check what kept its bytes; make's output goes to make.log.

    pristine: the digest of the upstream the tree was made from, recorded so that a release (`forktool package`)
    never ships a build of another upstream under the same patches."""
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
    # cmake runs on the other core while this thread sums the outputs and reads the cache's counters (it touches
    # neither)
    configuring: Future[tuple[proc.Result, float]] | None = None
    pool = ThreadPoolExecutor(max_workers=1)
    if plan.configure_reason:
        argv = cmake_argv(project, plan)
        report(BuildEvent("configure", 0, None, "", f"cmake ({plan.configure_reason})"))
        configuring = pool.submit(_timed, lambda: proc.run(argv, cwd=bdir, env=env, check=False))
    pool.shutdown(wait=False)
    try:
        forget_unfinished(bdir)  # objects a run cut short may have left newer than their sources
        before, _ = _hash_outputs(bdir, in_profile)
        stats0 = cache_stats(tool, where=False) if tool else None  # the location comes with the second reading
    except BaseException:
        if configuring is not None:
            wait([configuring])  # cmake does not go on writing the build directory after forktool stopped
        raise
    configure_seconds = 0.0
    with open(log_path, "w", encoding="utf-8", buffering=1) as log:  # line by line: `tail -f` follows it
        if configuring is not None:
            res, configure_seconds = configuring.result()
            text = (res.stdout + res.stderr).decode("utf-8", "replace")
            log.write(f"$ {' '.join(os.fspath(a) for a in res.argv)}\n{text}\n")
            _configured(plan, res, text, log_path, src)
        if any(cuda.STUB_DIR in f for f in plan.flags):
            cuda.make_driver_stub(bdir)  # the link needs it, also when CMake did not run this time
        at = MakeProgress(plan.targets)
        objects = at.objects
        linked: list[str] = []
        tail: list[str] = []
        report(BuildEvent("start", 0, None, "", f"make -j{jobs} {' '.join(plan.targets)}", 0))

        first = diagnose.FirstError()

        def on_line(line: str) -> None:
            log.write(line + "\n")
            first.feed(line)
            tail.append(line)
            del tail[:-200]
            goal = at.goal
            obj = at.feed(line)
            if at.goal != goal:
                report(BuildEvent("made", len(objects), None, goal, line.strip(), at.overall))
                return
            if obj is not None:
                t = _TARGET_RE.search(obj)
                report(BuildEvent("object", len(objects), None, t.group(1) if t else "", line.strip(), at.overall))
                return
            m = _LINK_RE.search(line)
            if m:
                linked.append(m.group(1))
                report(BuildEvent("link", len(objects), None, Path(m.group(1)).name, line.strip(), at.overall))

        t1 = time.monotonic()
        atomic_write(bdir / RUNNING, f"{plan.stamp}\n".encode(), durable=False)
        log.write(f"$ make -j{jobs} {' '.join(plan.targets)}\n")
        made = proc.stream(["make", f"-j{jobs}", *plan.targets], cwd=bdir, env=env, on_line=on_line, check=False)
        make_seconds = time.monotonic() - t1
        if made.returncode != 0:
            raise _failed("make", made.returncode, log_path, first.cause, tail, diagnose.compile_hint(
                first.cause, str(project.tree), [(p.id, p.files) for p in plan.patches]))
    note_build(bdir, objects)  # the next compile check need not compile again what this make compiled
    stats1 = cache_stats(tool) if tool and stats0 else None
    cache = stats1.since(stats0) if stats1 and stats0 else None
    after, shipped = _hash_outputs(bdir, in_profile)
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
    record = {"profile": plan.profile.name, "stamp": plan.stamp, "dirty": plan.dirty, "pristine": pristine,
              "applied": [{"id": p.id, "name": p.name, "sha256": p.sha256, "files": p.files} for p in plan.patches],
              "outputs": after, "shipped": shipped, "flags": plan.flags, "targets": list(plan.profile.targets),
              "objects": len(objects), "seconds": round(result.seconds, 3), "make_seconds": round(make_seconds, 3),
              "cache": cache.to_json() if cache else None}
    # checked as it is written, so the next build's read finds it known valid and need not load jsonschema
    schema.check(record, "build-record", str(bdir / RECORD))
    atomic_write(bdir / RECORD, json.dumps(record, indent=1, sort_keys=True).encode())
    (bdir / RUNNING).unlink(missing_ok=True)  # the record describes the outputs again
    return result
