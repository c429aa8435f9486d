"""The scoped compile check: per profile, only the translation units the series' files feed, and its record."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forktool import proc
from forktool.build import cmakeapi, diagnose
from forktool.errors import ConfigError, ForktoolError
from forktool.tree import atomic_write, read_file

if TYPE_CHECKING:
    from forktool.build import BuildConfig, BuildEvent, Plan
    from forktool.project import Project
    from forktool.workspace import Workspace

RECORD = "compile-checks.json"  # in .opencoti/: the last check of each profile
CHECK_LOG = "check.log"  # in the build directory
NOT_COMPILED = "not compiled"
NO_CHECK = "no compile check recorded"
_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
_MAKE_FAILED_RE = re.compile(r"\*\*\* \[[^\]]*?:\d+: (\S+)\] Error")
_BUILDING_RE = re.compile(r"Building (?:C|CXX|CUDA|ASM) object (\S+)")


@dataclass(frozen=True)
class Unit:
    """One translation unit of a configured build directory."""

    source: str  # absolute
    obj: str  # relative to the build directory
    makefile: str  # the target's build.make, relative to the build directory
    include_dirs: tuple[str, ...]  # absolute, in search order

    @property
    def target(self) -> str:
        return self.makefile.removesuffix(".dir/build.make").rpartition("/")[2]


@dataclass
class CheckResult:
    profile: str
    status: str  # "compiled", "failed" or "not compiled"
    reason: str = ""  # why not compiled
    units: list[str] = field(default_factory=list)  # sources checked, relative to the vendored tree
    compiled: list[str] = field(default_factory=list)  # objects make compiled now (the others were up to date)
    failed: list[str] = field(default_factory=list)  # sources that did not compile, relative to the vendored tree
    cause: diagnose.Cause | None = None
    hint: str = ""
    seconds: float = 0.0
    cache: str = ""  # the compiler cache's counters over the check ("" without a readable launcher)
    log: str = ""
    series_digest: str = ""
    tree_digest: str = ""
    config: str = ""  # rules_key of the profile it checked
    compilers: dict[str, dict[str, Any]] = field(default_factory=dict)  # what it compiled with (compilers())
    distrusted: int = 0  # objects compiled again because no earlier check had made them with these compilers

    @property
    def ok(self) -> bool:
        return self.status == "compiled"

    def describe(self) -> str:
        if self.status == NOT_COMPILED:
            return f"{self.profile}: not compiled ({self.reason})"
        n = len(self.units)
        if self.ok:
            return (f"{self.profile}: compiled {n} translation unit(s) the series feeds ({len(self.compiled)} "
                    f"recompiled, {n - len(self.compiled)} up to date by make's timestamps) in {self.seconds:.1f} s"
                    + (f"; {self.distrusted} object(s) compiled again that no earlier check had made with these "
                       "compilers" if self.distrusted else "")
                    + (f"; {self.cache}" if self.cache else ""))
        return (f"{self.profile}: {len(self.failed) or 'some'} of {n} translation unit(s) failed to compile: "
                f"{self.cause.text if self.cause else 'see ' + self.log}")

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "status": self.status, "reason": self.reason, "units": self.units,
                "compiled": self.compiled, "failed": self.failed,
                "cause": {"text": self.cause.text, "file": self.cause.file, "line": self.cause.line} if self.cause
                else None, "hint": self.hint, "seconds": round(self.seconds, 3), "cache": self.cache, "log": self.log,
                "series_digest": self.series_digest, "tree_digest": self.tree_digest, "compilers": self.compilers,
                "distrusted": self.distrusted}


def rules_key(cfg: BuildConfig, profile: Any) -> str:
    """What a profile's compile depends on in registry/build.yaml: its generator, flags, targets and CUDA
    architectures, and the targets of the artifacts it builds. A check recorded under other rules says nothing of
    these."""
    from forktool.cache import key_of

    return key_of("compile-rules", profile.generator, list(profile.flags), list(profile.targets),
                  profile.cuda_architectures, [[a.name, list(a.targets)] for a in cfg.artifacts_in(profile)])


# ---------------------------------------------------------------- the compilers a check compiled with

_CACHED_COMPILER_RE = re.compile(rb"^CMAKE_(C|CXX|CUDA)_COMPILER:[A-Z]+=(.+)$", re.M)
CHECKED = "forktool-checked.json"  # in the build directory: the objects checks saw made, and with which compilers


def _identity(path: str, ctime: bool = False) -> list[int] | None:
    """A cheap identity of a file (one stat, through symlinks): size, mtime_ns and inode, and with ctime the
    kernel's ctime_ns; None when it is gone. A compiler installed again at the same path (a package upgrade, an
    update-alternatives switch) changes it; an object's ctime, set on every write, truncate or utime and never by a
    user, changes even where its size and mtime were put back."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino] + ([st.st_ctime_ns] if ctime else [])


