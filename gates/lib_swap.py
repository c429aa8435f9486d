"""Which of a build's libraries makes its llama-bench figures differ from another build's: build A, build B and, for
every named group of files, A's programs with B's group and B's programs with A's group, in interleaved rounds.

Gate b compares whole builds. Where two builds of one compiler differ (the series prefilled 7-9 % faster than upstream
on the H200, in window and head mode alike), this says which part carries the difference: if A's programs run at B's
speed with B's group, and B's at A's with A's, the group carries it; if each mix runs at its programs' own speed, it
does not. Each mix is a copy of one build's bin directory with the group's files replaced by the other build's
(symlinks kept), so CMake's RUNPATH ($ORIGIN) and ggml's backend search (the executable's directory) find the mix's
own files. Every mix is checked before its figures count: the swapped files have the donor's bytes, every linked
library that the directory holds is loaded from it, and every backend ggml loaded (its `load_backend: loaded ...`
line in each run's log) lies in it. A group none of whose files a mix loaded (the CUDA backend on a machine without
a GPU) is `not loaded`, and nothing is said about it.

Groups that cross the llama API (libllama) between builds whose include/llama.h differ run programs against a library
of another ABI: swap ggml's libraries (libggml-cuda.so, libggml-base.so*, libggml.so*, libggml-cpu.so), whose API the
series leaves as it is.

    python3 -m gates.lib_swap --a UPSTREAM/bin --b FULL/bin --b-args "--kv-residency-mode head" \\
        --group cuda=libggml-cuda.so --group ggml='libggml-base.so*,libggml.so*' [--rounds 9] [--out swap.json]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import statistics
import sys
from pathlib import Path

from gates.common import GateError, ensure_model, linked_libraries, log, need_tool, own_libraries_env, rotated, sha256
from gates.gpu import MODEL_ARGS, bench_argv, bench_samples, compare, run

# ggml's line for each backend it loaded: "load_backend: loaded CUDA backend from /path/libggml-cuda.so"
RE_BACKEND = re.compile(r"load_backend: loaded (\S+) backend from (\S+)")


def parse_group(spec: str) -> tuple[str, list[str]]:
    """'NAME=PATTERN[,PATTERN...]' as (NAME, patterns): file name globs within a bin directory."""
    name, sep, pats = spec.partition("=")
    patterns = [p.strip() for p in pats.split(",") if p.strip()]
    if not sep or not re.fullmatch(r"[A-Za-z0-9_-]+", name) or not patterns:
        raise GateError(f"group {spec!r}: write it as NAME=PATTERN[,PATTERN...], e.g. cuda=libggml-cuda.so or "
                        f"ggml='libggml-base.so*,libggml.so*' (NAME: letters, digits, - and _)")
    if any("/" in p for p in patterns):
        raise GateError(f"group {spec!r}: patterns name files within a bin directory, without '/'")
    return name, patterns


def matching(bin_dir: Path, patterns: list[str]) -> list[str]:
    """The names of bin_dir's files and symlinks that match any of patterns, sorted."""
    return sorted(p.name for p in bin_dir.iterdir()
                  if (p.is_file() or p.is_symlink()) and any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns))


def make_mix(base: Path, donor: Path, patterns: list[str], dest: Path) -> list[str]:
    """dest: a copy of base (symlinks kept) whose files matching patterns are the donor's instead (base's matches
    removed, the donor's copied, symlinks kept). Refused where either side has none. Returns the donor's names."""
    theirs, ours = matching(donor, patterns), matching(base, patterns)
    for side, names in (("donor", theirs), ("base", ours)):
        if not names:
            raise GateError(f"no file of {base if side == 'base' else donor} matches {', '.join(patterns)}: a group "
                            f"must name files both builds have (ls the bin directories)")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest, symlinks=True)
    for n in ours:
        (dest / n).unlink()
    for n in theirs:
        src = donor / n
        if src.is_symlink():
            os.symlink(os.readlink(src), dest / n)
        else:
            shutil.copy2(src, dest / n)
    for n in theirs:  # the bytes the mix will load are the donor's
        if (dest / n).exists() and sha256(dest / n) != sha256(donor / n):
            raise GateError(f"{dest / n}: its bytes differ from {donor / n} after the copy")
    return theirs


