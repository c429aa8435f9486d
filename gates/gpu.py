"""GPU gates on a CUDA machine: (a) boot repro under a ballast, (b) resident unchanged, (c) window = resident,
(d) the tail-share curve, plus the measurements behind the figures: (e) compute buffers, (f) per-token breakdown,
(g) the budget curve at a declared context, (h) its missed prefill points repeated."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from gates import tail_models
from gates.common import (
    COULD_NOT_RUN,
    DEBUG_ENV,
    RE_CARRY_TRIAL,
    RE_SPAN_SPLIT,
    RE_WINDOW,
    TOL_SAME_TOP_PCT,
    TOL_TOOL_MAX_KLD,
    WINDOW_ENV,
    GateError,
    build_compiler,
    carry_trials,
    check_own_libraries,
    compilers_differ,
    device_cards,
    ensure_model,
    log,
    make_text,
    need_tool,
    own_libraries_env,
    parse_stats,
    report_part,
    rotated,
    write_whole,
)

RE_PROMPT = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens .*?([\d.]+) tokens per second")
RE_EVAL = re.compile(r"\s eval time =\s*([\d.]+) ms /\s*(\d+) runs .*?([\d.]+) tokens per second")
# llama's own count of the graphs it reused instead of building them again (its perf summary)
RE_REUSED = re.compile(r"graphs reused =\s*(\d+)")
# the build that ran, as common_params_print_info logs it: "build 5 (0c1e5709+0089.9b49f91e) with GNU 13.3.0 for ..."
RE_BUILD = re.compile(r"\bbuild (\d+) \((\S+)\) with (.+)")
# a comparison flag of OPENCOTI_KV_DEBUG that says, once a process, which way it ran ("OPENCOTI_KV_DEBUG flag: ...")
RE_DEBUG_LINE = re.compile(r"OPENCOTI_KV_DEBUG [a-z0-9-]+: [^\n]*")
RE_COMPUTE = re.compile(r"(\S+) compute buffer size =\s*([\d.]+) MiB")
# the reserve's summary: "graph: nodes = N, splits = S, ..." or, when the pp and tg graphs differ,
# "graph (pp bs=512, tg bs=1): nodes = N / M, splits = S / T, ..."
RE_GRAPH = re.compile(r"graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?, splits = (\d+)(?: / (\d+))?")
OOM_LINES = ("failed to allocate compute pp buffers", "graph_reserve: failed to allocate compute buffers",
             "failed to allocate CUDA0 buffer")
MIB = 1 << 20
# 0089's two-pass reserve line: the compute bytes per cell of attention span the window is sized with
RE_SPAN_BYTES = re.compile(r"two-pass compute reserve: measured \d+ MiB, .* and (\d+) bytes per cell of attention span")
MODEL_ARGS = ["--arch", "llama", "--layers", "8", "--n-embd", "2048", "--n-head", "16", "--n-head-kv", "4",
              "--head-dim", "128", "--n-ff", "8192", "--ctx", "1048576", "--vocab", "512"]
COPY_TAIL_ENV = {DEBUG_ENV: "copy-tail"}  # 0073 off: the full build on 0072's copying tail path
KV_BYTES_PER_CELL = 8 * 2 * 4 * 128 * 2  # layers * (K+V) * kv heads * head dim * f16
# the cells of one 2 MiB mapping granule in a K or V tensor of the gate model (4 kv heads * head dim 128 * f16): a
# mapped tail's device part is whole granules, so only a window of whole granules keeps exactly its cells there
GRANULE_CELLS = (2 << 20) // (4 * 128 * 2)


class Ballast:
    """A separate process holding device memory with torch.empty, so that only `leave_mib` stays free."""

    def __init__(self, leave_mib: int):
        code = (
            "import sys, time, torch\n"
            "free, total = torch.cuda.mem_get_info()\n"
            f"take = max(0, free - {leave_mib} * 2**20)\n"
            "x = torch.empty(take, dtype=torch.uint8, device='cuda')\n"
            "free2, _ = torch.cuda.mem_get_info()\n"
            "print(f'ballast holds {take >> 20} MiB; free now {free2 >> 20} MiB of {total >> 20}', flush=True)\n"
            "time.sleep(100000)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline().strip()
        if not self.line.startswith("ballast holds"):
            raise SystemExit(f"ballast failed to start: {self.line!r}")
        log(self.line)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


class MemPeak:
    """Peak device memory used by one process, polled with nvidia-smi."""

    def __init__(self) -> None:
        self.peak = 0
        self.pid: int | None = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            if self.pid:
                r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True)
                for ln in r.stdout.splitlines():
                    parts = [p.strip() for p in ln.split(",")]
                    if len(parts) == 2 and parts[0] == str(self.pid) and parts[1].isdigit():
                        self.peak = max(self.peak, int(parts[1]))
            time.sleep(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


# kv-attention-span: the cache's reserve line
RE_DEVICE_CELLS = re.compile(r"host tail mapped into the device's address space: .* (\d+) cells in device memory")
RE_SPAN = re.compile(r"attention span (\d+) of (\d+) cells")
# 0073's tail ring says, once a context, that chunks carried in from the graph before were read, and that a carry was
# dropped because a write into a mapped buffer came in between
RE_CARRY_READ = re.compile(r"tail ring: (\d+) carried chunk\(s\) read by graph")
CARRY_DROPPED = "tail ring: carried chunks dropped: a write into a mapped buffer"
# the flags of OPENCOTI_KV_DEBUG that log, once a context, that they ran, and what it means when no run logged it:
# a flag asked for that did not run has not been checked, whatever the runs say
FLAG_RAN = {
    "ring-carry": (RE_CARRY_READ, "no 'tail ring: ... carried chunk(s) read' line was logged: the carry did not run"),
    "ring-carry-trial": (RE_CARRY_TRIAL, "no 'tail ring: ring-carry kept|dropped' line was logged: no carry trial "
                                         "ran to its end"),
}


def flags_ran(text: str) -> list[str]:
    """The flags of FLAG_RAN whose line the log text has."""
    return sorted(f for f, (rx, _why) in FLAG_RAN.items() if rx.search(text))


def flags_not_run(debug: str, ran: set[str]) -> list[str]:
    """The flags of debug (OPENCOTI_KV_DEBUG's comma-separated list) that log when they run and are not in ran."""
    return [f for f in debug.split(",") if f in FLAG_RAN and f not in ran]
# a window sized from a budget: the layers whose K and V hold one granule more (the granularity's remainders)
RE_GRANULE_LAYERS = re.compile(r"the mapping granularity's remainders: (\d+) of (\d+) layers hold one granule more")


def run(tag: str, argv: list[str], work: Path, env: dict | None = None, measure: bool = False,
        timeout: int = 300) -> dict:
    """Run one tool, keep its log under work/, and parse what the gates read from it."""
    e = dict(os.environ)
    e.pop(WINDOW_ENV, None)
    e.update(env or {})
    e = own_libraries_env(argv, e)
    mp = MemPeak() if measure else None
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=e)
    if mp:
        mp.pid = p.pid
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    text = out.decode("utf-8", "replace")
    (work / f"{tag}.log").write_text(" ".join(argv) + "\n\n" + text)
    res: dict = {"tag": tag, "rc": p.returncode, "seconds": round(time.monotonic() - t0, 2)}
    if mp:
        res["device_mib_peak"] = mp.stop()
    m = RE_PROMPT.search(text)
    if m:
        res["prefill_tps"] = float(m.group(3))
        res["prompt_tokens"] = int(m.group(2))
    m = RE_EVAL.search(text)
    if m:
        res["decode_tps"] = float(m.group(3))
        res["decode_ms_per_token"] = float(m.group(1)) / max(1, int(m.group(2)))
        res["decode_runs"] = int(m.group(2))
    m = RE_REUSED.search(text)
    if m:
        res["graphs_reused"] = int(m.group(1))
    m = RE_BUILD.search(text)
    if m:  # the build's stamp (upstream commit + the series' top patch and digest) and compiler, for attribution
        res["build"] = m.group(2)
        res["compiler"] = m.group(3).strip()
    res["debug_lines"] = sorted({m.group(0).strip() for m in RE_DEBUG_LINE.finditer(text)})
    res["carry_trials"] = carry_trials(text)  # the tail ring's carry trial: kept or dropped, once a context
    m = RE_SPAN_BYTES.search(text)
    if m:  # 0089: the compute bytes each window cell past the span's floor costs beside its K and V
        res["span_cell_bytes"] = int(m.group(1))
    # with two passes, the lines after the measurement are the cache the context runs with (a window or fully resident)
    last = text.rfind("two-pass compute reserve: measured")
    final = text[last:] if last >= 0 else text
    found = list(RE_WINDOW.finditer(final))
    w = found[-1] if found else None
    if w:
        res["window"] = {"resident": int(w.group(1)), "kv_size": int(w.group(2)), "tail": int(w.group(3)),
                         "tail_mib": float(w.group(4))}
    res["fully_resident"] = "FULLY RESIDENT" in final and not found
    # a mapped tail: the cells every K/V tensor really holds in device memory (the window rounded down to the mapping
    # granularity); the window line gives the cells the sizer paid for
    dev = [int(x) for x in RE_DEVICE_CELLS.findall(final)]
    if dev:
        res["device_cells"] = min(dev)
    more = RE_GRANULE_LAYERS.findall(final)
    if more:  # per cache: an iSWA or hybrid model logs one line a cache
        res["granule_layers"] = [[int(n), int(of)] for n, of in more]
    res["measure_pass"] = [ln.strip() for ln in text.splitlines() if "two-pass" in ln or "measure pass" in ln]
    res["window_lines"] = [ln.strip() for ln in text.splitlines() if "position window" in ln]
    res["oom_lines"] = [ln.strip() for ln in text.splitlines() if any(k in ln for k in OOM_LINES)]
    buffers = RE_COMPUTE.findall(text)
    res["compute_mib"] = [float(mib) for name, mib in buffers if name == "CUDA0"]  # one per reserve
    res["compute_buffers_mib"] = {name: float(mib) for name, mib in buffers}  # the last reserve's, per backend
    res["graphs"] = [{"nodes_pp": int(n), "nodes_tg": int(m or n), "splits_pp": int(sp), "splits_tg": int(st or sp)}
                     for n, m, sp, st in RE_GRAPH.findall(text)]
    res["text"] = text
    return res


def completion(bin_dir: Path, model: Path, ctx: int, prompt_file: Path, n: int, extra: list[str],
               cache: str = "f16") -> list[str]:
    return [str(bin_dir / "llama-completion"), "-m", str(model), "-f", str(prompt_file), "-n", str(n), "-c", str(ctx),
            "-ngl", "99", "-fa", "on", "-ctk", cache, "-ctv", cache, "--temp", "0", "--seed", "1", "-no-cnv",
            "--ignore-eos", "-t", "8", "-lv", "4", *extra]


def strip(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "text"}