def _object_identity(path: str) -> list[int] | None:
    """An object's identity: _identity with its ctime, so one rewritten in place keeps no trust."""
    return _identity(path, ctime=True)


def compilers(bdir: Path) -> dict[str, dict[str, Any]]:
    """language -> {path, version, identity, parts}: the compilers bdir's CMakeCache.txt names (what make runs), the
    version CMake recorded when it detected each, the identity of the file at that path now, and the programs it runs
    that were found (_parts: name -> {path, identity}; {} where none was). Runs each C and C++ driver (a check or a
    build does this, never verify)."""
    try:
        cache = read_file(bdir / "CMakeCache.txt")
    except OSError:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for lang, raw in _CACHED_COMPILER_RE.findall(cache):
        path = os.fsdecode(raw).strip()
        if not path or path.endswith("-NOTFOUND"):
            continue
        if not os.path.isabs(path):  # a bare name (-DCMAKE_C_COMPILER=cc): the file PATH gives now
            import shutil  # not at the top: verify imports this module, and shutil brings bz2 and lzma (1.8 ms)

            path = shutil.which(path) or path
        name = lang.decode()
        found: dict[str, str] = {}
        # one directory per CMake version that configured here: the newest written is the configure in force (by
        # name, "3.9.0" would sort after "3.28.1")
        for f in sorted(bdir.glob(f"CMakeFiles/*/CMake{name}Compiler.cmake"), key=lambda f: f.stat().st_mtime_ns):
            found.update(re.findall(rf'set\(CMAKE_{name}_COMPILER_(VERSION|TOOLKIT_ROOT) "([^"]*)"\)',
                                    f.read_text(errors="replace")))
        out[name] = {"path": path, "version": found.get("VERSION", ""), "identity": _identity(path)}
        # nvcc named through a wrapper script (/usr/local/bin/nvcc exec'ing a toolkit's): the toolkit's own nvcc,
        # as CMake found it behind the wrapper, is what a new toolkit replaces, and its parts are the ones it runs
        # (not what lies beside the wrapper)
        inner = os.path.join(found.get("TOOLKIT_ROOT", ""), "bin", "nvcc")
        if name == "CUDA" and found.get("TOOLKIT_ROOT") and os.path.realpath(inner) != os.path.realpath(path):
            out[name]["parts"] = {}
            out["CUDA toolkit"] = {"path": inner, "version": out[name]["version"], "identity": _identity(inner),
                                   "parts": _parts(name, inner)}
        else:
            out[name]["parts"] = _parts(name, path)
    return out


# the programs a driver runs to compile a unit (a check links nothing): GCC's compiler proper and assembler, which
# a driver left unchanged still runs (a gcc-12 package update replaces cc1plus, not always /usr/bin/g++)
_GCC_PARTS = {"C": ("cc1", "as"), "CXX": ("cc1plus", "as")}
# nvcc's, beside it in the toolkit's bin/ (cicc in nvvm/bin/): the same file names in every CUDA toolkit
_NVCC_PARTS = ("cudafe++", "../nvvm/bin/cicc", "ptxas", "fatbinary", "nvlink")
PART_TIMEOUT = 10.0  # seconds for one `<driver> -print-prog-name=NAME`