def loaded_check(bin_dir: Path, libs: dict[str, str], log_text: str, group: list[str]) -> dict:
    """What a build or mix in bin_dir loaded, from the loader's list (libs) and one run's log: `foreign`, the linked
    libraries and ggml backends that the directory holds a file of but that came from elsewhere (a mix that would
    measure another build); `group_loaded`, whether any file of the group was among them (always True without a
    group)."""
    own = bin_dir.resolve()
    loaded = {name: path for name, path in libs.items() if path != "not found"}
    loaded.update({f"{kind} backend": path for kind, path in RE_BACKEND.findall(log_text)})
    foreign = [f"{name} => {path}" for name, path in sorted(loaded.items())
               if (bin_dir / Path(path).name).exists() and Path(path).resolve().parent != own]
    foreign += [f"{name} => not found" for name, path in sorted(libs.items())
                if path == "not found" and (bin_dir / name).exists()]
    real = {Path(p).resolve() for p in loaded.values()}
    return {"foreign": foreign, "group_loaded": not group or any((bin_dir / n).resolve() in real for n in group)}


def group_verdict(to_a: dict[str, dict], to_b: dict[str, dict], a_vs_b: dict) -> str:
    """What a group's two mixes say: to_a / to_b hold compare()'s results for 'a+b.G' and 'b+a.G' against builds A
    and B. The group carries the difference where A's programs with it run as B does and B's with A's run as A does;
    it does not where each mix runs as its programs' build does. Each mix must also differ from the other build (a
    mix within the margin of both, where A and B lie less than two margins apart, tells nothing); anything else is
    not told."""
    if a_vs_b["verdict"] == "pass":
        return f"no difference to place: B runs as A within the margin ({a_vs_b['interval']})"
    if a_vs_b["verdict"] != "fail":
        return (f"not told: whether B differs from A is not checked ({a_vs_b.get('interval', 'no interval')}): "
                f"more rounds")
    ab, ba = "a+b", "b+a"
    def runs_as(mix: str, like: dict[str, dict], unlike: dict[str, dict]) -> bool:
        return like[mix]["verdict"] == "pass" and unlike[mix]["verdict"] == "fail"

    if runs_as(ab, to_b, to_a) and runs_as(ba, to_a, to_b):
        return "carries the difference: A's programs with B's group run as B, B's with A's run as A"
    if runs_as(ab, to_a, to_b) and runs_as(ba, to_b, to_a):
        return "does not carry it: each mix runs as the build its programs came from"
    return "not told: the mixes match neither pattern within the margin (more rounds, or the difference is shared)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.lib_swap", description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="build A's bin directory (the reference, e.g. upstream)")
    ap.add_argument("--b", type=Path, required=True, help="build B's bin directory")
    ap.add_argument("--a-args", default="", help="llama-bench arguments for A's programs only")
    ap.add_argument("--b-args", default="", help="llama-bench arguments for B's programs only (the series' "
                                                 "--kv-residency-mode head, which upstream's llama-bench lacks)")
    ap.add_argument("--group", action="append", default=[], metavar="NAME=PATTERN[,PATTERN]",
                    help="files swapped together (repeatable)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds, one process per build and mix each")
    ap.add_argument("--pp", type=int, default=2048)
    ap.add_argument("--tg", type=int, default=0, help="llama-bench -n (0: prefill only)")
    ap.add_argument("--reps", type=int, default=5, help="llama-bench -r")
    ap.add_argument("--args", default="-t 1 -ub 2048 -b 2048", help="llama-bench arguments for every run (gate b's)")
    ap.add_argument("--cpus", default="4", help="taskset CPU list ('' = not pinned)")
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--confidence", type=float, default=0.9)
    ap.add_argument("--model", type=Path, help="default: the gates' synthetic model in --work")
    ap.add_argument("--work", type=Path, default=Path("build/lib-swap"))
    ap.add_argument("--out", type=Path, help="write the results here as JSON")
    a = ap.parse_args(argv)
    try:
        if not a.group:
            raise GateError("name at least one --group (e.g. --group cuda=libggml-cuda.so)")
        if a.rounds < 5:
            raise GateError(f"--rounds {a.rounds}: at least 5 give an interval for the median ratio")
        groups = dict(parse_group(g) for g in a.group)
        if len(groups) != len(a.group):
            raise GateError("two --group options have one name")
        for side in (a.a, a.b):
            need_tool(side, "llama-bench")
        if a.cpus and not shutil.which("taskset"):
            raise GateError("taskset not found (util-linux); pass --cpus '' to run unpinned")
        a.work.mkdir(parents=True, exist_ok=True)
        builds: dict[str, tuple[Path, list[str], list[str]]] = {"a": (a.a, a.a_args.split(), []),
                                                                "b": (a.b, a.b_args.split(), [])}
        for g, pats in groups.items():
            for name, base, donor, flags in (("a+b", a.a, a.b, a.a_args), ("b+a", a.b, a.a, a.b_args)):
                dest = a.work / "mix" / f"{name}.{g}"
                builds[f"{name}.{g}"] = (dest, flags.split(), make_mix(base, donor, pats, dest))
        model = a.model or ensure_model(a.work / "synthetic-8l-2048.gguf", MODEL_ARGS)
    except (GateError, OSError) as e:
        print(f"gates.lib_swap: {e}", file=sys.stderr)
        return 2
    logs = a.work / "logs"
    logs.mkdir(exist_ok=True)
    names = list(builds)
    samples: dict[str, dict[str, list[list[float]]]] = {n: {"pp": [], "tg": []} for n in names}
    checks: dict[str, dict] = {}
    for i in range(a.rounds):
        for name in rotated(names, i):
            bin_dir, flags, group = builds[name]
            argv = bench_argv(bin_dir, model, a.pp, a.tg, a.reps, a.args.split() + flags, a.cpus)
            r = run(f"{name}-{i}", argv, logs, timeout=600)
            if r["rc"] != 0:
                print(f"gates.lib_swap: {name}, round {i}: llama-bench exit {r['rc']} ({logs / f'{name}-{i}.log'})",
                      file=sys.stderr)
                return 1
            if name not in checks:  # what it loaded, before its figures count
                program = bin_dir / "llama-bench"  # run as the gates run it: its own directory leads
                libs = linked_libraries(program, own_libraries_env([str(program)], dict(os.environ)))
                checks[name] = loaded_check(bin_dir, libs, r["text"], group)
                if checks[name]["foreign"]:
                    print(f"gates.lib_swap: {name} loads files of another directory: "
                          f"{'; '.join(checks[name]['foreign'])}: its figures would measure another build",
                          file=sys.stderr)
                    return 1
            for k, v in bench_samples(r["text"]).items():
                samples[name][k].append(v)
        log(f"gates.lib_swap: round {i + 1} of {a.rounds} done")
    halves = [k for k in ("pp", "tg") if samples["a"][k]]
    res: dict = {"a": str(a.a), "b": str(a.b), "a_args": a.a_args, "b_args": a.b_args, "args": a.args,
                 "cpus": a.cpus, "rounds": a.rounds, "reps": a.reps, "pp": a.pp, "tg": a.tg, "groups": groups,
                 "median_tps": {k: {n: round(statistics.median([x for rnd in samples[n][k] for x in rnd]), 1)
                                    for n in names} for k in halves},
                 "checks": checks, "samples": samples, "halves": {}}
    for k in halves:
        s = {n: samples[n][k] for n in names}
        a_vs_b = compare(s, "b", "a", a.margin, a.confidence)
        half: dict = {"b_vs_a": a_vs_b, "groups": {}}
        for g in groups:
            mixes = {m: f"{m}.{g}" for m in ("a+b", "b+a")}
            if not all(checks[n]["group_loaded"] for n in mixes.values()):
                half["groups"][g] = {"verdict": "not loaded: a mix loaded none of the group's files (a backend "
                                                "without its device?): nothing to say about it"}
                continue
            to_a = {m: compare(s, n, "a", a.margin, a.confidence) for m, n in mixes.items()}
            to_b = {m: compare(s, n, "b", a.margin, a.confidence) for m, n in mixes.items()}
            half["groups"][g] = {"verdict": group_verdict(to_a, to_b, a_vs_b), "against_a": to_a, "against_b": to_b}
        res["halves"][k] = half
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    for k in halves:
        h = res["halves"][k]
        print(f"{k}: B against A {h['b_vs_a'].get('interval', 'no interval')} ({h['b_vs_a']['verdict']}); medians "
              + ", ".join(f"{n} {v:,.0f}" for n, v in res["median_tps"][k].items()))
        for g, r in h["groups"].items():
            ranges = "; ".join(f"{m}.{g}: to A {r['against_a'][m].get('interval')}, to B {r['against_b'][m].get('interval')}"
                               for m in ("a+b", "b+a")) if "against_a" in r else ""
            print(f"  {g}: {r['verdict']}" + (f" ({ranges})" if ranges else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
