"""How much llama-bench's figures move from one process to the next, under each way of running it: for every variant
(a CPU list for taskset and more llama-bench arguments), --procs separate processes, the variants interleaved, and for
prefill and decode each process's median, the spread of those medians relative to their median and the
within-process spread. Gate b judges the paired ratios of interleaved rounds, one process per build and round, so the
way with the smallest spread between processes gives it the narrowest interval.

    python3 -m gates.bench_noise --bin U [--procs 6] [--variants '0-7|' '4|-t 1' '0-7|-ub 2048 -b 2048']
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

from gates.common import GateError, check_own_libraries, ensure_model, need_tool
from gates.gpu import MODEL_ARGS, run


def spread(xs: list[float]) -> float:
    """(max - min) / median: gate b's noise figure for a list of process medians."""
    return (max(xs) - min(xs)) / statistics.median(xs)


def parse_variant(v: str) -> tuple[str, list[str]]:
    """'CPUS|ARGS' as (the taskset CPU list, '' = not pinned; llama-bench arguments)."""
    if "|" not in v:
        raise GateError(f"variant {v!r}: write it as CPUS|ARGS, e.g. '4|-t 1' or '|-ub 2048'")
    cpus, args = v.split("|", 1)
    return cpus.strip(), args.split()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.bench_noise", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="the build whose llama-bench runs")
    ap.add_argument("--procs", type=int, default=6, help="processes per variant")
    ap.add_argument("--pp", type=int, default=2048)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5, help="llama-bench -r")
    ap.add_argument("--variants", nargs="+", default=["0-7|", "4|-t 1", "0-7|-ub 2048 -b 2048", "4|-t 1 -ub 2048 -b 2048"],
                    help="CPUS|ARGS each: the taskset CPU list ('' = not pinned) and more llama-bench arguments")
    ap.add_argument("--model", type=Path, help="default: the gates' synthetic model in --work")
    ap.add_argument("--work", type=Path, default=Path("build/gpu-gates"))
    ap.add_argument("--out", type=Path, default=Path("build/gpu-gates/bench_noise.json"))
    a = ap.parse_args(argv)
    try:
        variants = {v: parse_variant(v) for v in a.variants}
        bench = need_tool(a.bin, "llama-bench")
        check_own_libraries({"bench": bench}, dict(os.environ))
    except GateError as e:
        print(f"gates.bench_noise: {e}", file=sys.stderr)
        return 2
    if any(cpus for cpus, _ in variants.values()) and not shutil.which("taskset"):
        print("gates.bench_noise: taskset not found (util-linux); a CPU list needs it", file=sys.stderr)
        return 2
    a.work.mkdir(parents=True, exist_ok=True)
    model = a.model or ensure_model(a.work / "synthetic-8l-2048.gguf", MODEL_ARGS)
    samples: dict[str, dict[str, list[list[float]]]] = {v: {"pp": [], "tg": []} for v in variants}
    for i in range(a.procs):
        for j, (v, (cpus, extra)) in enumerate(variants.items()):
            argv_ = [str(bench), "-m", str(model), "-ngl", "99", "-fa", "1", "-p", str(a.pp), "-n", str(a.tg),
                     "-r", str(a.reps), "-o", "json", *extra]
            if cpus:
                argv_ = ["taskset", "-c", cpus, *argv_]
            r = run(f"noise-{i}-variant{j}", argv_, a.work, timeout=600)
            if r["rc"] != 0:
                print(f"gates.bench_noise: {v!r}: llama-bench exit {r['rc']} (log under {a.work})", file=sys.stderr)
                return 1
            text = r["text"]
            for t in json.loads(text[text.index("["):text.rindex("]") + 1]):
                samples[v]["pp" if t["n_prompt"] > 0 else "tg"].append([float(x) for x in t["samples_ts"]])
    summary = {}
    for v, s in samples.items():
        summary[v] = {}
        for k in ("pp", "tg"):
            meds = [statistics.median(p) for p in s[k]]
            summary[v][k] = {"median_tps": round(statistics.median(meds), 1),
                             "process_medians": [round(x, 1) for x in meds],
                             "between_process_spread": round(spread(meds), 4),
                             "within_process_spread_median": round(statistics.median(spread(p) for p in s[k]), 4)}
        print(f"{v!r}: " + ", ".join(f"{k} {summary[v][k]['median_tps']} tok/s, spread between processes "
                                     f"{summary[v][k]['between_process_spread']:.3f}, within "
                                     f"{summary[v][k]['within_process_spread_median']:.3f}" for k in ("pp", "tg")),
              flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"procs": a.procs, "pp": a.pp, "tg": a.tg, "reps": a.reps, "summary": summary,
                                 "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