def _parts(lang: str, driver: str) -> dict[str, dict[str, Any]]:
    """name -> {path, identity}: the compiler's own parts, each a file that exists now ({} when none is found). For
    nvcc: its toolkit's programs, beside the real nvcc (through symlinks), nothing run. For a C or C++ driver: what
    `<driver> -print-prog-name=NAME` answers, where that is a path (GCC's; clang answers a bare cc1plus: it compiles
    itself); a bare `as` is the one PATH gives. A driver that fails, hangs or cannot run gives fewer parts, never an
    error."""
    out: dict[str, dict[str, Any]] = {}
    if lang == "CUDA":
        bindir = os.path.dirname(os.path.realpath(driver))
        for rel in _NVCC_PARTS:
            path = os.path.normpath(os.path.join(bindir, rel))
            ident = _identity(path)
            if ident is not None and os.path.isfile(path):
                out[os.path.basename(path)] = {"path": path, "identity": ident}
        return out
    for name in _GCC_PARTS.get(lang, ()):
        try:
            r = proc.run([driver, f"-print-prog-name={name}"], check=False, input=b"", timeout=PART_TIMEOUT)
        except (ForktoolError, OSError):  # not found, not runnable, timed out
            continue
        answer = os.fsdecode(r.stdout).strip()
        if r.returncode != 0 or not answer or "\n" in answer:
            continue
        if not os.path.isabs(answer):
            if answer != name or name != "as":  # a bare cc1plus: the driver does not run one (clang)
                continue
            import shutil  # not at the top: see compilers()

            answer = shutil.which(answer) or ""
        ident = _identity(answer) if answer else None
        if ident is not None and os.path.isfile(answer):
            out[name] = {"path": answer, "identity": ident}
    return out


def compilers_changed(recorded: dict[str, Any]) -> str:
    """Why the compilers a check recorded are no longer the ones a build would run ("" when they are): one stat per
    compiler and per part of it recorded (cc1plus, ptxas, ...), and for CUDA the nvcc forktool would configure with
    now ($CUDACXX, else PATH); nothing is run."""
    if not recorded:
        return "the record does not name the compilers it compiled with (made by an earlier forktool)"
    for lang, c in sorted(recorded.items()):
        path = str(c.get("path", ""))
        now = _identity(path)
        what = "the CUDA toolkit's nvcc" if lang == "CUDA toolkit" else f"the {lang} compiler"
        if now is None:
            return f"{what} it compiled with is gone: {path}"
        if now != c.get("identity"):
            return f"{what} changed since the check: {path} is another file now"
        owner = "the CUDA toolkit" if lang == "CUDA toolkit" else f"the {lang} compiler"
        parts = c.get("parts")
        if not isinstance(parts, dict):
            return f"the record does not name {owner}'s parts (made by an earlier forktool)"
        for name, part in sorted(parts.items()):
            ppath = str(part.get("path", "")) if isinstance(part, dict) else ""
            pnow = _identity(ppath)
            if pnow is None:
                return f"{owner}'s {name} is gone: {ppath}"
            if pnow != part.get("identity"):
                return f"{owner}'s {name} changed since the check: {ppath} is another file now"
        if lang == "CUDA":
            from forktool.build import cuda

            nvcc = cuda.find_nvcc()
            if nvcc is not None and os.path.realpath(nvcc) != os.path.realpath(path):
                return f"the next build compiles CUDA with {nvcc} ($CUDACXX, else PATH), the check compiled with {path}"
    return ""


# ---------------------------------------------------------------- what the configured build compiles


def _include_dirs(args: list[str], cwd: str) -> tuple[str, ...]:
    out: list[str] = []
    it = iter(range(len(args)))
    for i in it:
        a = args[i]
        if a in ("-I", "-isystem", "-iquote", "-idirafter") and i + 1 < len(args):
            out.append(args[i + 1])
            next(it, None)
        elif a.startswith("-I") and len(a) > 2:
            out.append(a[2:])
        elif a.startswith("-isystem") and len(a) > 8:
            out.append(a[8:])
        elif a == "--options-file" and i + 1 < len(args):
            # nvcc reads its include flags from a response file CMake writes beside the target
            try:
                text = Path(cwd, args[i + 1]).read_text()
            except OSError:
                text = ""
            out += _include_dirs(shlex.split(text), cwd)
            next(it, None)
    return tuple(os.path.normpath(os.path.join(cwd, d)) for d in out)


