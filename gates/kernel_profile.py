"""Where a decoded token's attention time goes: the flash-attention kernels of a decode, timed one by one by Nsight
Compute (ncu), fully resident against a small host tail (and any other forced window), beside the token times of the
same configurations run without the profiler.

ncu runs each kernel alone (no two kernels overlap, the copies are not timed), so the sum of a token's kernel times
says how much of the tail's cost is kernel work; what is left of the measured cost is waiting (the copy of the tail,
the events that order it, the gaps between launches). Run on a CUDA machine with the full build:

    python3 -m gates.kernel_profile --bin build/device-out/full --out build/gpu-gates/out/kernel_profile.json

With --no-ncu only the timed runs are made (no profiler needed): `--debug "" no-tail-combine` then compares the
window's decode with and without OPENCOTI_KV_DEBUG flags against fully resident, interleaved, in one call.

Each repetition runs every configuration once, and the repetitions rotate which configuration leads
(gates.common.rotated: a fixed order can crown a flag by its place). Beside the ratio of the medians, each
configuration gets its repetitions' own ratios against the resident run of the same repetition (`decode_ratio_runs`,
and their median) and the place it ran in each (`places`).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import statistics
import sys
from pathlib import Path

from gates import tail_models
from gates.common import DEBUG_ENV, WINDOW_ENV, device_cards, ensure_model, log, make_text, rotated
from gates.gpu import MODEL_ARGS, RE_CARRY_READ, completion, flags_not_run, flags_ran, run, small_tail_window

# the kernels of a flash-attention node: upstream's vector and MMA kernels and their combine, and fattn.cu's own
# (the segments' merge, the ring's patch)
KERNELS = "regex:flash_attn|opencoti"


def short_name(name: str) -> str:
    """The kernel's function name without its return type, template arguments and parameters."""
    return name.split("<", 1)[0].split("(", 1)[0].strip().split(" ")[-1]


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu --csv --print-units base rows of gpu__time_duration.sum: [{id, name, ns}] in launch order."""
    start = text.find('"ID"')
    if start < 0:
        return []
    out = []
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            ns = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        out.append({"id": int(row["ID"]), "name": short_name(row["Kernel Name"]), "ns": ns})
    out.sort(key=lambda r: r["id"])
    return out


def decode_kernels(rows: list[dict]) -> list[dict]:
    """The kernels from the first decode on: a decode attends one token with the vector kernel, a prompt's ubatches
    take the MMA kernel, so the first vector launch starts the decodes."""
    for i, r in enumerate(rows):
        if r["name"].startswith("flash_attn_ext_vec"):
            return rows[i:]
    return []


def per_token(rows: list[dict], tokens: int) -> dict:
    """Per kernel name: launches and microseconds per decoded token, and the median launch."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["name"], []).append(r["ns"])
    kernels = {n: {"launches_per_token": round(len(v) / tokens, 2), "us_per_token": round(sum(v) / tokens / 1e3, 2),
                   "median_us": round(statistics.median(v) / 1e3, 2)} for n, v in sorted(by.items())}
    return {"tokens": tokens, "kernels": kernels,
            "us_per_token": round(sum(r["ns"] for r in rows) / tokens / 1e3, 2)}


