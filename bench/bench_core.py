"""Core benchmarks on the real pinned upstream and the shipped series, each beside its git anchor, in one run.

Rows (whole processes, medians; forktool and its anchor run alternately, so both see the same machine load):
  verify warm (series applied)                  vs `git status` on a git copy of the same tree
  apply when nothing changed                    vs `git status`
  unapply && apply (whole series)               vs `git reset --hard base && git am` of the same patches
  edit a .cpp hunk of 0089 -> refresh -> verify -> build (cpu): forktool's share = total - make
  --help, --version, status                     vs a bare `python -c pass`
With --baseline DIR, another version's commands run alternately on their own copy (a "before" column).
forktool runs as users run it: the console script of a plain `pip install .` in a fresh venv (--install
editable runs `python -m forktool` of this interpreter instead, with the editable install's path finder).
Python's bytecode cache is ON here: PYTHONDONTWRITEBYTECODE is removed from the environment of every command
(this development environment sets it; users' installs keep their .pyc files), so start-up is what users see.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = "opencoti-hook: two-pass-compute-reserve"
EDIT_FILE = "llama.cpp/src/llama-kv-cache.cpp"


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(argv)}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r


CPU: list[float] = []  # CPU seconds (user + sys) of the child processes of the last timed() call


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of fn; its children's CPU seconds are appended to CPU (steadier on a loaded machine)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
    return wall


def install(src: Path, venv: Path, env: dict[str, str]) -> tuple[str, list[str]]:
    """A plain (non-editable) `pip install` of the forktool at src into a fresh venv; returns (its python, its
    `forktool` console script). The venv finds forktool's dependencies through one .pth line naming this
    interpreter's site-packages (an entry on sys.path, as a user's venv has its own), so nothing is downloaded
    but the build backend pip's isolated build asks for."""
    import site
    import sysconfig

    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], REPO, env)
    py = str(venv / "bin" / "python")
    run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", str(src)], REPO, env)
    purelib = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], REPO, env)
                   .stdout.strip())
    deps = [p for p in (sysconfig.get_paths()["purelib"], *site.getsitepackages()) if Path(p).is_dir()]
    (purelib / "zz-forktool-deps.pth").write_text(deps[0] + "\n")
    return py, [str(venv / "bin" / "forktool")]