def units(bdir: Path) -> list[Unit]:
    """The translation units of bdir's compile_commands.json (CMake writes it when it configures)."""
    path = bdir / "compile_commands.json"
    try:
        entries = json.loads(read_file(path))
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read {path.name}: {err}", where=str(path),
                          hint="configure again (`forktool build --check` runs CMake with compile commands on)") from err
    out = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict):
            continue
        cwd = str(e.get("directory") or bdir)
        args = e.get("arguments") or shlex.split(str(e.get("command") or ""))
        obj = e.get("output") or next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "-o"), None)
        if not isinstance(obj, str) or ".dir/" not in obj:
            continue
        rel = os.path.relpath(os.path.normpath(os.path.join(cwd, obj)), bdir)
        makefile = rel.split(".dir/", 1)[0] + ".dir/build.make"
        source = os.path.normpath(os.path.join(cwd, str(e.get("file"))))
        out.append(Unit(source, rel, makefile, _include_dirs(args, cwd)))
    return out


def feeding(all_units: list[Unit], touched: set[str], root: str) -> list[Unit]:
    """The units whose source is touched or includes a touched file, following #include lines through the files
    under root (every branch of #if taken: a unit is checked rather than missed)."""
    direct: dict[str, list[tuple[bool, str]]] = {}

    def includes(path: str) -> list[tuple[bool, str]]:
        if path not in direct:
            try:
                data = Path(path).read_bytes()
            except OSError:
                data = b""
            direct[path] = [(q == b'"', os.fsdecode(name).strip()) for q, name in _INCLUDE_RE.findall(data)]
        return direct[path]

    resolved: dict[tuple[str, str, bool, tuple[str, ...]], str | None] = {}

    def resolve(frm: str, name: str, quoted: bool, dirs: tuple[str, ...]) -> str | None:
        key = (os.path.dirname(frm) if quoted else "", name, quoted, dirs)
        if key not in resolved:
            resolved[key] = None
            for d in ((os.path.dirname(frm),) if quoted else ()) + dirs:
                cand = os.path.normpath(os.path.join(d, name))
                if cand.startswith(root) and os.path.isfile(cand):
                    resolved[key] = cand
                    break
        return resolved[key]

    fed = []
    for u in all_units:
        if u.source in touched:
            fed.append(u)
            continue
        seen = {u.source}
        todo = [u.source]
        hit = False
        while todo and not hit:
            cur = todo.pop()
            for quoted, name in includes(cur):
                found = resolve(cur, name, quoted, u.include_dirs)
                if found is not None and found not in seen:
                    if found in touched:
                        hit = True
                        break
                    seen.add(found)
                    todo.append(found)
        if hit:
            fed.append(u)
    return fed


# ---------------------------------------------------------------- the check


