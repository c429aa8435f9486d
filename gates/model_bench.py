"""Prefill and decode of a real model (Gemma 3 270M) on the GPU: resident beside forced windows, with llama-bench.

Each configuration is one llama-bench invocation with the same test (a prefill of --pp tokens and a decode of
--tg tokens, both after --depth tokens already in the cache), run in --rounds interleaved rounds of --reps
repetitions, so slow drifts of the GPU hit every configuration alike. The window comes from llama-bench's
--kv-residency-mode and --kv-window-cells (0070: one setting for every test of a run), and its -v log shows the
cache it got (position window or FULLY RESIDENT). Prints one JSON object; exits 1 when a run fails or a forced
window was not engaged (no host tail logged).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gates.common import DEBUG_ENV, carry_trials, device_cards, own_libraries_env, parse_windows


def bench_once(a: argparse.Namespace, name: str, flags: list[str], env_extra: dict, rnd: int) -> dict:
    argv = [str(a.bin / "llama-bench"), "-m", str(a.model), "-ngl", "99", "-fa", "1", "-p", str(a.pp),
            "-n", str(a.tg), "-d", str(a.depth), "-r", str(a.reps), "-o", "json", "-v", *flags]
    env = dict(os.environ)
    env.pop(DEBUG_ENV, None)  # llama-bench reads no window variable; the debug flags are libllama's
    env.update(env_extra)
    p = subprocess.run(argv, capture_output=True, text=True, env=own_libraries_env(argv, env), timeout=a.timeout)
    (a.work / f"{name}-r{rnd}.log").write_text(" ".join(argv) + "\n" + json.dumps(env_extra) + "\n\n" + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"{name}: llama-bench exited {p.returncode}; log {a.work / f'{name}-r{rnd}.log'}")
    tests = json.loads(p.stdout)
    out: dict = {"windows": parse_windows(p.stderr), "fully_resident": "FULLY RESIDENT" in p.stderr,
                 "carry_trials": carry_trials(p.stderr)}
    for t in tests:
        kind = "prefill" if t["n_prompt"] > 0 else "decode"
        out[kind] = t["samples_ts"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.model_bench", description=__doc__)
    ap.add_argument("--bin", type=Path, required=True, help="bin dir holding llama-bench (the patched CUDA build)")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--windows", default="4096,8192", help="forced windows in cells, each below the test's context")
    ap.add_argument("--pp", type=int, default=4096)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--depth", type=int, default=12288, help="tokens already in the cache before each test")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--work", type=Path, default=Path("build/model-bench"))
    ap.add_argument("--debug", default="",
                    help="comma-separated OPENCOTI_KV_DEBUG flags; each window also runs once more with each flag "
                         "(e.g. mma-tail: the MMA kernel over a host tail), in the same interleaved rounds")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    windows = [int(x) for x in a.windows.split(",") if x]
    debug = [f for f in a.debug.split(",") if f]
    configs: list[tuple[str, list[str], dict]] = [("resident", ["--kv-residency-mode", "head"], {})]
    for w in windows:
        win = ["--kv-residency-mode", "window", "--kv-window-cells", str(w)]
        configs.append((f"window {w}", win, {}))
        configs += [(f"window {w} {f}", win, {DEBUG_ENV: f}) for f in debug]
    t0 = time.monotonic()
    samples: dict = {n: {"prefill": [], "decode": [], "windows": [], "fully_resident": [], "carry_trials": []}
                     for n, _, _ in configs}
    for rnd in range(a.rounds):
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]  # each configuration leads in turn
        for name, flags, env in order:
            r = bench_once(a, name.replace(" ", "-"), flags, env, rnd)
            s = samples[name]
            s["prefill"] += r.get("prefill", [])
            s["decode"] += r.get("decode", [])
            s["windows"] += [w for w in r["windows"] if w not in s["windows"]]
            s["fully_resident"].append(r["fully_resident"])
            s["carry_trials"] += r["carry_trials"]
    res = samples["resident"]
    rows = []
    ok = True
    for name, _, _ in configs:
        s = samples[name]
        row = {"config": name, "prefill_median": statistics.median(s["prefill"]),
               "decode_median": statistics.median(s["decode"]), "prefill_samples": s["prefill"],
               "decode_samples": s["decode"], "position_windows": s["windows"],
               # the tail ring's carry trials (one a context that could carry): kept or dropped, and what it measured
               "carry_trials": s["carry_trials"]}
        row["prefill_ratio"] = round(row["prefill_median"] / statistics.median(res["prefill"]), 3)
        row["decode_ratio"] = round(row["decode_median"] / statistics.median(res["decode"]), 3)
        if name != "resident":
            row["tail_engaged"] = any(w["tail"] > 0 for w in s["windows"])
            ok = ok and row["tail_engaged"]
        else:
            row["tail_engaged"] = False
            ok = ok and not s["windows"]
        rows.append(row)
    result = {"ok": ok, "model": str(a.model), "test": {"pp": a.pp, "tg": a.tg, "depth": a.depth, "reps": a.reps,
              "rounds": a.rounds}, "rows": rows, "device": device_cards(), "seconds": round(time.monotonic() - t0, 1)}
    print(json.dumps(result, indent=2))
    for r in rows:
        wl = ",".join(f"{w['window']}/{w['kv_size']}+{w['tail']}" for w in r["position_windows"]) or "-"
        trials = r["carry_trials"]
        carry = f", carry kept in {sum(t['kept'] for t in trials)} of {len(trials)} trial(s)" if trials else ""
        print(f"{r['config']:>22}: prefill {r['prefill_median']:10.1f} tok/s ({r['prefill_ratio']:.3f}), decode "
              f"{r['decode_median']:8.1f} tok/s ({r['decode_ratio']:.3f}), windows {wl}{carry}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