def med(ts: list[float]) -> float:
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7, help="runs per row (medians reported)")
    ap.add_argument("--build-repeat", type=int, default=3, help="runs of the edit -> build loop (0: skip that row)")
    ap.add_argument("--jobs", type=int, default=2, help="make -jN for the build row")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of another forktool version (e.g. `git worktree add DIR REV`): its commands run "
                         "on their own copy of the project, alternating with this version's, as a 'before' column")
    ap.add_argument("--work", type=Path, default=REPO / "build" / "bench-core",
                    help="scratch directory (under /work, ccache shares objects with other checkouts)")
    ap.add_argument("--install", choices=("wheel", "editable"), default="wheel",
                    help="wheel (default): run the `forktool` console script of a plain `pip install .` into a fresh "
                         "venv under --work, as users run it (the same for --baseline); editable: `python -m "
                         "forktool` of this interpreter, whose `pip install -e` path finder loads at every start")
    ap.add_argument("--rows", default="",
                    help="run only the rows whose name contains one of these comma-separated words "
                         "(e.g. `--rows unapply,version`); the edit -> build row runs when `build` is among them")
    args = ap.parse_args()
    wanted = [w.strip() for w in args.rows.split(",") if w.strip()]

    def chosen(name: str) -> bool:
        return not wanted or any(w in name for w in wanted)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["FORKTOOL_CACHE"] = os.environ.get("FORKTOOL_CACHE") or str(Path.home() / ".cache" / "forktool")
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    root = work / "proj"
    for d in ("vendor", "patches", "registry"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("llamafile", ".*"))
    env["FORKTOOL_ROOT"] = str(root)
    if args.install == "wheel":
        py, ft = install(REPO, work / "venv", env)
    else:
        py = sys.executable
        ft = [py, "-m", "forktool"]

    def forktool(*a: str) -> subprocess.CompletedProcess:
        return run([*ft, *a], root, env)

    forktool("vendor", "fetch")
    base_root = work / "proj-baseline"
    benv = dict(env, FORKTOOL_ROOT=str(base_root))
    bpy, bft = py, ft
    if args.baseline:
        for d in ("vendor", "patches", "registry"):
            shutil.copytree(REPO / d, base_root / d, ignore=shutil.ignore_patterns("llamafile", ".*"))
        if args.install == "wheel":
            bpy, bft = install(args.baseline.resolve(), work / "venv-baseline", env)
        else:
            benv["PYTHONPATH"] = str(args.baseline.resolve())

    def before(*a: str) -> subprocess.CompletedProcess:
        return run([*bft, *a], base_root, benv)

    if args.baseline:
        before("vendor", "fetch")
        before("apply")
        before("verify")
    patches = [root / "patches" / ln.strip() for ln in (root / "patches" / "series").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]

    # the anchor: a git repository of the same pristine tree, the same patches applied with git am
    gitdir = work / "git"
    shutil.copytree(root / "vendor" / "llamafile", gitdir, symlinks=True)
    genv = {k: v for k, v in env.items() if not k.startswith("GIT_")}
    genv.update(GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@b")

    def git(*a: str) -> subprocess.CompletedProcess:
        return run(["git", *a], gitdir, genv)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "pristine")
    base = git("rev-parse", "HEAD").stdout.strip()
    git("am", "-q", *map(str, patches))
    forktool("apply")
    forktool("verify")  # warm: stat index and caches filled

    rows: list[tuple[str, list[float], list[float], str, list[float], list[float], list[float], list[float]]] = []

    def side_by_side(name: str, ours: Callable[[], object], anchor_name: str, anchor: Callable[[], object],
                     baseline: Callable[[], object] | None = None) -> None:
        if not chosen(name):
            return
        a, b, ca, cb, z, cz = [], [], [], [], [], []
        for _ in range(args.repeat):
            a.append(timed(ours))
            ca.append(CPU[-1])
            if baseline is not None and args.baseline:
                z.append(timed(baseline))
                cz.append(CPU[-1])
            b.append(timed(anchor))
            cb.append(CPU[-1])
        rows.append((name, a, ca, anchor_name, b, cb, z, cz))

    git_status = ("git status (same tree)", lambda: git("status", "--porcelain"))
    side_by_side("forktool verify, warm, full series", lambda: forktool("verify"), *git_status, lambda: before("verify"))
    side_by_side("forktool verify --no-cache (from scratch)", lambda: forktool("verify", "--no-cache"), *git_status)
    side_by_side("forktool apply, nothing changed", lambda: forktool("apply"), *git_status, lambda: before("apply"))

    def git_reset_am() -> None:
        git("reset", "-q", "--hard", base)
        git("am", "-q", *map(str, patches))

    side_by_side("forktool unapply && forktool apply", lambda: (forktool("unapply"), forktool("apply")),
                 "git reset --hard base && git am", git_reset_am, lambda: (before("unapply"), before("apply")))
    bare = ("python -c pass", lambda: run([py, "-c", "pass"], root, env))
    side_by_side("forktool --version", lambda: forktool("--version"), *bare)
    side_by_side("forktool --help", lambda: forktool("--help"), *bare, lambda: before("--help"))
    side_by_side("forktool status", lambda: forktool("status"), *bare, lambda: before("status"))
    side_by_side("python -c 'import forktool.cli'", lambda: run([py, "-c", "import forktool.cli"], root, env), *bare,
                 lambda: run([bpy, "-c", "import forktool.cli"], base_root, benv))

    loop: list[dict[str, float]] = []
    if args.build_repeat and chosen("edit -> build"):
        forktool("build", "--profile", "cpu", "-j", str(args.jobs))  # the first build, not measured
        target = root / "vendor" / "llamafile" / EDIT_FILE
        original = target.read_text()
        at = original.index(MARK)
        line_end = original.index("\n", at) + 1
        for n in range(args.build_repeat):
            text = original[:line_end] + f"    // bench edit {n}\n" + original[line_end:] if n % 2 == 0 else original
            target.write_text(text)
            t0 = time.perf_counter()
            forktool("refresh", "0089")
            t1 = time.perf_counter()
            forktool("verify")
            t2 = time.perf_counter()
            out = json.loads(forktool("build", "--profile", "cpu", "-j", str(args.jobs), "--json").stdout)
            t3 = time.perf_counter()
            loop.append({"refresh": t1 - t0, "verify": t2 - t1, "build": t3 - t2, "make": float(out["make_seconds"]),
                         "objects": len(out["objects"]), "total": t3 - t0})

    print("PYTHONDONTWRITEBYTECODE unset for every command (bytecode cache on, as users have it).")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'forktool':42} {'wall s':>7} {'cpu s':>6}   {'anchor':32} {'wall s':>7} {'cpu s':>6} "
          f"{'ratio':>6} {'cpu r':>6}  runs" + (f"   {'baseline wall':>13} {'cpu s':>6}" if args.baseline else ""))
    for name, a, ca, anchor_name, b, cb, z, cz in rows:
        line = (f"{name:42} {med(a):7.3f} {med(ca):6.3f}   {anchor_name:32} {med(b):7.3f} {med(cb):6.3f} "
                f"{med(a) / med(b):6.2f} {med(ca) / max(med(cb), 1e-3):6.2f}  {len(a)}")
        if z:
            line += f"   {med(z):13.3f} {med(cz):6.3f}"
        print(line)
    if loop:
        m = {k: med([x[k] for x in loop]) for k in loop[0]}
        share = m["refresh"] + m["verify"] + (m["build"] - m["make"])
        print(f"\nedit 0089 -> refresh -> verify -> build (cpu), {len(loop)} runs, medians: total {m['total']:.2f} s; "
              f"refresh {m['refresh']:.2f}, verify {m['verify']:.2f}, build {m['build']:.2f} of which make "
              f"{m['make']:.2f} ({m['objects']:.0f} objects)")
        print(f"forktool's share (total - make): {share:.2f} s; refresh + verify {m['refresh'] + m['verify']:.2f} s, "
              f"the build command around make {m['build'] - m['make']:.2f} s")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