def compile_units(project: Project, cfg: BuildConfig, plan: Plan, paths: list[str], jobs: int,
                  progress: Callable[[BuildEvent], None] | None = None) -> CheckResult:
    """Configure when needed, then make exactly the objects of the units paths (relative to the vendored tree)
    feed, with the profile's compiler cache; make's output goes to the build directory's check.log."""
    from forktool.build import BuildEvent, cache_stats, configure, launcher, make_env
    from forktool.build.plan import RUNNING, forget_unfinished

    t0 = time.monotonic()
    report = progress or (lambda _e: None)
    bdir = plan.build_dir
    bdir.mkdir(parents=True, exist_ok=True)
    log_path = bdir / CHECK_LOG
    root = str(project.tree)
    env = make_env(project)
    res = CheckResult(plan.profile.name, "compiled", log=str(log_path), config=rules_key(cfg, plan.profile))
    with open(log_path, "w", encoding="utf-8", buffering=1) as log:
        model = cmakeapi.targets(bdir)
        if plan.configure_reason or model is None or not (bdir / "compile_commands.json").is_file():
            report(BuildEvent("configure", 0, None, "", f"cmake ({plan.configure_reason or 'the codemodel'})"))
            configure(project, plan, env, log)
            model = cmakeapi.targets(bdir)
        # only what this profile builds: its targets, its artifacts' targets, and everything they need
        wanted = [*plan.profile.targets, *(t for a in cfg.artifacts_in(plan.profile) for t in a.targets)]
        built = cmakeapi.closure(model, wanted) if model is not None else None
        touched = {os.path.normpath(os.path.join(root, p)) for p in paths}
        todo = [u for u in feeding(units(bdir), touched, root + "/") if built is None or u.target in built]
        res.units = sorted({os.path.relpath(u.source, root) for u in todo})
        if not todo:  # a check that compiles nothing proves nothing: never "compiled"
            res.status, res.reason = NOT_COMPILED, "the files checked feed none of its translation units"
            res.seconds = time.monotonic() - t0
            return res
        by_make: dict[str, list[Unit]] = {}
        for u in todo:
            by_make.setdefault(u.makefile, []).append(u)
        tool = launcher()
        stats0 = cache_stats(tool, where=False) if tool else None
        # a check cut short leaves RUNNING (as a build does): the objects it wrote are compiled again
        forget_unfinished(bdir)
        res.compilers = compilers(bdir)
        seen = _seen_objects(bdir, res.compilers)
        res.distrusted = _distrust(bdir, [u.obj for u in todo], seen)
        atomic_write(bdir / RUNNING, f"{plan.stamp}\n".encode(), durable=False)
        first = diagnose.FirstError()
        failed_objs: set[str] = set()
        killed = False  # a make a signal ended did not run to its end
        report(BuildEvent("start", 0, len(todo), "", f"compile {len(todo)} unit(s)"))

        def on_line(line: str) -> None:
            log.write(line + "\n")
            first.feed(line)
            m = _BUILDING_RE.search(line)
            if m:
                res.compiled.append(m.group(1))
                report(BuildEvent("object", len(res.compiled), len(todo), "", line.strip()))
            m = _MAKE_FAILED_RE.search(line)
            if m:
                failed_objs.add(m.group(1))

        # files the fed units may include that custom targets write into the build tree (the web UI's ui.h):
        # their commands run first, as make's target order would run them, after the programs they run
        # (0.3.35's llama-ui-embed, an executable the UI target depends on) are built
        if model is not None:
            order = cmakeapi.in_order(model, sorted({u.target for u in todo}))
            tools = cmakeapi.closure(model, [d for n in order if model[n].type == "UTILITY" for d in model[n].depends])
            for name in order:
                steps = (["build"] if model[name].type == "UTILITY" else
                         ["depend", "build"] if name in tools else [])
                for step in steps:
                    mk = model[name].makefile
                    gen = ["make", "-f", mk, mk.removesuffix("build.make") + step]
                    log.write(f"$ {' '.join(gen)}\n")
                    code = proc.stream(gen, cwd=bdir, env=env, on_line=on_line, check=False).returncode
                    if code != 0:
                        res.status = "failed"
                        killed = killed or code < 0
        for makefile, group in sorted(by_make.items()):
            # as CMake's own target rule does: first merge the compilers' depfiles into the target's
            # compiler_depend.make, else make would not see that a header changed under an object
            depend = ["make", "-f", makefile, makefile.removesuffix("build.make") + "depend"]
            log.write(f"$ {' '.join(depend)}\n")
            code = proc.stream(depend, cwd=bdir, env=env, on_line=on_line, check=False).returncode
            if code != 0:
                res.status = "failed"
                killed = killed or code < 0
            argv = ["make", "-k", f"-j{jobs}", "-f", makefile, *sorted(u.obj for u in group)]
            log.write(f"$ {' '.join(argv)}\n")
            # -k: every unit that fails is named, not only the first
            made = proc.stream(argv, cwd=bdir, env=env, on_line=on_line, check=False)
            if made.returncode != 0:
                res.status = "failed"
                killed = killed or made.returncode < 0
    if not killed:  # make ran to its end: its objects are what it says
        _note_made(bdir, res.compilers, seen, [u.obj for u in todo if u.obj not in failed_objs],
                   [u.obj for u in todo if u.obj in failed_objs])
        (bdir / RUNNING).unlink(missing_ok=True)
    # else a signal ended a make (an OOM kill): compiles it started may still land objects, so the marker stays and
    # the next check compiles again what was written since this one began
    stats1 = cache_stats(tool) if tool and stats0 else None
    if stats0 and stats1:
        res.cache = stats1.since(stats0).describe()
    if res.status == "failed":
        by_obj = {u.obj: u for u in todo}
        res.failed = sorted({os.path.relpath(by_obj[o].source, root) for o in failed_objs if o in by_obj})
        res.cause = first.cause
        res.hint = diagnose.compile_hint(first.cause, root, [(p.id, p.files) for p in plan.patches])
    res.seconds = time.monotonic() - t0
    return res