def link_bandwidth() -> dict:
    """Host-to-device copy bandwidth (GB/s) from pinned and from pageable memory, measured with torch."""
    code = (
        "import json, time, torch\n"
        "n = 1 << 30\n"
        "d = torch.empty(n, dtype=torch.uint8, device='cuda')\n"
        "out = {}\n"
        "for name, pin in (('pinned', True), ('pageable', False)):\n"
        "    h = torch.ones(n, dtype=torch.uint8, pin_memory=pin)\n"
        "    d.copy_(h); torch.cuda.synchronize()\n"
        "    ts = []\n"
        "    for _ in range(5):\n"
        "        t = time.perf_counter(); d.copy_(h, non_blocking=pin); torch.cuda.synchronize()\n"
        "        ts.append(time.perf_counter() - t)\n"
        "    ts.sort(); out[name + '_gbps'] = round(n / ts[len(ts) // 2] / 1e9, 2)\n"
        "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (r.stderr or r.stdout)[-400:]}


# (a) ---------------------------------------------------------------------------------------------------------
def gate_a(a: argparse.Namespace, model: Path, work: Path) -> dict:
    prompt = work / "short.txt"
    prompt.write_text(make_text(60, 7))
    extra = ["--kv-residency-mode", "window", "-fit", "off"]
    ballast = Ballast(a.leave_mib)
    try:
        # without 0089 the sizer budgets a fixed 1536 MiB for the compute buffer; on the copying tail path (the one
        # builds without a mapped buffer type take) the buffer at 1M is about 4 GiB, so the reserve fails there
        pre = run("a-pre0089", completion(a.pre_bin, model, a.boot_ctx, prompt, 32, extra), work,
                  env=COPY_TAIL_ENV)
        full = run("a-full", completion(a.full_bin, model, a.boot_ctx, prompt, 32, extra), work)
        before = run("a-before", completion(a.before_bin, model, a.boot_ctx, prompt, 32, extra), work,
                     env=a.before_env) if a.before_bin else None
    finally:
        ballast.close()
    ok = (pre["rc"] != 0 and bool(pre["oom_lines"]) and full["rc"] == 0 and bool(full["window"])
          and full.get("decode_tps", 0) > 0)
    out = {"pass": ok, "ballast": ballast.line, "ctx": a.boot_ctx, "leave_mib": a.leave_mib,
           "pre0089": {"rc": pre["rc"], "decisive": pre["oom_lines"][:3] + pre["window_lines"][:1]},
           "full": {"rc": full["rc"], "decisive": full["measure_pass"][:3] + full["window_lines"][-1:],
                    "resident_cells": (full.get("window") or {}).get("resident"),
                    "decode_tps": full.get("decode_tps"), "compute_buffer_mib": full["compute_mib"]}}
    if before:
        out["before"] = {"rc": before["rc"], "resident_cells": (before.get("window") or {}).get("resident"),
                         "decode_tps": before.get("decode_tps"), "compute_buffer_mib": before["compute_mib"]}
    return out


# (b) ---------------------------------------------------------------------------------------------------------
def bench(bin_dir: Path, model: Path, tag: str, work: Path, a: argparse.Namespace, flags: list[str]) -> dict[str, list[float]]:
    """One llama-bench invocation: pp and tg samples (tokens/s), -r repetitions each."""
    argv = bench_argv(bin_dir, model, a.bench_pp, a.bench_tg, a.bench_reps, a.bench_args.split() + flags, a.bench_cpus)
    r = run(tag, argv, work, timeout=600)
    if r["rc"] != 0:
        raise RuntimeError(f"{tag}: llama-bench exit {r['rc']}")
    return bench_samples(r["text"])


def bench_argv(bin_dir: Path, model: Path, pp: int, tg: int, reps: int, args: list[str], cpus: str) -> list[str]:
    """The llama-bench command gate b runs (all layers on the GPU, flash attention, JSON), pinned to cpus with taskset
    where cpus is given and taskset is there."""
    argv = [str(bin_dir / "llama-bench"), "-m", str(model), "-ngl", "99", "-fa", "1", "-p", str(pp), "-n", str(tg),
            "-r", str(reps), "-o", "json", *args]
    return ["taskset", "-c", cpus, *argv] if cpus and shutil.which("taskset") else argv


def bench_samples(text: str) -> dict[str, list[float]]:
    """The samples (tokens/s) of `llama-bench -o json`'s output (its log lines around the JSON ignored): 'pp' for the
    prompt test, 'tg' for the generation test."""
    data = json.loads(text[text.index("["):text.rindex("]") + 1])
    out: dict[str, list[float]] = {}
    for t in data:
        key = "pp" if t["n_prompt"] > 0 else "tg"
        out[key] = [float(x) for x in t["samples_ts"]]
    return out


def part_why(res: dict) -> str:
    """Why a gate's result is not a pass, from the halves that say why (gate b's pp / tg), for forktool's part line."""
    whys = [f"{k}: {v['why']}" for k, v in res.items() if isinstance(v, dict) and v.get("why")]
    return "; ".join(whys)


def median_interval(xs: list[float], confidence: float) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median of xs: the order statistics x(k) and x(n+1-k) for the largest k
    whose coverage (1 - 2 P[Binomial(n, 1/2) < k]) is at least `confidence` (tail_models.median_order), with that
    coverage; None when even the range covers less (too few values: 5 give the range at 0.9375, 9 the
    second-smallest to second-largest at 0.961)."""
    s, n = sorted(xs), len(xs)
    if n < 2:
        return None
    k, cover = tail_models.median_order(n, confidence)
    return (s[k - 1], s[n - k], cover) if cover >= confidence else None


def compare(samples: dict[str, list[list[float]]], name: str, ref: str, margin: float = 0.05,
            confidence: float = 0.9, sided: str = "both") -> dict:
    """`name` against `ref` as an equivalence test. Rounds are interleaved, so each round gives one paired ratio
    (name's round median over ref's: a drift of the machine moves both); the verdict reads the interval those ratios
    put around their median (median_interval, at `confidence`): 'pass' when it lies within 1 +- margin (the
    measurements show the two equal within the margin), 'fail' when it lies wholly outside (they show a difference),
    'not checked' otherwise (too few rounds, or too noisy to tell: never a pass). With sided='lower' the test is
    one-sided, `name` not slower than `ref`: 'pass' when the interval lies at or above 1 - margin, 'fail' when it lies
    wholly below, and a pass wholly above 1 + margin says so (`faster`). Also reported: the ratio of the
    medians over every sample, run-to-run noise (the spread of a build's round medians relative to its median, the
    larger of the two builds) and the ratio of the best samples."""
    if sided not in ("both", "lower"):
        raise ValueError(f"compare: sided is 'both' or 'lower', not {sided!r}")
    med = {n: statistics.median([x for rnd in samples[n] for x in rnd]) for n in (name, ref)}
    rmed = {n: [statistics.median(rnd) for rnd in samples[n]] for n in (name, ref)}
    noise = max((max(rmed[n]) - min(rmed[n])) / med[n] for n in (name, ref))
    ratios = [f / u for f, u in zip(rmed[name], rmed[ref], strict=True)]
    best = max(x for rnd in samples[name] for x in rnd) / max(x for rnd in samples[ref] for x in rnd)
    interval = median_interval(ratios, confidence)
    lo_ok, hi_ok = 1.0 - margin, 1.0 + margin
    out = {"median_tps": {n: round(v, 1) for n, v in med.items()}, "ratio": round(med[name] / med[ref], 4),
           "paired_ratio": round(statistics.median(ratios), 4),
           "round_ratio_min_max": [round(min(ratios), 4), round(max(ratios), 4)],
           "round_medians": {n: [round(x, 1) for x in v] for n, v in rmed.items()},
           "margin": margin, "noise": round(noise, 4), "best_ratio": round(best, 4), "sided": sided}
    if interval is None:
        verdict = "not checked"
        out["why"] = (f"{len(ratios)} round(s) give no interval for the median ratio at confidence {confidence}: "
                      f"run more rounds (--bench-rounds; 5 at least, 30 by default)")
    else:
        lo, hi, cover = interval
        out["interval"] = [round(lo, 4), round(hi, 4)]
        out["interval_confidence"] = round(cover, 4)
        # the region a pass must lie in: 1 +- margin, or (one-sided) at or above 1 - margin
        hi_pass = float("inf") if sided == "lower" else hi_ok
        where, outside, differs = ((f"below 1 - {margin:.3f}", f"below 1 - {margin:.3f}", "a slowdown")
                                   if sided == "lower" else
                                   (f"past 1 +- {margin:.3f}", f"outside 1 +- {margin:.3f}", "a difference"))
        span = f"the median ratio's interval [{lo:.3f}, {hi:.3f}]"
        if lo >= lo_ok and hi <= hi_pass:
            verdict = "pass"
            if lo > hi_ok:
                out["faster"] = f"{span} lies above 1 + {margin:.3f}"
        elif hi < lo_ok or lo > hi_pass:
            verdict = "fail"
            out["why"] = f"{span} lies {outside}: the measurements show {differs}"
        else:
            verdict = "not checked"
            out["why"] = (f"{span} reaches {where}: too noisy to tell (more rounds, or a steadier way to run it: "
                          f"gates.bench_noise)")
    out["verdict"] = verdict
    out["pass"] = verdict == "pass"
    return out


def resident_verdict(samples: dict[str, list[list[float]]], margin: float, confidence: float) -> dict:
    """Gate b's verdict for one half (pp or tg) from the three builds' interleaved rounds, as two questions:
    does the window code leave the resident path unchanged, the window mode against head mode of the same binary
    (`window_vs_head`: equal within 1 +- margin; the build and the series' other patches cancel), and is the series
    not slower than upstream (the top-level figures, one-sided: at least 1 - margin; a series faster than upstream is
    no fault of the window, and is reported as `faster`). Both must pass; either failing fails; otherwise not
    checked, saying which question could not be told and why. `head_mode` (head mode against upstream, one-sided)
    is reported beside them."""
    out = compare(samples, "full", "upstream", margin, confidence, sided="lower")
    out["window_vs_head"] = compare(samples, "full", "full_head", margin, confidence)
    out["head_mode"] = compare(samples, "full_head", "upstream", margin, confidence, sided="lower")
    parts = {"against upstream": out, "window against head mode": out["window_vs_head"]}
    verdicts = {q: r["verdict"] for q, r in parts.items()}
    if "fail" in verdicts.values():
        verdict = "fail"
    elif all(v == "pass" for v in verdicts.values()):
        verdict = "pass"
    else:
        verdict = "not checked"
    whys = [f"{q}: {r['why']}" for q, r in parts.items() if r["verdict"] == verdict and r.get("why")]
    out.pop("why", None)
    if whys:
        out["why"] = "; ".join(whys)
    out["verdict"], out["pass"] = verdict, verdict == "pass"
    return out


def more_rounds(done: int, verdicts: dict[str, str], extend: int, max_rounds: int) -> int:
    """Gate b's next round count after a look at `done` rounds: where a half is still 'not checked' (too noisy to
    tell: a card whose prefill runs at two speeds from one process to the next), `extend` rounds more, up to
    `max_rounds`; 0 (stop) once every half is decided, at the cap, or where extending is off. The looks are few
    (30, 45, 60 by default) and each one's verdicts are recorded (`looks`), since every look is another chance
    for noise to pass."""
    if extend <= 0 or done >= max_rounds or all(v != "not checked" for v in verdicts.values()):
        return 0
    return min(max_rounds, done + extend)


def gate_b(a: argparse.Namespace, model: Path, work: Path) -> dict:
    """Resident unchanged: llama-bench, warm-up, interleaved rounds, tests on the rounds' paired ratios
    (resident_verdict: the window mode equal to head mode of the same binary within 1 +- --bench-margin, and the
    series not slower than upstream by more than the margin).
    The full series runs in window mode (what the gate decides on) and in head mode (the same binary on upstream's
    code path: a difference both modes share is the build, not the window code)."""
    # upstream's llama-bench has no --kv-residency-mode (0070 adds it): it runs without
    builds = {"upstream": (a.upstream_bin, []), "full": (a.full_bin, ["--kv-residency-mode", "window"]),
              "full_head": (a.full_bin, ["--kv-residency-mode", "head"])}
    known = getattr(a, "compilers", None) or {}  # main() read them once for every gate
    compilers = {n: known[n] if n in known else build_compiler(need_tool(b, "llama-completion"), dict(os.environ))
                 for n, b in (("full", a.full_bin), ("upstream", a.upstream_bin))}
    differ = compilers_differ(compilers, "full", "upstream") if upstream_note(a) is None else None
    for name, (b, flags) in builds.items():  # warm-up: page cache, GPU clocks, JIT caches; discarded
        bench(b, model, f"b-warmup-{name}", work, a, flags)
    samples: dict[str, dict[str, list[list[float]]]] = {n: {"pp": [], "tg": []} for n in builds}
    # when each process ran (seconds from the first round's start): the machine's speed can change within seconds,
    # so how far apart a round's processes ran says how well its paired ratio cancels that
    starts: dict[str, list[list[float]]] = {n: [] for n in builds}
    t0 = time.monotonic()
    done, target, looks, judged = 0, a.bench_rounds, [], {}
    while target:
        for i in range(done, target):
            order = rotated(list(builds), i)  # each build leads in turn
            for name in order:
                b, flags = builds[name]
                t = time.monotonic() - t0
                s = bench(b, model, f"b-{name}-{i}", work, a, flags)
                starts[name].append([round(t, 2), round(time.monotonic() - t0, 2)])
                for k in ("pp", "tg"):
                    samples[name][k].append(s[k])
        done = target
        judged = {k: resident_verdict({n: samples[n][k] for n in builds}, a.bench_margin, a.bench_confidence)
                  for k in ("pp", "tg")}
        verdicts = {k: r["verdict"] for k, r in judged.items()}
        looks.append({"rounds": done, **verdicts})
        # builds of different compilers are not checked whatever the rounds say: no more rounds for them
        target = more_rounds(done, verdicts, 0 if differ else a.bench_extend, a.bench_max_rounds)
        if target:
            log(f"gate b: after {done} rounds {', '.join(k for k, v in verdicts.items() if v == 'not checked')} "
                f"not checked: {target - done} rounds more (up to --bench-max-rounds {a.bench_max_rounds})")
    res: dict = {"rounds": done, "reps_per_round": a.bench_reps, "pp": a.bench_pp, "tg": a.bench_tg,
                 "args": a.bench_args, "process_seconds": starts, "looks": looks,
                 "cpus": a.bench_cpus if a.bench_cpus and shutil.which("taskset") else None}
    ok, unchecked = True, []
    for k in ("pp", "tg"):
        res[k] = judged[k]  # the last look's
        res[k]["samples"] = {n: samples[n][k] for n in builds}
        ok = ok and res[k]["pass"]
        if res[k]["verdict"] == "not checked":
            unchecked.append(k)
            log(f"gate b: {k} not checked: {res[k]['why']}")
        elif res[k]["verdict"] == "fail":
            log(f"gate b: {k} FAILS: {res[k]['why']}")
    # fully resident stays single-pass: one logged run of the window mode with nothing forced
    prompt = work / "prompt-b.txt"
    prompt.write_text(make_text(1500, 11))
    r = run("b-full-logged", completion(a.full_bin, model, 131072, prompt, 16, ["--kv-residency-mode", "window"]), work)
    single = r["rc"] == 0 and r["fully_resident"] and not r["measure_pass"]
    res["fully_resident_single_pass"] = single
    res["window_line"] = r["window_lines"][:1]
    res["pass"] = ok and single
    res["compilers"] = compilers
    if differ:
        # the ratios above are reported, but they would judge the compilers as much as the code: nothing is checked
        log(f"gate b: not checked: {differ}")
        res["pass"] = False
        unchecked = ["pp", "tg"]
        res["why_not_checked"] = differ
    if unchecked:
        res["verdict"] = "not checked"
        res["not_checked"] = unchecked
    return res


# (c) ---------------------------------------------------------------------------------------------------------
# gate c's second rule, for the decode rows of the cache types given to --c-cpu-reference. A decode token whose window
# has a device part and a tail is attended in two launches of upstream's vector kernel, whose blocks sum V in half
# precision over other cells than one launch's blocks, so the merged output rounds differently from resident's. Where
# that difference passes the bound, the row still passes when it is small against the kernel's own spread (resident
# on the GPU against the CPU backend, whose flash attention sums in F32): at most SPREAD_SHARE of resident's max KLD
# against the CPU, and the window no farther from the CPU than resident is (max and mean KLD within SPREAD_FACTOR)
SPREAD_SHARE = 0.1
SPREAD_FACTOR = 1.1


def within_spread(row: dict, resident_cpu: dict, window_cpu: dict) -> bool:
    """Whether a window row that misses gate c's bound against resident lies within the kernel's own spread."""
    keys = ("max_kld", "mean_kld")
    if any(k not in d for d in (row, resident_cpu, window_cpu) for k in keys):
        return False
    return (row["max_kld"] <= SPREAD_SHARE * resident_cpu["max_kld"]
            and window_cpu["max_kld"] <= SPREAD_FACTOR * resident_cpu["max_kld"]
            and window_cpu["mean_kld"] <= SPREAD_FACTOR * max(resident_cpu["mean_kld"], 0.0))


def sized_target(ppl: str, args: list[str], work: Path, tag: str, want: int) -> tuple[int, dict]:
    """The --vram-target (MiB) under which the window sizer keeps about `want` cells for llama-perplexity with these
    arguments, found by runs that stop once the context is made (a text too short to evaluate), each reading the
    cells its window line gives: the target doubles until the window holds `want` cells, then bisects (the target
    counts the weights and the compute buffers too, so it starts at 512 MiB). Returns the target and its run."""
    short = work / "ppl-short.txt"
    short.write_text("a few words\n")

    def probe(step: int, target: int) -> tuple[int | None, dict]:  # the cells kept (None: fully resident)
        r = run(f"c-sized-probe-{tag}-{step}", [ppl, *args, "-f", str(short), "--kv-residency-mode", "window",
                                                 "-fit", "off", "--vram-target", str(target)], work, timeout=120)
        return (None if r.get("fully_resident") else (r.get("window") or {}).get("resident", 0)), r

    lo, hi = 0, 0
    target, best = 512, (0, {})
    for step in range(16):
        cells, r = probe(step, target)
        if cells is not None and abs(cells - want) <= max(64, want // 20):
            return target, r
        if cells is not None and cells < want:
            lo, best = target, (target, r)
        else:
            hi = target
        if hi and hi - lo <= 1:
            break
        target = target * 2 if not hi else (lo + hi) // 2
    return best if best[0] else (0, r)


def gate_c(a: argparse.Namespace, model: Path, work: Path) -> dict:
    text = work / "ppl.txt"
    text.write_text(make_text(12000, 3))  # llama-perplexity needs two contexts' worth of tokens (4096-cell rows)
    ppl = str(a.full_bin / "llama-perplexity")

    long_text = work / "ppl-long.txt"
    long_text.write_text(make_text(48000, 3))  # two 16,384-cell contexts' worth of tokens

    def common(ub: int, ctx: int, cache: str = "f16", ngl: int = 99, with_text: bool = True) -> list[str]:
        return ["-m", str(model), *(["-f", str(text if ctx <= 4096 else long_text)] if with_text else []),
                "-c", str(ctx), "-b", "512", "-ub", str(ub), "-ngl", str(ngl), "-fa", "on",
                "--chunks", "4" if ub > 1 and ctx <= 2048 else "1",
                "-t", str(os.cpu_count() or 8) if ngl == 0 else "8", "-lv", "4", "-ctk", cache, "-ctv", cache]

    out: dict = {"windows": []}
    ok = True
    # 2048-cell contexts (tensors of 2 MiB: a mapped tail lies wholly in host memory) and, at 4096, windows whose
    # device part ends inside a tensor (the 2 MiB mapping granularity is 2048 cells of this model's 1 KiB rows)
    # quantized caches against resident of the same type: a q8_0 row is 544 bytes and a q4_0 row 288, so at 16,384
    # cells the 2 MiB granularity puts the device/host boundary inside the tensors of W 12,288 and 8,192, and W 512
    # lies wholly in host memory
    # f16 at 3,072 and 1,024 cells: tensors of 3 MiB and 1 MiB, not whole granules (mapped for 4 and 2 MiB; W 2,560
    # keeps 2,048 cells on the device, W 1,024 and 512 none)
    # the decode rows (-ub 1, the vector kernel's shape: every token of the text is one decode): f16 at 2,048 cells
    # (no device part: the tail read in place) and at 4,096 with W 3,072 (2,048 cells on the device: the device part
    # and the staged tail merged); at 8,192 cells W 6,144 keeps 3,855 q8_0 cells on the device and no q4_0 cell, and
    # W 7,680 keeps 3,855 q8_0 and 7,281 q4_0 cells, so both quantized types' decode merges are checked
    # the sized decode rows: the quantized caches at 8,192 cells under the --vram-target that sizes a window of about
    # --c-sized-ub1-8k cells, so that the granule hand-back gives some layers a granule more than others (6,000 q4_0
    # cells: 6 of 8 layers hold 7,281 cells on the device, 2 none; q8_0: 4 layers 7,710, 4 layers 3,855)
    configs = [("f16", 512, 2048, a.windows), ("f16", 1, 2048, a.windows), ("f16", 1, 4096, a.windows_ub1_4k),
               ("f16", 512, 4096, a.windows_4k), ("f16", 512, 3072, a.windows_3k), ("f16", 128, 1024, [512])]
    for cache in a.quant_caches:
        configs += [(cache, 512, 16384, a.windows_16k), (cache, 1, 8192, a.windows_ub1_8k)]
    if a.c_decode_only:
        configs = [c for c in configs if c[1] == 1]
    configs = [c for c in configs if c[3] or (c[1] == 1 and c[2] == 8192 and a.c_sized_ub1_8k)]
    for cache, ub, ctx, windows in configs:
        tag = f"ub{ub}-c{ctx}" + ("" if cache == "f16" else f"-{cache}")
        base = work / f"resident-{tag}.kld"
        r0 = run(f"c-resident-{tag}", [ppl, *common(ub, ctx, cache), "--kl-divergence-base", str(base)], work)
        ok = ok and r0["rc"] == 0
        # each window run: its name, environment and extra arguments (forced windows, then sized ones)
        runs: list[tuple[str, dict, list[str], dict]] = [
            (f"window {w}", {WINDOW_ENV: str(w)}, [], {"window": w}) for w in windows]
        if ub == 1 and ctx == 8192 and cache != "f16":
            for want in a.c_sized_ub1_8k:
                target, probe = sized_target(ppl, common(ub, ctx, cache, with_text=False), work, f"{tag}-{want}", want)
                if not target:  # no target sized a window under `want` cells: nothing to measure, and the row fails
                    ok = False
                    out["windows"].append({"cache": cache, "window": None, "sized_for": want, "ubatch": ub,
                                           "ctx": ctx, "vram_target_mib": None, "pass": False,
                                           "error": f"no --vram-target sized a window of about {want} cells "
                                                    f"(last probe: rc {probe.get('rc')}, see c-sized-probe-* logs)"})
                    continue
                runs.append((f"sized {want}", {}, ["-fit", "off", "--vram-target", str(target)],
                             {"window": (probe.get("window") or {}).get("resident"), "sized_for": want,
                              "vram_target_mib": target}))
        rows = []
        for name, wenv, extra, fields in runs:
            stats: dict = {}
            r: dict = {}
            for _attempt in range(3):  # llama-perplexity can lose its last log lines at exit: retry
                r = run(f"c-{name.replace(' ', '-')}-{tag}", [ppl, *common(ub, ctx, cache), "--kv-residency-mode",
                        "window", *extra, "--kl-divergence-base", str(base), "--kl-divergence"],
                        work, env={**wenv, **({DEBUG_ENV: a.window_debug} if a.window_debug else {})})
                stats = parse_stats(r["text"])
                if "max_kld" in stats and "same_top_pct" in stats:
                    break
            row = {"cache": cache, **fields, "ubatch": ub, "ctx": ctx, "rc": r["rc"],
                   "window_line": r["window_lines"][-1:],
                   "mapped_line": [ln.strip() for ln in r["text"].splitlines() if "host tail mapped" in ln][:1],
                   "device_cells": r.get("device_cells"), "granule_layers": r.get("granule_layers"),
                   "span": [[int(x) for x in m] for m in RE_SPAN.findall(r["text"])][:1],
                   "span_splits": len(RE_SPAN_SPLIT.findall(r["text"])),
                   "carry_read": bool(RE_CARRY_READ.search(r["text"])),
                   "carry_dropped_on_write": CARRY_DROPPED in r["text"], "carry_trials": r["carry_trials"],
                   "flags_ran": flags_ran(r["text"]),
                   "debug_lines": r["debug_lines"], **stats}
            row["within_bound"] = r["rc"] == 0 and bool(r.get("window")) \
                and stats.get("max_kld", 1) <= TOL_TOOL_MAX_KLD and stats.get("same_top_pct", 0) >= TOL_SAME_TOP_PCT
            if "sized_for" in row:  # a sized row checks the hand-back only where it ran with one
                row["hand_back"] = bool(row["granule_layers"]) and any(n > 0 for n, _of in row["granule_layers"])
            rows.append((name, wenv, extra, row))
        if ub == 1 and cache in a.c_cpu_reference:
            ref = c_cpu_reference(a, work, tag, [(name, wenv, extra) for name, wenv, extra, _row in rows],
                                  lambda ngl, ub=ub, ctx=ctx, cache=cache: common(ub, ctx, cache, ngl))
            out.setdefault("cpu_reference", []).append(ref)
            for name, _wenv, _extra, row in rows:
                if not row["within_bound"] and row["rc"] == 0 and row.get("same_top_pct", 0) >= TOL_SAME_TOP_PCT:
                    row["within_spread"] = within_spread(row, ref.get("resident", {}), ref.get(name, {}))
        for _name, _wenv, _extra, row in rows:
            row["pass"] = (row["within_bound"] or row.get("within_spread", False)) and row.get("hand_back", True)
            ok = ok and row["pass"]
            out["windows"].append(row)
    out["pass"] = ok
    # the ring's carry (on by default for large tails; --window-debug ring-carry carries at every size): which runs
    # read carried chunks, and which dropped a carry that a write made stale. Asked for and never run, the carry was
    # not checked, whatever the rows say
    out["carry"] = {"rows_read": sum(w["carry_read"] for w in out["windows"] if "carry_read" in w),
                    "rows_dropped_on_write": sum(w["carry_dropped_on_write"] for w in out["windows"]
                                                 if "carry_dropped_on_write" in w)}
    log(f"gate c: carried chunks read in {out['carry']['rows_read']} window run(s), a stale carry dropped in "
        f"{out['carry']['rows_dropped_on_write']}")
    missing = flags_not_run(a.window_debug, {f for w in out["windows"] for f in w.get("flags_ran", [])})
    if ok and missing:
        out["pass"] = False
        out["verdict"] = "not checked"
        out["why_not_checked"] = "; ".join(f"--window-debug names {f}, but in no window run: {FLAG_RAN[f][1]}"
                                           for f in missing)
    out["tolerance"] = {"max_kld": TOL_TOOL_MAX_KLD, "same_top_pct": TOL_SAME_TOP_PCT,
                        "spread_share": SPREAD_SHARE, "spread_factor": SPREAD_FACTOR}
    return out


def c_cpu_reference(a: argparse.Namespace, work: Path, tag: str, runs: list[tuple[str, dict, list[str]]],
                    args: Callable[[int], list[str]]) -> dict:
    """Gate c's decode rows against the CPU backend (-ngl 0, the same cache type): resident and each window run on
    the GPU, each KLD taken from the CPU run's logits, which flash attention computes there with F32 sums. A window
    row that misses gate c's bound against resident passes when these put it within the kernel's own spread
    (within_spread)."""
    ppl = str(a.full_bin / "llama-perplexity")
    base = work / f"cpu-{tag}.kld"
    r0 = run(f"c-cpu-{tag}", [ppl, *args(0), "--kl-divergence-base", str(base)], work, timeout=900)
    res: dict = {"rows": tag, "cpu_rc": r0["rc"]}
    if r0["rc"] != 0:
        return res
    r = run(f"c-resident-vs-cpu-{tag}", [ppl, *args(99), "--kl-divergence-base", str(base), "--kl-divergence"], work)
    res["resident"] = parse_stats(r["text"])
    for name, wenv, extra in runs:
        r = run(f"c-{name.replace(' ', '-')}-vs-cpu-{tag}", [ppl, *args(99), "--kv-residency-mode", "window", *extra,
                                                             "--kl-divergence-base", str(base), "--kl-divergence"],
                work, env={**wenv, **({DEBUG_ENV: a.window_debug} if a.window_debug else {})})
        res[name] = parse_stats(r["text"])
    return res


# (d) ---------------------------------------------------------------------------------------------------------
def small_tail_window(n_prompt: int) -> int:
    """The window of whole mapping granules that leaves about tail_models.SMALL_TAIL of an n_prompt-token prompt past
    device memory (gate d's whole-granule row; gates.kernel_profile's small tail)."""
    return -(-int(n_prompt * (1.0 - tail_models.SMALL_TAIL)) // GRANULE_CELLS) * GRANULE_CELLS


def curve_row(config: str, share: float | str, r: dict, ctx: int) -> dict:
    win = r.get("window") or {}
    return {"config": config, "tail_share": share, "rc": r["rc"],
            "resident_cells": win.get("resident", ctx if r["fully_resident"] else ""),
            "device_mib_peak": r.get("device_mib_peak"), "prompt_tokens": r.get("prompt_tokens"),
            "prefill_tps": r.get("prefill_tps"), "decode_tps": r.get("decode_tps"),
            "device_cells": r.get("device_cells", ""), "graphs_reused": r.get("graphs_reused", ""),
            "decode_runs": r.get("decode_runs", "")}


# 0089's targets for the tail-share curve (docs/gates.md, "Results against the targets"), on the default path
# ("window" rows; medians of the repeated points where there are any): gate d fails when one is missed
CURVE_TARGETS = (("decode_at_max_share_tps", 60.0), ("decode_vs_link", 0.6), ("decode_vs_nkvo", 4.0),
                 ("prefill_at_half_vs_nkvo", 3.0))


def curve_checks(values: dict) -> list[dict]:
    """Each curve target against its measured value; a target with no value is missed, not skipped."""
    out = []
    for name, bound in CURVE_TARGETS:
        v = values.get(name)
        out.append({"target": name, "value": None if v is None else round(float(v), 3), "bound": bound,
                    "met": v is not None and float(v) >= bound})
    return out


def gate_d(a: argparse.Namespace, model: Path, work: Path, outdir: Path) -> dict:
    """Prefill and decode against the share of the prompt in the host tail (forced windows), with references."""
    prompt = work / "prompt-d.txt"
    prompt.write_text(make_text(a.curve_words, 5))
    ctx = a.curve_ctx
    # the prompt length in tokens, from a fully resident run (also the share-0 point)
    r0 = run("d-share-0", completion(a.full_bin, model, ctx, prompt, a.curve_n, ["--kv-residency-mode", "window"]),
             work, measure=True)
    n_prompt = r0.get("prompt_tokens") or 0
    if not n_prompt:
        return {"pass": False, "error": "the fully resident run printed no prompt timing"}
    rows = [curve_row("window", 0.0, r0, ctx)]

    def forced_cells(share: float) -> int:  # the window that forces `share` of the prompt into the tail
        return max(256, int(round(n_prompt * (1.0 - share))))

    builds = [("window", a.full_bin, {})] + ([("window before", a.before_bin, a.before_env)] if a.before_bin else [])
    for share in a.shares:
        cells = forced_cells(share)
        for config, b, benv in builds:
            if config != "window" and share not in a.before_shares:
                continue
            r = run(f"d-{config.replace(' ', '-')}-{share}", completion(b, model, ctx, prompt, a.curve_n,
                    ["--kv-residency-mode", "window", "-fit", "off"]), work,
                    env={WINDOW_ENV: str(cells), **benv}, measure=True)
            row = curve_row(config, round(1.0 - min(cells, n_prompt) / n_prompt, 4), r, ctx)
            rows.append(row)
            log(f"curve: {row}")
    # the small tail past device memory: a forced share keeps its window rounded down to whole granules there (1 %
    # of this prompt leaves 6.7 % in host memory), so the smallest whole-granule window short of the prompt is run too
    cells = small_tail_window(n_prompt)
    granule_cells, granule_share = (cells, round(1.0 - cells / n_prompt, 4)) if cells < n_prompt else (None, None)
    if cells < n_prompt:
        share = round(1.0 - cells / n_prompt, 4)
        for config, b, benv in builds:
            r = run(f"d-{config.replace(' ', '-')}-granules-{cells}", completion(b, model, ctx, prompt, a.curve_n,
                    ["--kv-residency-mode", "window", "-fit", "off"]), work, env={WINDOW_ENV: str(cells), **benv},
                    measure=True)
            rows.append(curve_row(config, share, r, ctx))
            log(f"curve (whole granules): {rows[-1]}")
    # the same prompt under --vram-target budgets (the sizer picks the window; "before" sizes its own)
    for target in a.targets:
        for config, b, benv in builds:
            r = run(f"d-{config.replace(' ', '-')}-target-{target}", completion(b, model, ctx, prompt, a.curve_n,
                    ["--kv-residency-mode", "window", "-fit", "off", "--vram-target", str(target)]), work, env=benv,
                    measure=True)
            cells = (r.get("window") or {}).get("resident", ctx)
            row = curve_row(f"{config} --vram-target {target}", round(max(0.0, 1.0 - cells / n_prompt), 4), r, ctx)
            rows.append(row)
            log(f"table: {row}")
    r = run("d-nkvo", completion(a.upstream_bin, model, ctx, prompt, a.curve_n, ["-nkvo"]), work, measure=True)
    rows.append(curve_row("upstream --no-kv-offload", 1.0, r, ctx) | {"resident_cells": 0})
    # what else a user would pick: upstream with a q8_0 KV cache sized to the prompt (fits while its KV <= the window's)
    q_ctx = (n_prompt + a.curve_n + 1023) // 1024 * 1024
    r = run("d-q8", completion(a.upstream_bin, model, q_ctx, prompt, a.curve_n, ["-ctk", "q8_0", "-ctv", "q8_0"]), work,
            measure=True)
    q8_bytes = q_ctx * KV_BYTES_PER_CELL * 34 // 64  # q8_0: 34 bytes per 32 values
    fits_share = max(0.0, 1.0 - q8_bytes / KV_BYTES_PER_CELL / n_prompt)
    rows.append(curve_row(f"upstream q8_0 KV, ctx {q_ctx}", round(fits_share, 4), r, q_ctx))
    # the target points again, interleaved, so the ratios are medians of --target-reps runs (single runs swing)
    half_share = min(a.shares, key=lambda x: abs(x - 0.5))
    max_share = max(a.shares)
    reps: dict[str, dict[str, list[float]]] = {}
    in_order: dict[str, list[float | None]] = {}  # each point's decode per repetition, None where a run gave none
    reused: dict[str, list[list[int]]] = {}
    trials: dict[str, list[dict]] = {}  # the tail ring's carry trials (kept or dropped) of each point's runs

    def sample(key: str, r: dict) -> None:
        for m in ("prefill_tps", "decode_tps"):
            if r.get(m):
                reps.setdefault(key, {}).setdefault(m, []).append(r[m])
        in_order.setdefault(key, []).append(r.get("decode_tps"))
        if r.get("graphs_reused", "") != "" and r.get("decode_runs", "") != "":  # llama's reused graphs, its decodes
            reused.setdefault(key, []).append([r["graphs_reused"], r["decode_runs"]])
        trials.setdefault(key, []).extend(r.get("carry_trials", []))

    def realized(share: float) -> float:  # the tail share a forced window for `share` gives (as in the rows)
        return round(1.0 - min(forced_cells(share), n_prompt) / n_prompt, 4)

    # item 3's tail targets too: fully resident (share 0) and the small tail (the whole-granule row)
    for row in rows:
        if row["config"] == "window" and row["tail_share"] == realized(half_share):
            sample("half", row)
        if row["config"] == "window" and row["tail_share"] == realized(max_share):
            sample("max", row)
        if row["config"] == "window" and row["tail_share"] == 0.0:
            sample("resident", row)
        if row["config"] == "window" and granule_share is not None and row["tail_share"] == granule_share:
            sample("small", row)
        if row["config"] == "upstream --no-kv-offload":
            sample("nkvo", row)
    rep_points: list[tuple[str, int | None]] = [
        ("half", forced_cells(half_share)), ("max", forced_cells(max_share)), ("nkvo", None), ("resident", 0)]
    if granule_cells is not None:
        rep_points.append(("small", granule_cells))

    def repeat(key: str, cells: int | None, tag: str) -> None:  # one more run of a point
        if cells is None:
            r = run(f"d-nkvo-{tag}", completion(a.upstream_bin, model, ctx, prompt, a.curve_n, ["-nkvo"]), work,
                    measure=True)
        elif cells == 0:  # fully resident, as the share-0 row
            r = run(f"d-window-resident-{tag}", completion(a.full_bin, model, ctx, prompt, a.curve_n,
                    ["--kv-residency-mode", "window"]), work, measure=True)
        else:
            r = run(f"d-window-{key}-{cells}-{tag}", completion(a.full_bin, model, ctx, prompt, a.curve_n,
                    ["--kv-residency-mode", "window", "-fit", "off"]), work, env={WINDOW_ENV: str(cells)},
                    measure=True)
        sample(key, r)

    for i in range(1, a.target_reps):
        for key, cells in rotated(rep_points, i):  # each point leads in turn (a fixed order favours a place)
            repeat(key, cells, f"rep{i}")
    # item 3's small tail against fully resident: more runs than the other points (cheap, and noisier than the
    # target is wide), as pairs that take turns leading
    if granule_cells is not None:
        for i in range(max(1, a.target_reps), a.small_tail_reps):
            for key, cells in rotated([("resident", 0), ("small", granule_cells)], i):
                repeat(key, cells, f"pair{i}")
    link = link_bandwidth()
    csv_path = outdir / "rolling_kv_curve.csv"
    with open(csv_path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    meta = {"prompt_tokens": n_prompt, "ctx": ctx, "kv_bytes_per_cell": KV_BYTES_PER_CELL, "link": link,
            "decode_n": a.curve_n, "before": a.before_label, "device": getattr(a, "device", None) or []}
    write_whole(outdir / "rolling_kv_curve.json", json.dumps(meta, indent=2))
    nkvo = next(r for r in rows if r["config"] == "upstream --no-kv-offload")
    at = {r["tail_share"]: r for r in rows if r["config"] == "window"}
    last = max(at)
    half = min(at, key=lambda s: abs(float(s) - 0.5))
    targets = {
        "decode_at_max_share_tps": at[last].get("decode_tps"),
        "decode_vs_nkvo": (at[last].get("decode_tps") or 0) / (nkvo.get("decode_tps") or 1),
        "prefill_at_half_vs_nkvo": (at[half].get("prefill_tps") or 0) / (nkvo.get("prefill_tps") or 1),
    }
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in reps.items()}
    if {"half", "max", "nkvo"} <= set(med):
        targets["medians"] = {"runs": a.target_reps, "samples": reps, "median": med, "graphs_reused_of_decodes": reused,
                              "carry_trials": trials,
                              "decode_at_max_share_tps": med["max"].get("decode_tps"),
                              "decode_vs_nkvo": med["max"].get("decode_tps", 0) / med["nkvo"].get("decode_tps", 1),
                              "prefill_at_half_vs_nkvo": med["half"].get("prefill_tps", 0)
                              / med["nkvo"].get("prefill_tps", 1)}
    # item 3's tail targets and the two models of a token's time, fitted to the forced-window rows (gates.tail_models)
    targets["tail"] = tail_models.tail_targets(rows, link.get("pinned_gbps") or 0.0, a.curve_n, KV_BYTES_PER_CELL)
    targets["models"] = tail_models.compare(tail_models.curve_points(rows, a.curve_n, KV_BYTES_PER_CELL))
    for name, t in targets["tail"].items():  # issue targets beyond 0089's: reported, never part of the gate's pass
        log(f"tail target (single runs) {tail_models.target_line(name, t)}")
    if a.target_reps > 1 or len(in_order.get("small", [])) > 1:  # the same targets on the medians of the
        # interleaved runs: the figures to judge them by
        keyed = {0.0: "resident", realized(max_share): "max"} | ({granule_share: "small"} if granule_share else {})

        def median_decode(r: dict) -> float | None:
            return med.get(keyed.get(r["tail_share"], ""), {}).get("decode_tps") if r["config"] == "window" else None

        med_rows = [r | {"decode_tps": median_decode(r)} if median_decode(r) is not None else r for r in rows]
        targets["tail_medians"] = tail_models.tail_targets(med_rows, link.get("pinned_gbps") or 0.0, a.curve_n,
                                                           KV_BYTES_PER_CELL) | {"runs": a.target_reps}
        if "small" in in_order:
            targets["tail_medians"]["small_tail_runs"] = len(in_order["small"])
        # the spread behind each median: each repetition's small tail against its own resident run, and its
        # largest tail against the link's limit; the line then says met or missed only where every run agrees
        small, large = (targets["tail_medians"].get(k) for k in ("small_tail", "large_tail"))
        if small:
            tail_models.add_runs(small, [s / r if s and r else None for s, r in
                                         zip(in_order.get("small", []), in_order.get("resident", []), strict=False)])
        if large and large.get("link_limit_tps"):
            tail_models.add_runs(large, [m / large["link_limit_tps"] if m else None for m in in_order.get("max", [])])
        for name, t in targets["tail_medians"].items():
            if isinstance(t, dict):
                n = len(in_order.get("small", [])) if name == "small_tail" else a.target_reps
                log(f"tail target (medians of {n}) {tail_models.target_line(name, t)}")
    values = {k: (targets.get("medians") or targets).get(k) for k in
              ("decode_at_max_share_tps", "decode_vs_nkvo", "prefill_at_half_vs_nkvo")}
    limit = (targets["tail"].get("large_tail") or {}).get("link_limit_tps")
    if limit and values["decode_at_max_share_tps"]:
        values["decode_vs_link"] = values["decode_at_max_share_tps"] / limit
    targets["checks"] = curve_checks(values)
    for c in targets["checks"]:
        log(f"curve target {c['target']}: {c['value']} (>= {c['bound']}): {'met' if c['met'] else 'MISSED'}")
    return {"pass": all(r["rc"] == 0 for r in rows) and all(c["met"] for c in targets["checks"]), "csv": str(csv_path),
            "meta": meta, "rows": rows, "targets": targets}


# (e) ---------------------------------------------------------------------------------------------------------
def gate_e(a: argparse.Namespace, model: Path, work: Path) -> dict:
    """CUDA0 compute buffer in window mode (a forced host tail) against upstream, at several contexts."""
    prompt = work / "short.txt"
    prompt.write_text(make_text(60, 7))
    rows = []
    for ctx in a.buffer_ctxs:
        row: dict = {"ctx": ctx}
        for name, b, extra, env in (
                ("upstream", a.upstream_bin, [], {}),
                ("window", a.full_bin, ["--kv-residency-mode", "window", "-fit", "off"], {WINDOW_ENV: "16384"}),
                ("window_before", a.before_bin, ["--kv-residency-mode", "window", "-fit", "off"],
                 {WINDOW_ENV: "16384", **a.before_env})):
            if b is None:
                continue
            r = run(f"e-{name}-{ctx}", completion(b, model, ctx, prompt, 4, extra), work, env=env)
            row[f"{name}_mib"] = r["compute_mib"][-1] if r["compute_mib"] else None
            row[f"{name}_rc"] = r["rc"]
        rows.append(row)
        log(f"buffers: {row}")
    checks = buffer_checks(rows)
    for c in checks:
        log(f"buffers: {c['check']}: {'met' if c['met'] else 'MISSED'}")
    return {"pass": all(v == 0 for r in rows for k, v in r.items() if k.endswith("_rc")) and all(c["met"] for c in checks),
            "rows": rows, "checks": checks}


BUFFER_FLAT = 1.05  # the window's compute buffer may move this much between declared contexts


def buffer_checks(rows: list[dict]) -> list[dict]:
    """What gate e holds 0089 to: at every declared context the window's CUDA0 compute buffer is at most upstream's,
    and it is the same at every context (it follows the cells in use, not the declared context). A buffer that was
    not measured meets nothing."""
    checks = [{"check": f"window buffer at most upstream's at ctx {r['ctx']}", "window_mib": r.get("window_mib"),
               "upstream_mib": r.get("upstream_mib"),
               "met": r.get("window_mib") is not None and r.get("upstream_mib") is not None
               and r["window_mib"] <= r["upstream_mib"]} for r in rows]
    ws = [r.get("window_mib") for r in rows]
    flat = bool(ws) and all(w is not None for w in ws) and max(ws) <= BUFFER_FLAT * min(ws)
    checks.append({"check": f"window buffer the same at every context (within {BUFFER_FLAT - 1:.0%})",
                   "window_mib": ws, "met": flat})
    return checks


# (f) ---------------------------------------------------------------------------------------------------------
def gate_f(a: argparse.Namespace, model: Path, work: Path) -> dict:
    """Where a decoded token's time goes with a host tail: the scheduler's splits and compute buffers (the reserve's
    summary) and per-token time against the bytes of used tail read (a linear fit: fixed cost + bytes / bandwidth),
    and, with a fully resident point beside them, the sum model against the max model (gates.tail_models)."""
    out: dict = {"link": link_bandwidth()}
    prompt = work / "prompt-f.txt"
    prompt.write_text(make_text(1600, 13))
    builds = [("after", a.full_bin, {})] + ([("before", a.before_bin, a.before_env)] if a.before_bin else [])
    missing: list[str] = []  # what was not measured: the gate measures, and passes only when it measured it all
    for name, b, benv in builds:
        # the reserve's summary with a 256-cell window (its last graph line is the context's: splits of the prefill
        # graph and of the one-token decode graph) and the compute buffers per backend
        r = run(f"f-sched-{name}", completion(b, model, 4096, prompt, 2, ["--kv-residency-mode", "window", "-fit", "off"]),
                work, env={WINDOW_ENV: "256", **benv})
        out[f"sched_{name}"] = {"rc": r["rc"], **(r["graphs"][-1] if r["graphs"] else {"graph_line": "not printed"}),
                                "compute_buffers_mib": r["compute_buffers_mib"]}
        if r["rc"] != 0 or not r["graphs"]:
            missing.append(f"{name}: the reserve's summary (rc {r['rc']})")
        # per-token decode time against the used tail (fixed prompt, growing tail share)
        pts = []
        prompt_d = work / "prompt-d.txt"
        if not prompt_d.is_file():
            prompt_d.write_text(make_text(a.curve_words, 5))
        for cells in [*a.fit_windows, a.curve_ctx]:  # the last one holds the whole prompt: no tail
            r = run(f"f-fit-{name}-{cells}", completion(b, model, a.curve_ctx, prompt_d, 32,
                    ["--kv-residency-mode", "window", "-fit", "off"]), work, env={WINDOW_ENV: str(cells), **benv})
            if r.get("decode_ms_per_token") and r.get("prompt_tokens"):
                used_tail = max(0, r["prompt_tokens"] + 16 - r.get("device_cells", cells))  # past the device part
                pts.append({"window": cells, "tail_mib_read_per_token": round(used_tail * KV_BYTES_PER_CELL / MIB, 1),
                            "ms_per_token": round(r["decode_ms_per_token"], 3)})
            else:
                missing.append(f"{name}: the decode at window {cells} (rc {r['rc']})")
        tailed = [p for p in pts if p["tail_mib_read_per_token"] > 0]
        out[f"fit_{name}"] = {"points": tailed, **linear_fit(tailed)}
        # the sum model against the max model, with the resident point (gates.tail_models)
        out[f"models_{name}"] = tail_models.compare(tail_models.gate_f_points({"points": pts}))
    if missing:
        log("breakdown: not measured: " + "; ".join(missing))
    return {"pass": not missing, "not_measured": missing, **out}


# (g) ---------------------------------------------------------------------------------------------------------
BUDGET_FIELDS = ["ctx", "budget_mib", "config", "device_mib_peak", "prefill_tps", "decode_tps", "fits_budget",
                 "vram_target_mib", "resident_cells", "device_cells", "kv_ctx", "prompt_tokens", "rc", "note"]


def budget_rows(ctx: int, budgets: list[int], config: str, r: dict, kv_ctx: int, target: int | None = None) -> list[dict]:
    """One measured run as budget-curve rows. An upstream run has one footprint, so it gets a row at every budget:
    with its figures where its device peak fits the budget, 'does not fit' where it does not. A window run was
    sized for one budget (target is its --vram-target) and gets that budget's row."""
    win = r.get("window") or {}
    peak = r.get("device_mib_peak")
    if "-nkvo" in config:
        cells = 0
    elif config.startswith("upstream") or r.get("fully_resident"):
        cells = kv_ctx
    else:
        cells = win.get("resident", "")
    base = {"ctx": ctx, "config": config, "device_mib_peak": peak, "vram_target_mib": target if target else "",
            "resident_cells": cells, "device_cells": r.get("device_cells", ""), "kv_ctx": kv_ctx,
            "prompt_tokens": r.get("prompt_tokens"), "rc": r.get("rc")}
    booted = r.get("rc") == 0 and bool(r.get("decode_tps"))
    out = []
    for b in budgets if target is None else [budgets[0]]:
        fits = booted and peak is not None and peak <= b
        note = "" if fits else ("did not boot" if not booted else "does not fit")
        out.append(base | {"budget_mib": b, "fits_budget": fits, "prefill_tps": r.get("prefill_tps") if fits else "",
                           "decode_tps": r.get("decode_tps") if fits else "", "note": note})
    return out


def budget_goals(rows: list[dict], share: float = 0.95, nkvo_factor: float = 10.0) -> list[dict]:
    """The goal at every (ctx, budget): where an upstream configuration that declares the whole context fits, the
    best window configuration that fits reaches `share` of its decode and prefill; where only upstream -nkvo fits,
    the window decodes `nkvo_factor` times faster. Upstream sized to the prompt is a reference, not a goal."""
    goals = []
    for ctx, b in sorted({(r["ctx"], r["budget_mib"]) for r in rows}):
        at = [r for r in rows if r["ctx"] == ctx and r["budget_mib"] == b and r["fits_budget"]]
        ups = [r for r in at if r["config"].startswith("upstream") and "-nkvo" not in r["config"]
               and r["kv_ctx"] == ctx]
        nkvo = [r for r in at if r["config"].startswith("upstream") and "-nkvo" in r["config"]]
        wins = [r for r in at if r["config"].startswith("window")]
        g: dict = {"ctx": ctx, "budget_mib": b}
        if ups:
            ref = max(ups, key=lambda r: float(r["decode_tps"]))
            g["reference"] = ref["config"]
            best = max(wins, key=lambda r: min(float(r["decode_tps"]) / float(ref["decode_tps"]),
                                               float(r["prefill_tps"]) / float(ref["prefill_tps"])), default=None)
            if best:
                g |= {"best_window": best["config"],
                      "decode_ratio": round(float(best["decode_tps"]) / float(ref["decode_tps"]), 3),
                      "prefill_ratio": round(float(best["prefill_tps"]) / float(ref["prefill_tps"]), 3)}
                g["met"] = g["decode_ratio"] >= share and g["prefill_ratio"] >= share
            else:
                g |= {"best_window": None, "met": False}
            g["goal"] = f"best window >= {share} x {ref['config']} in decode and prefill"
        elif nkvo:
            ref = nkvo[0]
            g["reference"] = ref["config"]
            best = max(wins, key=lambda r: float(r["decode_tps"]), default=None)
            g["goal"] = f"best window >= {nkvo_factor:g} x {ref['config']} decode"
            if best:
                g |= {"best_window": best["config"],
                      "decode_ratio": round(float(best["decode_tps"]) / float(ref["decode_tps"]), 2)}
                g["met"] = g["decode_ratio"] >= nkvo_factor
            else:
                g |= {"best_window": None, "met": False}
        else:
            best = max(wins, key=lambda r: float(r["decode_tps"]), default=None)
            g |= {"goal": "none (no upstream configuration fits)", "met": None,
                  "best_window": best["config"] if best else None}
        goals.append(g)
    return goals


def write_budget_csv(path: Path, rows: list[dict], measured: Collection[int | tuple[int, int]]) -> list[dict]:
    """Write the rows, keeping the rows an earlier call wrote there at the points this call does not measure: a
    context in `measured` replaces all of that context's rows, a (ctx, budget) pair only that budget's, so a curve
    too long for one call is measured a few budgets a call (every row of a point comes from one call)."""
    kept: list[dict] = []
    if path.is_file():
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                ctx, budget = int(r["ctx"]), int(r["budget_mib"])
                if ctx not in measured and (ctx, budget) not in measured:
                    kept.append(r | {"ctx": int(r["ctx"]), "budget_mib": int(r["budget_mib"]),
                                     "kv_ctx": int(r["kv_ctx"]) if r["kv_ctx"] else r["kv_ctx"],
                                     "fits_budget": r["fits_budget"] == "True"})
    allrows = sorted(kept + rows, key=lambda r: (r["ctx"], r["budget_mib"], r["config"]))
    text = io.StringIO()
    wr = csv.DictWriter(text, fieldnames=BUDGET_FIELDS)
    wr.writeheader()
    wr.writerows(allrows)
    write_whole(path, text.getvalue())  # the rows of other points an earlier call wrote survive a cut here too
    return allrows


# the window configurations of the budget curve: each cache type, and F16 without the prefill copy's room (the room is
# F16's alone: flash attention converts quantized K/V to F16 copies of its own)
WINDOW_CONFIGS = ("window f16", "window f16 --no-kv-prefill-copy", "window q8_0", "window q4_0")


def window_config(config: str) -> tuple[str, list[str]]:
    """The cache type and the extra command-line arguments of a window configuration's name."""
    words = config.split()
    if len(words) < 2 or words[0] != "window" or any(not w.startswith("--") for w in words[2:]):
        raise ValueError(f"not a window configuration: {config!r}")
    return words[1], words[2:]


# the overhead outside the sizer's view where no calibration run's target bound its window (the thirty-third round's
# measured overheads: 436-488 MiB, with and without the tail ring's chunks)
CALIBRATION_DEFAULT_MIB = 600


def target_bound(r: dict) -> bool:
    """The run's window kept a host tail: its sizer stopped at the target, not at the context (a window that held the
    whole context would have held no more under a larger target, and its peak is the cache's, not the target's)."""
    return bool((r.get("window") or {}).get("tail"))


def calibration_binds(r: dict) -> bool:
    """A calibration run measures the overhead outside the sizer only where it booted, its target bound the window
    (target_bound) and it reached a peak."""
    return r.get("rc") == 0 and target_bound(r) and bool(r.get("device_mib_peak"))


def refit(budget: int, target: int, r: dict, margin: int, again: Callable[[int], dict]) -> tuple[int, dict, str]:
    """A window run whose measured peak went over its budget runs once more, with the target lowered by the excess
    and `margin` (the overhead outside the sizer moves by a few tens of MiB between runs): the second run is kept when
    it boots, decodes and its own peak fits, else the first (which the row then records as not fitting). In the
    thirty-fourth round a calibration run that held the whole context under-counted the overhead (196 MiB), which put
    every f16 window at 1M and 11,000 MiB 194 MiB over its budget, and nothing lowered it. Returns the target, the run
    kept and a note (empty where nothing ran)."""
    peak = r.get("device_mib_peak") or 0
    if r.get("rc") != 0 or not peak or peak <= budget:
        return target, r, ""
    t2 = target - (peak - budget) - margin
    if t2 <= 0:
        return target, r, ""
    r2 = again(t2)
    if second_run_fits(r2, budget):
        return t2, r2, f"lowered from --vram-target {target} (peak {peak} MiB)"
    return target, r, f"lowered to --vram-target {t2}, not kept ({why_not_kept(r2)})"


def refill(budget: int, target: int, r: dict, keep: int | None, again: Callable[[int], dict]) -> tuple[int, dict, str]:
    """A window run whose measured peak left more than `keep` MiB of its budget runs once more, with the target
    raised by what was left less `keep` (the largest target the measured overhead allows): the second run is kept
    when it boots and its own peak fits the budget, else the first. Returns the target, the run kept and a note for
    the row (empty where nothing was tried). keep None, or a peak not measured (0), tries nothing; nor does a run
    whose window held the whole context (not target_bound)."""
    peak = r.get("device_mib_peak") or 0
    if keep is None or r.get("rc") != 0 or not peak or budget - peak <= keep or not target_bound(r):
        return target, r, ""
    t2 = target + (budget - peak) - keep
    r2 = again(t2)
    if second_run_fits(r2, budget):
        return t2, r2, f"refilled from --vram-target {target} (peak {peak} MiB)"
    return target, r, f"refill to --vram-target {t2} not kept ({why_not_kept(r2)})"


def second_run_fits(r2: dict, budget: int) -> bool:
    """A window run tried at another target is kept when it booted, decoded and its own measured peak fits."""
    peak2 = r2.get("device_mib_peak") or 0
    return r2.get("rc") == 0 and bool(r2.get("decode_tps")) and 0 < peak2 <= budget


def why_not_kept(r2: dict) -> str:
    return f"peak {r2.get('device_mib_peak') or 'not measured'} MiB, rc {r2.get('rc')}"


# the sizer's step: 0071 aligns a window down to a multiple of this many cells (OPENCOTI_KV_WINDOW_ALIGN)
WINDOW_ALIGN_CELLS = 256


def whole_prompt_target(target: int, r: dict, need: int) -> int | None:
    """The --vram-target whose window would hold `need` cells (the prompt and the tokens decoded after it), where the
    run r kept fewer: r's target raised by the missing cells at r's own bytes per cell (its host tail's MiB over its
    cells, as its window line logs them, plus 0089's compute bytes per cell of attention span), rounded up to a MiB.
    The cells asked for are `need` aligned up to the sizer's step (0071 aligns its window down to
    WINDOW_ALIGN_CELLS) and one step more: those bytes per cell fall a little short of what the sizer counts (the
    thirty-fourth round: 29 MiB more target, estimated to hold 7,355 more cells of f16, held 7,168: 35,072 of the
    35,259 asked for). None where r held them, logged no window, or did not boot."""
    w = r.get("window") or {}
    if r.get("rc") != 0 or not target_bound(r) or w["resident"] >= need:
        return None
    cells = -(-need // WINDOW_ALIGN_CELLS) * WINDOW_ALIGN_CELLS + WINDOW_ALIGN_CELLS
    per_cell = w["tail_mib"] * MIB / w["tail"] + (r.get("span_cell_bytes") or 0)
    return target + -(-int((cells - w["resident"]) * per_cell) // MIB)


def refill_whole(budget: int, target: int, r: dict, need: int, again: Callable[[int], dict]) -> tuple[int, dict, str]:
    """A window run that kept part of the prompt in its host tail runs once more at the target whose window would hold
    the prompt whole (whole_prompt_target), and that run is kept when it boots, decodes and its own peak fits the
    budget. The peak is not monotonic in the target: a window that reads a large tail (2.5 MiB of K and V a layer or
    more) also holds the tail ring's staging chunks in device memory (3 x 16 MiB, outside the compute buffer), so a
    target that leaves little or no tail to read can fit a budget that a smaller one filled (the thirty-third round:
    at 1M and 2,300 MiB, f16 peaked at the whole budget with 1,200 cells of the prompt in its tail, and 18 MiB more
    target had held all but 187 at 2,270 MiB). Returns the target, the run kept and a note (empty where nothing ran)."""
    t2 = whole_prompt_target(target, r, need)
    if t2 is None or not r.get("device_mib_peak"):  # held it, or no peak to judge a second run's fit beside
        return target, r, ""
    r2 = again(t2)
    if second_run_fits(r2, budget):
        return t2, r2, (f"the whole prompt asked for: --vram-target {t2} kept (from {target}, "
                        f"peak {r2['device_mib_peak']} MiB)")
    return target, r, f"the whole prompt asked for: --vram-target {t2} not kept ({why_not_kept(r2)})"


def gate_g(a: argparse.Namespace, model: Path, work: Path, outdir: Path) -> dict:
    """The budget curve at a declared context: every configuration a user could run, at device-memory budgets
    from the smallest a window boots in to fully resident. A budget is the device memory the process may use, as
    nvidia-smi reports it (CUDA context included); window runs get --vram-target = budget - the overhead outside the
    sizer's view (CUDA context, pools), measured by a first run; each row records the peak it really reached."""
    prompt = work / "prompt-d.txt"
    prompt.write_text(make_text(a.curve_words, 5))
    n = a.curve_n
    rows: list[dict] = []
    refs: dict = {}
    csv_path, meta_path = outdir / "budget_curve.csv", outdir / "budget_curve.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    meta["complete"] = False  # until the last row: a run cut short (a call's time limit) keeps what it measured
    write_whole(meta_path, json.dumps(meta, indent=2))

    allrows: list[dict] = []  # this call's rows with the other contexts' rows the CSV already held, as written

    # the points this call measures: the rows of the CSV's other points (other contexts, other budgets) are kept
    points = {(ctx, b) for ctx in a.budget_ctxs for b in (a.budgets_1m if ctx > 131072 else a.budgets_128k)}

    def measured(new: list[dict]) -> None:
        rows.extend(new)
        allrows[:] = write_budget_csv(csv_path, rows, points)

    for ctx in a.budget_ctxs:
        budgets = sorted(a.budgets_1m if ctx > 131072 else a.budgets_128k)
        ups = {}
        for cache in ("f16", "q8_0", "q4_0"):
            ups[cache] = run(f"g-upstream-{cache}-{ctx}", completion(a.upstream_bin, model, ctx, prompt, n, [], cache),
                             work, measure=True)
            measured(budget_rows(ctx, budgets, f"upstream {cache}", ups[cache], ctx))
        r = run(f"g-upstream-nkvo-{ctx}", completion(a.upstream_bin, model, ctx, prompt, n, ["-nkvo"]), work,
                measure=True)
        measured(budget_rows(ctx, budgets, "upstream f16 -nkvo", r, ctx))
        n_prompt = next((u["prompt_tokens"] for u in [*ups.values(), r] if u.get("prompt_tokens")), 0)
        # the overhead outside the sizer's view, from a window run at a target in the middle of the range; a run whose
        # window held the whole context did not fill its target (its peak says nothing of the overhead), so the
        # smallest budget's target is tried next, and where no target binds the default overhead stands
        overhead, refs[ctx] = CALIBRATION_DEFAULT_MIB, {"prompt_tokens": n_prompt}
        for t0 in dict.fromkeys((budgets[len(budgets) // 2] - 600, budgets[0] - 600)):
            cal = run(f"g-calibrate-{ctx}-{t0}", completion(a.full_bin, model, ctx, prompt, n,
                      ["--kv-residency-mode", "window", "-fit", "off", "--vram-target", str(t0)]), work,
                      measure=True)
            refs[ctx] |= {"calibration_target_mib": t0, "calibration_peak_mib": cal.get("device_mib_peak")}
            if calibration_binds(cal):
                overhead = cal["device_mib_peak"] - t0
                break
            refs[ctx].setdefault("calibration_not_binding", []).append(t0)
        refs[ctx]["overhead_mib"] = overhead
        log(f"budget curve: ctx {ctx}, overhead outside the sizer {overhead} MiB")
        for b in budgets:
            for config in WINDOW_CONFIGS:
                cache, extra = window_config(config)
                t = b - overhead - a.budget_margin  # the overhead moves by a few tens of MiB between runs
                tag = f"g-{config.replace(' ', '-').replace('--', '')}-{ctx}-{b}"

                def window_run(target: int, suffix: str = "", cache: str = cache, extra: list = extra,
                               tag: str = tag, ctx: int = ctx) -> dict:
                    return run(tag + suffix, completion(a.full_bin, model, ctx, prompt, n,
                               ["--kv-residency-mode", "window", "-fit", "off", "--vram-target", str(target), *extra],
                               cache), work, measure=True)

                r = window_run(t)
                t, r, lowered = refit(b, t, r, a.budget_margin, lambda t2: window_run(t2, "-lower"))
                keep = a.budget_refill if a.budget_refill >= 0 else None
                t, r, note = refill(b, t, r, keep, lambda t2: window_run(t2, "-refill"))
                note = "; ".join(x for x in (lowered, note) if x)
                if keep is not None and r.get("prompt_tokens"):
                    # the prompt and the tokens gate h decodes after it (its repeats run at this target)
                    need = r["prompt_tokens"] + max(n, a.repeat_n)
                    t, r, whole = refill_whole(b, t, r, need, lambda t2: window_run(t2, "-whole"))
                    note = "; ".join(x for x in (note, whole) if x)
                row = budget_rows(ctx, [b], config, r, ctx, target=t)
                if note:
                    row[0]["note"] = (row[0]["note"] + "; " if row[0]["note"] else "") + note
                measured(row)
                log(f"budget curve: {row[0]}")
    # references: upstream with ctx sized to the prompt (the context a user would declare for this prompt alone)
    n_prompt = max((v["prompt_tokens"] or 0) for v in refs.values()) if refs else 0
    if n_prompt:
        sized = (n_prompt + n + 1023) // 1024 * 1024
        for cache in ("f16", "q8_0", "q4_0"):
            r = run(f"g-sized-{cache}", completion(a.upstream_bin, model, sized, prompt, n, [], cache), work,
                    measure=True)
            for ctx in a.budget_ctxs:
                budgets = sorted(a.budgets_1m if ctx > 131072 else a.budgets_128k)
                measured(budget_rows(ctx, budgets, f"upstream {cache} ctx sized to the prompt", r, sized))
    goals = budget_goals(allrows)
    meta.setdefault("contexts", {}).update({str(k): v for k, v in refs.items()})
    # where each point's rows came from, kept per point: a CSV assembled over several calls (other budgets, other
    # cards, other builds) says for every point which call measured it
    call = {"measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": getattr(a, "device", []),
            "compilers": getattr(a, "compilers", {}), "upstream": upstream_note(a) or "an upstream build"}
    if a.record_raw:  # where the caller will keep this call's result (gpu_gates.json) beside the curve
        call["raw"] = a.record_raw
    for ctx, b in sorted(points):
        meta.setdefault("points", {})[f"{ctx} {b}"] = call | {"calibration": refs.get(ctx)}
    meta |= {"decode_n": n, "goals": goals, "complete": True}
    write_whole(meta_path, json.dumps(meta, indent=2))
    # the gate passes when every upstream run booted (the card holds each of them) and every budget has a window run
    # that booted and fit it (a curve point without one measured nothing of the window); the goal is reported, not
    # gated
    empty = windowless_points(rows)
    for ctx, b in empty:
        log(f"budget curve: ctx {ctx}, {b} MiB: no window configuration booted within the budget")
    return {"pass": all(r["rc"] == 0 for r in rows if r["config"].startswith("upstream")) and not empty,
            "csv": str(csv_path), "contexts": refs, "goals": [g for g in goals if g["ctx"] in a.budget_ctxs],
            "budgets_without_a_window": [{"ctx": c, "budget_mib": b} for c, b in empty]}


def windowless_points(rows: list[dict]) -> list[tuple[int, int]]:
    """The (ctx, budget) points of a budget curve where no window configuration booted and fit the budget."""
    points = sorted({(r["ctx"], r["budget_mib"]) for r in rows if r["config"].startswith("window")})
    return [(c, b) for c, b in points if not any(r["ctx"] == c and r["budget_mib"] == b and r["fits_budget"]
                                                 and r["config"].startswith("window") for r in rows)]


def read_budget_csv(path: Path) -> list[dict]:
    """budget_curve.csv as budget_goals reads it (numbers and booleans typed back)."""
    with open(path, newline="") as f:
        return [r | {"ctx": int(r["ctx"]), "budget_mib": int(r["budget_mib"]),
                     "kv_ctx": int(r["kv_ctx"]) if r["kv_ctx"] else r["kv_ctx"], "fits_budget": r["fits_budget"] == "True"}
                for r in csv.DictReader(f)]


# gate h: a curve's single run within this much above its bound does not decide the point (single runs of one
# configuration spread by up to about 10 %: Gemma's resident decode 845-942 tok/s in the thirty-third round), so gate
# h repeats it as it repeats a miss
REPEAT_NEAR = 0.1


def missed_goal_points(rows: list[dict], share: float = 0.95, near: float = REPEAT_NEAR) -> list[dict]:
    """The (ctx, budget) points of a budget curve whose goal an upstream configuration sets and whose best window
    misses it in prefill or in decode, or meets it by less than `near`: the reference configuration, the best window
    configuration and its --vram-target, and whether the curve's run met the goal."""
    points = []
    for g in budget_goals(rows, share):
        if g.get("prefill_ratio") is None or not g.get("best_window"):
            continue
        if min(g["prefill_ratio"], g["decode_ratio"]) >= share + near:
            continue
        win = next(r for r in rows if r["ctx"] == g["ctx"] and r["budget_mib"] == g["budget_mib"]
                   and r["config"] == g["best_window"])
        points.append({"kind": "goal", "ctx": g["ctx"], "budget_mib": g["budget_mib"], "reference": g["reference"],
                       "reference_ctx": g["ctx"], "window": g["best_window"],
                       "vram_target_mib": int(win["vram_target_mib"]), "bound": share, "metrics": ["prefill_tps", "decode_tps"],
                       "curve_prefill_ratio": g["prefill_ratio"], "curve_decode_ratio": g["decode_ratio"],
                       "curve_met": bool(g["met"]), "windows": fitting_windows(rows, g["ctx"], g["budget_mib"])})
    return points


def fitting_windows(rows: list[dict], ctx: int, budget: int) -> list[dict]:
    """Every window configuration of a budget curve that fits (ctx, budget), with its --vram-target: the candidates
    for a point's best window, which gate h judges on medians (a single run's pick swings with the run)."""
    return [{"config": r["config"], "vram_target_mib": int(r["vram_target_mib"])} for r in rows
            if r["ctx"] == ctx and r["budget_mib"] == budget and r["fits_budget"] and r["config"].startswith("window")
            and str(r["vram_target_mib"]).isdigit()]


def same_type_points(rows: list[dict], share: float = 0.95) -> list[dict]:
    """Issue 21's item 1 on a budget curve: at each context's largest budget, each quantized window configuration that
    holds the whole prompt in device memory against upstream resident with the same cache type (decode)."""
    points = []
    for ctx in sorted({r["ctx"] for r in rows}):
        b = max(r["budget_mib"] for r in rows if r["ctx"] == ctx)
        at = {r["config"]: r for r in rows if r["ctx"] == ctx and r["budget_mib"] == b and r["fits_budget"]}
        for cache in ("q8_0", "q4_0"):
            win, ref = at.get(f"window {cache}"), at.get(f"upstream {cache}")
            if not win or not ref or not win["prompt_tokens"] or not str(win["resident_cells"]).isdigit():
                continue
            if int(win["resident_cells"]) < int(win["prompt_tokens"]):
                continue  # part of the prompt in the tail: not item 1's comparison
            points.append({"kind": "same type", "ctx": ctx, "budget_mib": b, "reference": ref["config"],
                           "reference_ctx": ctx, "window": win["config"], "vram_target_mib": int(win["vram_target_mib"]),
                           "bound": share, "metrics": ["decode_tps"],
                           "curve_decode_ratio": round(float(win["decode_tps"]) / float(ref["decode_tps"]), 3)})
    return points


def prompt_sized_points(rows: list[dict], share: float = 0.9, ctx_from: int = 1048576,
                        near: float = REPEAT_NEAR) -> list[dict]:
    """Issue 21's item 3 on a budget curve: at contexts from ctx_from, the budgets where upstream f16 with ctx sized
    to the prompt fits and the best window (by decode) decodes less than `share` + `near` of it (a miss, or a
    single run too close to the bound to decide it; `curve_met` says which)."""
    points = []
    for ctx, b in sorted({(r["ctx"], r["budget_mib"]) for r in rows if r["ctx"] >= ctx_from}):
        at = [r for r in rows if r["ctx"] == ctx and r["budget_mib"] == b and r["fits_budget"]]
        ref = next((r for r in at if r["config"] == "upstream f16 ctx sized to the prompt"), None)
        wins = [r for r in at if r["config"].startswith("window")]
        if not ref or not wins:
            continue
        best = max(wins, key=lambda r: float(r["decode_tps"]))
        ratio = round(float(best["decode_tps"]) / float(ref["decode_tps"]), 3)
        if ratio >= share + near:
            continue
        points.append({"kind": "prompt-sized", "ctx": ctx, "budget_mib": b, "reference": ref["config"],
                       "reference_ctx": int(ref["kv_ctx"]), "window": best["config"],
                       "vram_target_mib": int(best["vram_target_mib"]), "bound": share, "metrics": ["decode_tps"],
                       "curve_decode_ratio": ratio, "curve_met": ratio >= share,
                       "windows": fitting_windows(rows, ctx, b)})
    return points


def repeat_points(rows: list[dict], near: float = REPEAT_NEAR) -> list[dict]:
    """Every point of a budget curve whose target a single run missed or met by less than `near`, and every pair
    that issue 21's item 1 compares."""
    return (missed_goal_points(rows, near=near) + same_type_points(rows)
            + prompt_sized_points(rows, near=near))


def run_facts(r: dict) -> dict:
    """What a repeated run's log said about where its cache lived, kept beside its rates so that a point's result can
    be explained from the JSON alone (the logs stay on the machine that ran them): the peak it reached, the cells its
    window held (all: fully resident; none: a run without a window), the cells every K/V tensor held in device memory,
    the tail cells, the carry trial's decision and the last reserve's CUDA0 compute buffer."""
    w = r.get("window") or {}
    return {"device_mib_peak": r.get("device_mib_peak"),
            "window_cells": w.get("resident", "all" if r.get("fully_resident") else None),
            "tail_cells": w.get("tail"), "device_cells": r.get("device_cells"),
            "carry_trials": r.get("carry_trials") or [],
            "compute_mib": (r.get("compute_buffers_mib") or {}).get("CUDA0")}


def gate_h(a: argparse.Namespace, model: Path, work: Path, outdir: Path | None = None) -> dict:
    """Budget-curve points repeated (gates.gpu.repeat_points): the goals a single run missed (prefill or decode), each
    fully resident quantized window against upstream resident of its type, and the 1M budgets where the window missed
    0.9 of upstream f16 sized to the prompt. At each point, in --repeat-reps interleaved rounds (each configuration
    leads in turn) with --repeat-n decoded tokens: the upstream reference and the window configuration at the
    --vram-target the curve gave it; at a missed goal also the reference's cache type in the full build's head mode
    (upstream's code path in the patched build: what the build costs apart from the window) and that with -fit off
    (the window runs' flag). Where the target is the best window's (a missed goal, a prompt-sized miss), every window
    configuration that fit the point on the curve runs, each at its own --vram-target, and the best is chosen on the
    medians (the configuration whose worst ratio over the point's metrics is highest), not on the curve's single run.
    Medians, ratios of medians to the reference, each point's target met or not. With outdir, OUTDIR/h_repeats.json
    holds the points finished so far after each one ("complete": false until the last), so a run cut short (a call's
    time limit) keeps what it measured."""
    points = repeat_points(read_budget_csv(a.repeat_csv), near=a.repeat_near)
    partial = outdir / "h_repeats.json" if outdir else None

    def keep(done: list[dict]) -> None:
        if partial:
            write_whole(partial, json.dumps({"complete": len(done) == len(points), "points_done": len(done),
                                             "points_total": len(points), "reps": a.repeat_reps,
                                             "decode_n": a.repeat_n, "points": done}, indent=2))

    keep([])
    prompt = work / "prompt-d.txt"
    prompt.write_text(make_text(a.curve_words, 5))
    n = a.repeat_n
    # one discarded run first: the first prefill after the GPU idled is the slowest of a call
    run("h-warmup", completion(a.upstream_bin, model, 36864, prompt, n, []), work)
    out = []
    for pt in points:
        ctx, ref_cache = pt["ctx"], pt["reference"].split()[1]
        ref_ctx = pt["reference_ctx"]
        configs = [("reference", completion(a.upstream_bin, model, ref_ctx, prompt, n, [], ref_cache))]
        if pt["kind"] == "goal":
            configs += [
                ("head", completion(a.full_bin, model, ctx, prompt, n, ["--kv-residency-mode", "head"], ref_cache)),
                ("head -fit off", completion(a.full_bin, model, ctx, prompt, n,
                                             ["--kv-residency-mode", "head", "-fit", "off"], ref_cache))]
        windows = pt.get("windows") or [{"config": pt["window"], "vram_target_mib": pt["vram_target_mib"]}]
        for w in windows:
            cache, extra = window_config(w["config"])
            configs.append((w["config"], completion(a.full_bin, model, ctx, prompt, n, [
                "--kv-residency-mode", "window", "-fit", "off", "--vram-target", str(w["vram_target_mib"]), *extra],
                cache)))
        runs: dict = {name: [] for name, _ in configs}
        for rep in range(a.repeat_reps):
            for name, argv in configs[rep % len(configs):] + configs[:rep % len(configs)]:
                tag = f"h-{pt['kind'].replace(' ', '')}-{ctx}-{pt['budget_mib']}-{name.replace(' ', '')}-{rep}"
                r = run(tag, argv, work, measure=True)
                runs[name].append(strip(r))
        med = {name: {k: statistics.median([r[k] for r in rs if r.get(k)] or [0])
                      for k in ("prefill_tps", "decode_tps", "device_mib_peak")} for name, rs in runs.items()}
        ref = med["reference"]
        ratio = {name: {k: round(m[k] / ref[k], 3) if ref[k] else None for k in ("prefill_tps", "decode_tps")}
                 for name, m in med.items()}
        # every repeated run of each configuration within the point's budget
        fits = {name: all((r.get("device_mib_peak") or 1e9) <= pt["budget_mib"] for r in rs) for name, rs in runs.items()}
        # the best window on the medians: among those that stayed within the budget, the highest worst ratio over the
        # point's metrics (ties: the curve's pick)
        best = max((w["config"] for w in windows),
                   key=lambda c: (fits[c], min(ratio[c][k] or 0 for k in pt["metrics"]), c == pt["window"]))
        cells = run_facts(runs[best][-1])["window_cells"]
        row = pt | {"decode_n": n, "medians": med, "ratios_to_reference": ratio, "best_window": best, "window_cells": cells,
                    "samples": {name: [(r.get("prefill_tps"), r.get("decode_tps")) for r in rs] for name, rs in runs.items()},
                    "runs": {name: [run_facts(r) for r in rs] for name, rs in runs.items()},
                    "window_fits_budget": fits[best],
                    "rc": {name: [r["rc"] for r in rs] for name, rs in runs.items()}}
        for k in ("prefill_tps", "decode_tps"):
            row[f"{k.split('_')[0]}_goal_met"] = ((ratio[best][k] or 0) >= pt["bound"]) if k in pt["metrics"] else None
        row["met"] = all(row[f"{k.split('_')[0]}_goal_met"] for k in pt["metrics"])
        log(f"repeat ({pt['kind']}): ctx {ctx} budget {pt['budget_mib']} {best} (of {len(windows)} window "
            f"configuration(s); the curve's pick: {pt['window']}) against {pt['reference']}: "
            f"{json.dumps(med)} ratios {json.dumps(ratio)}: {'met' if row['met'] else 'MISSED'}")
        out.append(row)
        keep(out)
    return {"pass": bool(points) and all(rc == 0 for p in out for rcs in p["rc"].values() for rc in rcs),
            "reps": a.repeat_reps, "decode_n": n, "points": out}


def linear_fit(pts: list[dict]) -> dict:
    line = tail_models.line_fit(tail_models.gate_f_points({"points": pts}))
    if line is None:
        return {}
    fixed, slope = line
    return {"fixed_ms": round(fixed, 3), "ms_per_mib": round(slope, 5),
            "effective_gbps": round(MIB / 1e9 / (slope / 1e3), 2) if slope > 0 else None}


# the gates this program runs (--only), each reported as a part of `forktool gates` under its letter, with the key of
# its result in gpu_gates.json; the registry's 0089 gate declares the same parts (a test holds them equal)
GATES = {"a": "a_boot_repro", "b": "b_resident_unchanged", "c": "c_window_equals_resident", "d": "d_curve",
         "e": "e_compute_buffers", "f": "f_breakdown", "g": "g_budget_curve", "h": "h_repeats"}


def builds_used(a: argparse.Namespace) -> dict[str, Path]:
    """The builds the chosen gates run ({name: bin directory}), the ones checked (own libraries, compiler) before any
    gate: the series without 0089 only where gate a runs (no other gate uses it), so a machine without time for that
    build can run the others."""
    builds = {"full": a.full_bin}
    if "a" in a.only.split(","):
        builds["pre0089"] = a.pre_bin
    builds["upstream"] = a.upstream_bin
    if a.before_bin:
        builds["before"] = a.before_bin
    return builds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m gates.gpu", description=__doc__)
    ap.add_argument("--full-bin", type=Path, required=True, help="CUDA build of the whole series")
    ap.add_argument("--pre-bin", type=Path,
                    help="CUDA build of the series without 0089 (gate a's alone: required where --only holds a)")
    ap.add_argument("--upstream-bin", type=Path, required=True, help="CUDA build of unpatched upstream")
    ap.add_argument("--before-bin", type=Path, help="optional: another full-series build to compare (before a change)")
    ap.add_argument("--work", type=Path, default=Path("build/gpu-gates"))
    ap.add_argument("--out", type=Path, default=Path("build/gpu-gates/out"))
    ap.add_argument("--only", default="a,b,c,d,e")
    ap.add_argument("--boot-ctx", type=int, default=1048576)
    ap.add_argument("--leave-mib", type=int, default=12288, help="device memory the ballast leaves free")
    # many short processes: prefill on the H200 runs in two speeds that follow the machine's state in time, so the two
    # processes of a round must run close together (30 rounds of 3 repetitions checked gate b twice where 15 of 10
    # and 9 of 10 could not)
    ap.add_argument("--bench-rounds", type=int, default=30)
    ap.add_argument("--bench-max-rounds", type=int, default=60,
                    help="gate b: where a half is still not checked after --bench-rounds, more rounds up to this many")
    ap.add_argument("--bench-extend", type=int, default=15,
                    help="gate b: rounds added at each look past --bench-rounds (0: no more rounds)")
    ap.add_argument("--bench-reps", type=int, default=3)
    ap.add_argument("--bench-pp", type=int, default=2048)
    ap.add_argument("--bench-tg", type=int, default=128)
    ap.add_argument("--bench-cpus", default="4", help="taskset CPU list for llama-bench ('' = not pinned)")
    ap.add_argument("--bench-args", default="-t 1 -ub 2048 -b 2048",
                    help="more llama-bench arguments for every build of gate b (default: one thread on the one CPU "
                         "of --bench-cpus, the prompt in one ubatch, the steadiest way gates.bench_noise measured)")
    ap.add_argument("--bench-margin", type=float, default=0.05,
                    help="gate b: the builds count as equal when the interval around their median paired ratio lies "
                         "within 1 +- this (an interval reaching past it is 'not checked', one wholly outside fails)")
    ap.add_argument("--bench-confidence", type=float, default=0.9,
                    help="gate b: the least coverage of that interval (order statistics of the rounds' ratios)")
    ap.add_argument("--windows", type=int, nargs="+", default=[1024, 256])
    ap.add_argument("--windows-4k", type=int, nargs="*", default=[3072, 2048, 512],
                    help="gate c windows at a 4096-cell context")
    ap.add_argument("--window-debug", default="",
                    help="gate c: OPENCOTI_KV_DEBUG flags for the window runs, e.g. span-min (the attention span is "
                         "the window itself, so ubatches past it are split and the reserve is the window's)")
    ap.add_argument("--windows-ub1-4k", type=int, nargs="*", default=[3072],
                    help="gate c: f16 windows of the -ub 1 (decode) rows at a 4,096-cell context")
    ap.add_argument("--windows-ub1-8k", type=int, nargs="*", default=[6144, 7680],
                    help="gate c: windows of the quantized caches' -ub 1 (decode) rows at an 8,192-cell context")
    ap.add_argument("--c-cpu-reference", nargs="*", default=["q4_0"], metavar="CACHE",
                    help="gate c: for these cache types' -ub 1 rows, also the KLD of resident and of each window on "
                         "the GPU against the CPU backend (-ngl 0); a row that misses the bound against resident "
                         "passes within the kernel's own spread (minutes per type; default q4_0)")
    ap.add_argument("--c-sized-ub1-8k", type=int, nargs="*", default=[6000], metavar="CELLS",
                    help="gate c: sized decode rows of the quantized caches at 8,192 cells, each under the "
                         "--vram-target that sizes a window of about CELLS cells (the granule hand-back)")
    ap.add_argument("--c-decode-only", action="store_true",
                    help="gate c: only the -ub 1 rows (every token a decode: the vector kernel and the tail's merges)")
    ap.add_argument("--windows-3k", type=int, nargs="*", default=[2560, 1024],
                    help="gate c: windows at 3,072 cells (f16 tensors of 1.5 granules)")
    ap.add_argument("--quant-caches", nargs="*", default=["q8_0", "q4_0"],
                    help="gate c: quantized K/V types, each window against resident of the same type")
    ap.add_argument("--windows-16k", type=int, nargs="*", default=[12288, 8192, 512],
                    help="gate c windows of the quantized caches at a 16,384-cell context")
    ap.add_argument("--before-copy", action="store_true",
                    help="without --before-bin: compare against the full build's copying tail path "
                         "(OPENCOTI_KV_DEBUG=copy-tail) as 'before'")
    ap.add_argument("--compare-debug", default="",
                    help="without --before-bin: compare against the full build with these OPENCOTI_KV_DEBUG flags "
                         "as 'before' (e.g. no-tail-segments or no-tail-ring: gates d, e and f then measure both paths in "
                         "one call)")
    ap.add_argument("--curve-ctx", type=int, default=131072)
    ap.add_argument("--curve-words", type=int, default=30000)
    ap.add_argument("--curve-n", type=int, default=64)
    ap.add_argument("--shares", type=float, nargs="+",
                    default=[0.01, 0.03, 0.06, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 1.0])
    ap.add_argument("--before-shares", type=float, nargs="*", default=[0.5, 1.0])
    ap.add_argument("--target-reps", type=int, default=3,
                    help="runs (interleaved) of the target points: about 50 %% and the largest tail share, -nkvo")
    ap.add_argument("--small-tail-reps", type=int, default=15,
                    help="runs of the small tail and of fully resident (item 3's 0.9 target), interleaved in pairs: "
                         "--target-reps of them with the other points, the rest as pairs after them (a pair takes "
                         "seconds, and the runs swing by about 0.1 each side of 0.9)")
    ap.add_argument("--targets", type=int, nargs="*", default=[2300, 2100, 1900, 1700], help="--vram-target rows")
    ap.add_argument("--buffer-ctxs", type=int, nargs="+", default=[131072, 524288, 1048576])
    ap.add_argument("--fit-windows", type=int, nargs="+", default=[256, 12288, 24576])
    ap.add_argument("--budget-ctxs", type=int, nargs="+", default=[131072, 1048576], help="gate g: declared contexts")
    ap.add_argument("--repeat-csv", type=Path, default=Path("docs/gpu/budget_curve.csv"),
                    help="gate h: the budget curve whose points are repeated (gates.gpu.repeat_points)")
    ap.add_argument("--repeat-reps", type=int, default=3, help="gate h: runs of each configuration at each point")
    ap.add_argument("--repeat-near", type=float, default=REPEAT_NEAR,
                    help="gate h: also repeat the points whose single curve run met its bound by less than this "
                         "(0: misses only)")
    ap.add_argument("--repeat-n", type=int, default=128,
                    help="gate h: tokens decoded per run (more than the curve's, for a steadier decode figure)")
    ap.add_argument("--budget-refill", type=int, default=8, metavar="MIB",
                    help="gate g: a window run whose peak left more than MIB of its budget runs once more with its "
                         "target raised by the rest less MIB, kept when that run's peak fits; then a window that kept "
                         "part of the prompt in its tail runs once more at the target that would hold the prompt and "
                         "gate h's decoded tokens whole, kept when its peak fits (-1: neither)")
    ap.add_argument("--record-raw", default="", metavar="PATH",
                    help="gate g: where this call's gpu_gates.json will be kept (e.g. docs/gpu/gpu_gates_round36_g.json),"
                         " recorded as the raw result of every point it measures")
    ap.add_argument("--budget-margin", type=int, default=48,
                    help="gate g: MiB kept below a budget beyond the measured overhead (it moved by up to 24 MiB)")
    ap.add_argument("--budgets-128k", type=int, nargs="+", default=[1900, 2100, 2400, 2800, 3300, 3900],
                    help="gate g: device-memory budgets (MiB, nvidia-smi's figure) at contexts up to 131,072")
    ap.add_argument("--budgets-1m", type=int, nargs="+",
                    default=[2000, 2300, 2600, 2900, 3600, 5000, 7500, 11000, 19500],
                    help="gate g: device-memory budgets (MiB) at larger contexts")
    a = ap.parse_args(argv)
    a.before_env = {}
    a.before_label = f"the build in {a.before_bin}" if a.before_bin else None
    if a.before_copy and a.compare_debug:
        ap.error("--before-copy and --compare-debug both name the 'before' build: give one")
    if a.bench_rounds < 1:
        ap.error(f"--bench-rounds {a.bench_rounds}: gate b needs at least one round (5 give an interval, 30 by default)")
    if "a" in a.only.split(",") and a.pre_bin is None:
        ap.error("--pre-bin is required for gate a (--only holds a): the series without 0089, whose boot gate a repeats")
    if a.before_copy and a.before_bin is None:
        a.before_bin, a.before_env = a.full_bin, dict(COPY_TAIL_ENV)
        a.before_label = "this build on the copying tail path (OPENCOTI_KV_DEBUG=copy-tail)"
    if a.compare_debug and a.before_bin is None:
        a.before_bin, a.before_env = a.full_bin, {DEBUG_ENV: a.compare_debug}
        a.before_label = f"this build with OPENCOTI_KV_DEBUG={a.compare_debug}"
    return a


def upstream_note(a: argparse.Namespace) -> str | None:
    """What the rows named upstream really ran, when --upstream-bin is the full build (a session without the time for
    an upstream build): the full series in head mode, upstream's code path, not an unpatched build."""
    if Path(a.upstream_bin).resolve() != Path(a.full_bin).resolve():
        return None
    return "--upstream-bin is --full-bin: the rows named upstream ran the full series in head mode, not an upstream build"


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    note = upstream_note(a)
    if note:
        log(f"note: {note}")
    builds = builds_used(a)
    try:
        libraries = check_own_libraries({k: need_tool(v, "llama-completion") for k, v in builds.items()},
                                        dict(os.environ))
    except GateError as e:
        log(f"gates.gpu: {e}")
        return COULD_NOT_RUN
    log("libraries: every build loads its own: " + ", ".join(f"{k} {v}" for k, v in libraries.items()))
    a.compilers = {k: build_compiler(need_tool(v, "llama-completion"), dict(os.environ)) for k, v in builds.items()}
    log("compilers: " + ", ".join(f"{k} {v or 'not said'}" for k, v in a.compilers.items()))
    differ = compilers_differ(a.compilers, "full", "upstream") if not note else None
    if differ:
        log(f"note: {differ}; gate b's verdict is not checked, and every other ratio to upstream carries this note")
    cards = a.device = device_cards()
    log("device: " + ("; ".join(cards) or "nvidia-smi named no card"))
    model = ensure_model(a.work / "synthetic-8l-2048.gguf", MODEL_ARGS)
    results: dict = {}
    names = GATES
    for g in a.only.split(","):
        t0 = time.monotonic()
        log(f"== gate {g}")
        try:
            if g == "a":
                res = gate_a(a, model, a.work)
            elif g == "b":
                res = gate_b(a, model, a.work)
            elif g == "c":
                res = gate_c(a, model, a.work)
            elif g == "d":
                res = gate_d(a, model, a.work, a.out)
            elif g == "e":
                res = gate_e(a, model, a.work)
            elif g == "f":
                res = gate_f(a, model, a.work)
            elif g == "g":
                res = gate_g(a, model, a.work, a.out)
            elif g == "h":
                res = gate_h(a, model, a.work, a.out)
            else:
                res = {"pass": False, "error": f"unknown gate {g!r}"}
        except Exception as e:  # keep going: one broken gate must not hide the others' results
            res = {"pass": False, "error": f"{type(e).__name__}: {e}"}
        res["seconds"] = round(time.monotonic() - t0, 1)
        if note:
            res["upstream_bin"] = note
        res["libraries"] = libraries
        res["compilers"] = a.compilers
        res["device"] = cards
        if differ:
            res["compilers_differ"] = differ
        results[names.get(g, g)] = res
        verdict = "pass" if res.get("pass") else ("not checked" if res.get("verdict") == "not checked" else "FAIL")
        log(f"== gate {g}: {res['seconds']:.0f} s, {verdict}")
        why = "" if verdict == "pass" else (res.get("why_not_checked") or res.get("error") or part_why(res))
        report_part(g, "fail" if verdict == "FAIL" else verdict, why)
        write_whole(a.out / "gpu_gates.json", json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0 if all(v.get("pass") for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