def over_resident(configs: dict) -> dict[str, str]:
    """Each window configuration against "resident", in place as its "over_resident": the timed cost a token
    (medians) and the decode ratio; where both were profiled, how much of the cost is kernel time and how much is
    waiting. Returns a line a configuration for the log."""
    base = configs["resident"]
    lines = {}
    for name, e in configs.items():
        if name == "resident" or e.get("timed_median_ms") is None or base.get("timed_median_ms") is None:
            continue
        cost = (e["timed_median_ms"] - base["timed_median_ms"]) * 1e3
        o = {"timed_us_per_token": round(cost, 1), "decode_ratio": round(base["timed_median_ms"] / e["timed_median_ms"], 3)}
        line = f"{cost:.1f} us a token (decode {o['decode_ratio']})"
        # paired: each repetition's run against the resident run of the same repetition (None: one of them failed)
        pairs = [b / t for b, t in zip(base.get("timed_by_rep", []), e.get("timed_by_rep", []), strict=False)
                 if b and t]
        if pairs:
            o |= {"decode_ratio_runs": [round(x, 3) for x in pairs],
                  "decode_ratio_paired_median": round(statistics.median(pairs), 3)}
            line += f", paired median {o['decode_ratio_paired_median']} of {len(pairs)}"
            # item 3's small-tail target (0.9 of fully resident) as the runs support it: met or missed only where
            # the runs around the median (tail_models.add_runs) all lie on one side, else not decided
            target = tail_models.TARGET
            t = tail_models.add_runs({"target": target, "met": statistics.median(pairs) >= target}, pairs)
            o["vs_small_tail_target"] = t["runs_verdict"]
            line += f"; against {target}: {t['runs_verdict']}"
        if e.get("us_per_token") is not None and base.get("us_per_token") is not None:
            kern = e["us_per_token"] - base["us_per_token"]
            o |= {"kernel_us_per_token": round(kern, 1), "waiting_us_per_token": round(cost - kern, 1)}
            line += f", of it {kern:.1f} us kernels, {cost - kern:.1f} us waiting"
        e["over_resident"] = o
        lines[name] = line
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.kernel_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="CUDA build of the whole series")
    ap.add_argument("--work", type=Path, default=Path("build/gpu-gates"))
    ap.add_argument("--out", type=Path, default=Path("build/gpu-gates/out/kernel_profile.json"))
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--words", type=int, default=30000, help="prompt words (gate d's prompt: 35,131 tokens)")
    ap.add_argument("--profile-n", type=int, default=9, help="tokens generated under ncu (n - 1 decodes)")
    ap.add_argument("--time-n", type=int, default=64, help="tokens generated in each timed run")
    ap.add_argument("--reps", type=int, default=3, help="timed runs of each configuration (interleaved)")
    ap.add_argument("--windows", type=int, nargs="*", default=None,
                    help="forced windows besides fully resident (default: the small tail's whole-granule window)")
    ap.add_argument("--debug", nargs="*", default=[""], help=f"{DEBUG_ENV} values to run each window with")
    ap.add_argument("--no-ncu", action="store_true", help="only the timed runs (no kernel profile, no ncu needed)")
    a = ap.parse_args(argv)
    if not a.no_ncu and not Path(a.ncu).is_file():
        sys.exit(f"gates.kernel_profile: ncu not found at {a.ncu} (--ncu)")
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    model = ensure_model(a.work / "synthetic-8l-2048.gguf", MODEL_ARGS)
    prompt = a.work / "prompt-kprof.txt"
    prompt.write_text(make_text(a.words, 5))  # gate d's prompt

    # the prompt's length in tokens, from a fully resident run
    r0 = run("kprof-resident-0", completion(a.bin, model, a.ctx, prompt, a.time_n, ["--kv-residency-mode", "window"]),
             a.work)
    n_prompt = r0.get("prompt_tokens") or 0
    if r0["rc"] != 0 or not n_prompt:
        sys.exit(f"gates.kernel_profile: the fully resident run failed (rc {r0['rc']}), see {a.work}")
    windows = a.windows
    if windows is None:  # gate d's whole-granule window: the smallest tail past device memory it measures
        windows = [small_tail_window(n_prompt)]
    configs = [("resident", None, "")] + [(f"window {w}" + (f" {d}" if d else ""), w, d)
                                          for w in windows for d in a.debug]

    def argv_env(cells: int | None, debug: str, n: int) -> tuple[list[str], dict]:
        extra = ["--kv-residency-mode", "window", "-fit", "off"]
        env = {WINDOW_ENV: str(cells)} if cells else {}
        if debug:
            env[DEBUG_ENV] = debug
        return completion(a.bin, model, a.ctx, prompt, n, extra), env

    result: dict = {"n_prompt": n_prompt, "ctx": a.ctx, "configs": {}}
    # timed runs, interleaved
    carried: dict[str, int] = {name: 0 for name, _, _ in configs}  # timed runs whose ring read carried chunks
    trials: dict[str, list[dict]] = {name: [] for name, _, _ in configs}  # the ring's carry trials, kept or dropped
    # llama's "graphs reused" against its decode runs, per timed run: a configuration that builds its graph again
    # each token pays the build on the host between two tokens
    reused: dict[str, list[list[int]]] = {name: [] for name, _, _ in configs}
    # what a comparison flag says, once a process, about the way it ran (fattn.cu's "OPENCOTI_KV_DEBUG flag: ...")
    said: dict[str, set[str]] = {name: set() for name, _, _ in configs}
    # the flags that log when they run (gates.gpu.FLAG_RAN), per configuration: one asked for and never logged did
    # not run, so its timings are the default's (flags_not_run in the result)
    ran: dict[str, set[str]] = {name: set() for name, _, _ in configs}
    builds: set[str] = set()  # the builds' stamps the runs logged (one build: one stamp)
    # each repetition's time of each configuration (None where the run failed), and the place it ran in
    by_rep: dict[str, list[float | None]] = {name: [] for name, _, _ in configs}
    places: dict[str, list[int]] = {name: [] for name, _, _ in configs}
    for rep in range(a.reps):
        for place, (name, cells, debug) in enumerate(rotated(configs, rep), 1):
            cmd, env = argv_env(cells, debug, a.time_n)
            r = run(f"kprof-time-{name.replace(' ', '-')}-{rep}", cmd, a.work, env=env)
            carried[name] += bool(RE_CARRY_READ.search(r.get("text", "")))
            trials[name] += r.get("carry_trials", [])
            if "graphs_reused" in r and "decode_runs" in r:
                reused[name].append([r["graphs_reused"], r["decode_runs"]])
            said[name].update(r.get("debug_lines", []))
            ran[name].update(flags_ran(r.get("text", "")))
            builds.update([r["build"]] if "build" in r else [])
            places[name].append(place)
            ok = r["rc"] == 0 and bool(r.get("decode_ms_per_token"))
            by_rep[name].append(r["decode_ms_per_token"] if ok else None)
            if ok:
                log(f"timed {name} (place {place}): {r['decode_ms_per_token']:.4f} ms/token ({r.get('decode_tps')} tok/s)")
    times = {name: [t for t in by_rep[name] if t is not None] for name in by_rep}  # the runs that gave a time
    # profiled runs
    for name, cells, debug in configs:
        if a.no_ncu:
            result["configs"][name] = {"window": cells, "debug": debug, "timed_ms_per_token": times[name],
                                       "timed_median_ms": round(statistics.median(times[name]), 4)
                                       if times[name] else None, "timed_by_rep": by_rep[name],
                                       "places": places[name], "carry_read_runs": carried[name],
                                       "carry_trials": trials[name],
                                       "graphs_reused_of_decodes": reused[name], "debug_lines": sorted(said[name]),
                                       "flags_ran": sorted(ran[name]), "flags_not_run": flags_not_run(debug, ran[name])}
            continue
        cmd, env = argv_env(cells, debug, a.profile_n)
        log_file = a.work / f"kprof-{name.replace(' ', '-')}.csv"
        ncu = [a.ncu, "--target-processes", "all", "--kernel-name-base", "function", "-k", KERNELS,
               "--metrics", "gpu__time_duration.sum", "--cache-control", "none", "--clock-control", "none",
               "--csv", "--print-units", "base", "--log-file", str(log_file)]
        r = run(f"kprof-ncu-{name.replace(' ', '-')}", ncu + cmd, a.work, env=env, timeout=900)
        rows = decode_kernels(parse_ncu_csv(log_file.read_text() if log_file.is_file() else ""))
        entry: dict = {"window": cells, "debug": debug, "ncu_rc": r["rc"], "carry_read_runs": carried[name],
                       "carry_trials": trials[name],
                       "graphs_reused_of_decodes": reused[name], "debug_lines": sorted(said[name]),
                       "flags_ran": sorted(ran[name]), "flags_not_run": flags_not_run(debug, ran[name]),
                       "timed_ms_per_token": times[name], "timed_by_rep": by_rep[name],
                       "places": places[name],
                       "timed_median_ms": round(statistics.median(times[name]), 4) if times[name] else None}
        if rows:
            entry |= per_token(rows, a.profile_n - 1)
        result["configs"][name] = entry
        log(f"profiled {name}: {entry.get('us_per_token')} us of attention kernels a token, "
            f"timed {entry['timed_median_ms']} ms a token")
    result["builds"] = sorted(builds)
    result["device"] = device_cards()
    for name, line in over_resident(result["configs"]).items():
        log(f"{name} over resident: {line}")
    a.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