def _compilers_key(comps: dict[str, dict[str, Any]]) -> list[Any]:
    """The compilers an object was made with, parts included: an object another cc1plus made is not trusted."""
    return sorted([lang, c["path"], c["identity"],
                   sorted([n, p["path"], p["identity"]] for n, p in c.get("parts", {}).items())]
                  for lang, c in comps.items())


def _seen_objects(bdir: Path, comps: dict[str, dict[str, Any]]) -> dict[str, list[int]]:
    """object -> its identity when an earlier check saw make leave it, with these same compilers ({} otherwise)."""
    try:
        raw = json.loads(read_file(bdir / CHECKED))
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict) or raw.get("compilers") != _compilers_key(comps) or not comps:
        return {}
    objs = raw.get("objects")
    return dict(objs) if isinstance(objs, dict) else {}


def _note_made(bdir: Path, comps: dict[str, dict[str, Any]], seen: dict[str, list[int]], made: list[str],
               failed: list[str]) -> None:
    """Write CHECKED: seen, plus the identity of each object of made as it is now, less the failed ones."""
    for obj in made:
        ident = _object_identity(str(bdir / obj))
        if ident is None:
            seen.pop(obj, None)
        else:
            seen[obj] = ident
    for obj in failed:
        seen.pop(obj, None)
    atomic_write(bdir / CHECKED, json.dumps({"compilers": _compilers_key(comps), "objects": seen},
                                            sort_keys=True).encode(), durable=False)


def note_build(bdir: Path, compiled: list[str]) -> None:
    """After a make that ran to its end: the objects it compiled (from its own lines) were made by the compilers
    the build directory names, so the next check need not compile them again."""
    comps = compilers(bdir)
    _note_made(bdir, comps, _seen_objects(bdir, comps), compiled, [])


def _distrust(bdir: Path, objs: list[str], seen: dict[str, list[int]]) -> int:
    """Remove the objects no earlier check saw make leave with these compilers (made by another compiler, planted,
    touched or rewritten since: one stat each), so that make compiles them now and does not take them for up to date
    by their times. Returns how many it removed."""
    gone = 0
    for obj in objs:
        ident = _object_identity(str(bdir / obj))
        if ident is not None and seen.get(obj) != ident:
            (bdir / obj).unlink(missing_ok=True)
            seen.pop(obj, None)
            gone += 1
    return gone


def _unavailable(project: Project, profile: Any) -> str:
    """Why this machine cannot compile the profile ("" when it can)."""
    from forktool.build import cuda

    if not (project.tree / "llama.cpp" / "CMakeLists.txt").is_file():
        return "the vendored tree has no llama.cpp/CMakeLists.txt"
    if profile.has_cuda:
        try:
            cuda.find_toolkit()
        except ConfigError as e:
            return e.what
    return ""


def compile_series(project: Project, patches: list[Any], jobs: int | None = None,
                   progress: Callable[[str], None] = lambda _m: None,
                   paths: list[str] | None = None) -> list[CheckResult]:
    """The scoped check of every profile on the tree as it stands on disk, for the units the patches' files feed
    (workspace Patch objects, in order), or only those the given paths (relative to the vendored tree) feed; a
    profile this machine cannot compile is "not compiled"."""
    from forktool.build import load_config, make_plan

    cfg = load_config(project)
    out = []
    for name in sorted(cfg.profiles):
        prof = cfg.profiles[name]
        why = _unavailable(project, prof)
        if why:
            out.append(CheckResult(name, NOT_COMPILED, reason=why))
            continue
        progress(f"compiling what the series feeds ({name} profile)")
        plan = make_plan(project, cfg, prof, patches, [])
        fed = sorted({f for p in plan.patches for f in p.files}) if paths is None else paths
        out.append(compile_units(project, cfg, plan, fed, jobs or os.cpu_count() or 1))
    return out


def check_compile(ws: Workspace, profile: str, paths: list[str] | None = None, jobs: int | None = None,
                  progress: Callable[[BuildEvent], None] | None = None) -> CheckResult:
    """The scoped check of one profile on the workspace's tree: the units the applied series' files (or the
    given paths, relative to the vendored tree) feed. A profile needing a toolkit this machine lacks is
    "not compiled", never passed. A check of the whole applied series is recorded in .opencoti/."""
    from forktool.build import cuda, load_config, make_plan
    from forktool.tree import digest
    from forktool.workspace import series_digest

    project = ws.project
    cfg = load_config(project)
    prof = cfg.profile(profile)
    applied = ws.patches[:len(ws.state.applied)]
    tree_digest = digest(ws.current())
    sd = series_digest(ws.patches)
    if not project.tree.is_dir():
        raise ForktoolError(f"no vendored tree at {project.tree}", where=str(project.tree),
                            hint="run `forktool apply` first")
    why = _unavailable(project, prof)
    if why:
        hint = ""
        if prof.has_cuda:
            try:
                cuda.find_toolkit()
            except ConfigError as e:
                hint = e.hint
        return CheckResult(profile, NOT_COMPILED, reason=why, hint=hint, series_digest=sd, tree_digest=tree_digest)
    dirty = sorted({p for _, p in ws.local_changes()})
    plan = make_plan(project, cfg, prof, applied, dirty, ws.current())
    whole = paths is None
    if paths is None:
        paths = sorted({f for p in plan.patches for f in p.files} | set(dirty))
    res = compile_units(project, cfg, plan, paths, jobs or os.cpu_count() or 1, progress)
    res.series_digest, res.tree_digest = sd, tree_digest
    if whole:
        record(project, res, len(applied))
    return res


# ---------------------------------------------------------------- the record


def read_records(project: Project) -> dict[str, dict[str, Any]]:
    """profile -> its last whole-series check ({} when none was run, or the file is unreadable)."""
    try:
        raw = json.loads(read_file(project.state_dir / RECORD))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in raw.items() if isinstance(v, dict)} if isinstance(raw, dict) else {}


def record(project: Project, res: CheckResult, applied: int) -> None:
    recs = read_records(project)
    recs[res.profile] = {"status": res.status, "series_digest": res.series_digest, "tree_digest": res.tree_digest,
                         "rules": res.config, "compilers": res.compilers,
                         "applied": applied, "units": len(res.units), "compiled": len(res.compiled),
                         "failed": res.failed, "cause": res.cause.text if res.cause else "",
                         "seconds": round(res.seconds, 3), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    project.state_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(project.state_dir / RECORD, json.dumps(recs, indent=1, sort_keys=True).encode())


def status_for(project: Project, profiles: dict[str, str], series_digest: str, tree_digest: str) -> dict[str, str]:
    """profile -> "compiled", "failed" or "not compiled", for this series digest, tree digest, the profile's build
    rules (profiles: name -> its rules_key) and the compilers the check compiled with only."""
    return {name: st for name, (st, _why) in judge(project, profiles, series_digest, tree_digest).items()}


def judge(project: Project, profiles: dict[str, str], series_digest: str,
          tree_digest: str) -> dict[str, tuple[str, str]]:
    """profile -> (status, why it is "not compiled"; "" otherwise), as status_for answers."""
    recs = read_records(project)
    out = {}
    for name, rules in profiles.items():
        r = recs.get(name)
        if r is None:
            out[name] = (NOT_COMPILED, NO_CHECK)
        elif r.get("status") not in ("compiled", "failed"):
            out[name] = (NOT_COMPILED, "the recorded check compiled nothing")
        elif r.get("series_digest") != series_digest or r.get("tree_digest") != tree_digest:
            out[name] = (NOT_COMPILED, "the recorded check is of another series or tree")
        elif "rules" not in r:
            out[name] = (NOT_COMPILED, "the record names neither the build rules nor the compilers it compiled with "
                                       "(made by an earlier forktool)")
        elif r.get("rules") != rules:
            out[name] = (NOT_COMPILED, "the recorded check is of other build rules (registry/build.yaml)")
        else:
            changed = compilers_changed(r.get("compilers") or {})
            out[name] = (NOT_COMPILED, changed) if changed else (str(r["status"]), "")
    return out


def profile_judgements(project: Project, series_digest: str, tree_digest: str) -> dict[str, tuple[str, str]]:
    """Every profile of registry/build.yaml -> (its compile status for this series and tree, why not compiled)."""
    from forktool.impact import build_config

    try:
        cfg = build_config(project)
    except ForktoolError:
        return {}  # a project without build profiles (verify reports a broken build.yaml elsewhere)
    return judge(project, {n: rules_key(cfg, cfg.profiles[n]) for n in sorted(cfg.profiles)}, series_digest,
                 tree_digest)
