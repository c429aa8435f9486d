"""compute-sanitizer over a window run with the mapped tail: memcheck and racecheck, each a verdict.

One llama-completion run per tool on the gates' synthetic model (`gates.gpu`'s, built here when missing) with a
forced window smaller than the prompt, so that prefill ubatches reach past the device part (the prefill copy) and
decode tokens attend the tail (the tail segments). Each tool's verdict is `pass` (the tool's own summary with 0
errors, memcheck's `ERROR SUMMARY` or racecheck's `RACECHECK SUMMARY`, and exit 0), `fail` (errors, or the run
failed) or `not checked` (the limit stopped it before the summary, no compute-sanitizer, or a clean run that
logged no mapped host tail): a tool that did not finish, or ran over a resident cache or the copying tail path,
is never a pass. Writes the commands, the sanitizer's lines and the cache lines to --out (text) and prints one
JSON object; exits 1 unless every tool passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from gates.common import DEBUG_ENV, WINDOW_ENV, device_cards, ensure_model, make_text, own_libraries_env
from gates.gpu import CARRY_DROPPED, FLAG_RAN, MODEL_ARGS, RE_CARRY_READ, flags_not_run, flags_ran

# 0073's carry trial times 3 + 8 decode tokens each way, after the first decode graph: 22 decode graphs at least,
# and -n N makes N - 1 of them (the first token comes from the prompt's last ubatch)
TRIAL_N_PREDICT = 32
MAX_LINES = 200  # of the sanitizer's own lines kept per tool (a racecheck hazard report is long)
RE_SUMMARY = re.compile(r"=+ ERROR SUMMARY: (\d+) error")
# racecheck ends with its own summary line, never an ERROR SUMMARY
RE_RACE = re.compile(r"=+ RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
MAPPED = "host tail mapped into the device's address space"
RE_TAIL = re.compile(r"position window = \d+ / \d+ cells resident \+ host tail [1-9]")
RE_DEVICE_PART = re.compile(r"[1-9]\d* cells in device memory")
# --wide: two layers of 16 KV heads of 128 (4 KiB rows), so that a 2 MiB mapping granule is 512 cells and the default
# run's 512-cell window is a device part: decode tokens attend it beside the staged tail and combine both
WIDE_MODEL_ARGS = ["--arch", "llama", "--layers", "2", "--n-embd", "2048", "--n-head", "16", "--n-head-kv", "16",
                   "--head-dim", "128", "--n-ff", "2048", "--ctx", "4096", "--vocab", "512"]
# ggml-cuda's CUDA error names the function and line on its "current device" line
KEEP = ("=========", "position window", "mapped into", "prompt eval time", "eval time", "GGML_ASSERT", "error:",
        "current device", "tail ring:", "OPENCOTI_KV_DEBUG ")


def verdict(rc: int | None, text: str) -> dict:
    """pass / fail / not checked from the sanitizer's exit status (None: stopped by the limit) and its summary line
    (memcheck's ERROR SUMMARY, racecheck's RACECHECK SUMMARY, whose warnings are reported, not counted as errors)."""
    m = RE_SUMMARY.search(text)
    race = RE_RACE.search(text)
    if rc is None or (m is None and race is None):
        why = "stopped by the time limit before its summary" if rc is None else "no summary line"
        return {"verdict": "not checked", "errors": None, "why": why}
    errors = int(m.group(1)) if m else int(race.group(1))
    warnings = int(race.group(2)) if race and not m else None
    ok = errors == 0 and rc == 0
    why = "" if ok else (f"{errors} error(s)" if errors else f"exit status {rc}: the program failed under it")
    if warnings:
        why = "; ".join(x for x in (why, f"{warnings} racecheck warning(s)") if x)
    return {"verdict": "pass" if ok else "fail", "errors": errors, "warnings": warnings, "why": why}


def run_limited(cmd: list[str], env: dict, limit: int) -> tuple[int | None, str]:
    """(exit status, output) of cmd; (None, what it printed) when the limit stops it: its whole process group is
    killed, so the program under the sanitizer does not keep the GPU."""
    p = subprocess.Popen(cmd, env=own_libraries_env(cmd, env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, errors="replace",
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=limit)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return None, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.sanitizer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="CUDA build of the full series (llama-completion)")
    ap.add_argument("--tools", default="memcheck,racecheck")
    ap.add_argument("--sanitizer", default=os.environ.get("COMPUTE_SANITIZER", "compute-sanitizer"))
    # the default run is small (racecheck takes minutes over a few hundred tokens) and its 1 MiB tensors are smaller
    # than the 2 MiB mapping granularity: the whole cache is host memory mapped for the device
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--window", type=int, default=512, help="forced window cells (less than the prompt)")
    ap.add_argument("--words", type=int, default=500,
                    help="prompt length in words of the gates' text (500: about 580 tokens, past the window)")
    ap.add_argument("--ubatch", type=int, default=128)
    ap.add_argument("--limit", type=int, default=300, help="seconds each tool may run")
    ap.add_argument("--work", type=Path, default=Path("build/gpu-gates"))
    ap.add_argument("--model", type=Path, help="default: the gates' synthetic model in --work")
    ap.add_argument("--wide", action="store_true",
                    help="a two-layer model with 4 KiB K/V rows (built in --work), whose 512-cell window keeps its "
                         "cells in device memory: a pass then also needs the run to log cells in device memory")
    ap.add_argument("--n-predict", type=int, default=None,
                    help=f"tokens generated under the tool (default 8; {TRIAL_N_PREDICT} when --debug names "
                         "ring-carry-trial, whose trial needs 22 decode tokens to end)")
    ap.add_argument("--out", type=Path, default=Path("build/gpu-gates/sanitizer.txt"))
    ap.add_argument("--debug", default="",
                    help="OPENCOTI_KV_DEBUG flags for the run (e.g. tail-ring); with --ctx 4096 --window 2048 a decode "
                         "token attends a 2,048-cell device part and merges it with the staged tail")
    ap.add_argument("--kernels", default="",
                    help="instrument only kernels whose name contains this (compute-sanitizer's --kernel-name "
                         "kns=...; 'attn' keeps every flash-attention kernel and the tail's combine, and makes "
                         "racecheck over a 4,096-cell run take minutes, not hours); the file says it was filtered. "
                         "compute-sanitizer 2025.3.1 stopped with an internal error under this filter on the H200, in "
                         "head mode too (docs/gates.md, fifteenth round): there it gives no verdict")
    a = ap.parse_args(argv)
    if a.n_predict is None:
        a.n_predict = TRIAL_N_PREDICT if "ring-carry-trial" in a.debug.split(",") else 8
    if a.n_predict < 1:
        ap.error(f"--n-predict {a.n_predict}: give at least 1 token to generate")
    tool_path = shutil.which(a.sanitizer)
    if a.wide and a.model:
        ap.error("--wide builds its own model: give --model or --wide, not both")
    model = a.model or (ensure_model(a.work / "synthetic-2l-wide.gguf", WIDE_MODEL_ARGS) if a.wide else
                        ensure_model(a.work / "synthetic-8l-2048.gguf", MODEL_ARGS))
    prompt = a.work / "sanitizer-prompt.txt"
    prompt.parent.mkdir(parents=True, exist_ok=True)
    prompt.write_text(make_text(a.words, 3))
    run = [str(a.bin / "llama-completion"), "-m", str(model), "-f", str(prompt), "-c", str(a.ctx),
           "-n", str(a.n_predict), "-ngl", "99", "-fa", "on", "-ub", str(a.ubatch), "--kv-residency-mode", "window",
           "-fit", "off", "-no-cnv", "--temp", "0", "--seed", "1", "-t", "8", "-lv", "4"]
    env = dict(os.environ, **{WINDOW_ENV: str(a.window)})
    env.pop(DEBUG_ENV, None)
    if a.debug:
        env[DEBUG_ENV] = a.debug
    flags = f"{DEBUG_ENV}={a.debug} " if a.debug else ""
    cards = device_cards()
    lines = [f"# compute-sanitizer over a window run with the mapped tail (python -m gates.sanitizer): ctx {a.ctx}, "
             f"forced window {a.window}, -ub {a.ubatch}, {a.words}-word prompt, {a.n_predict} tokens generated, "
             f"limit {a.limit} s per tool"
             + (f", {DEBUG_ENV}={a.debug}" if a.debug else "")
             + (", the two-layer model with 4 KiB K/V rows (a device part)" if a.wide else "")
             + (f"; only kernels whose name contains '{a.kernels}' are checked" if a.kernels else ""),
             "# device: " + ("; ".join(cards) or "nvidia-smi named no card")]
    results: dict[str, dict] = {}
    for tool in [t for t in a.tools.split(",") if t]:
        only = ["--kernel-name", f"kns={a.kernels}"] if a.kernels else []
        cmd = [tool_path or a.sanitizer, "--tool", tool, *only, *run]
        lines.append(f"\n## {tool}: {flags}{WINDOW_ENV}={a.window} {' '.join(cmd)}")
        if tool_path is None:
            results[tool] = {"verdict": "not checked", "errors": None, "why": f"no {a.sanitizer} on PATH"}
            lines.append(f"{tool}: not checked (no {a.sanitizer} on PATH)")
            continue
        rc, text = run_limited(cmd, env, a.limit)
        results[tool] = verdict(rc, text)
        if results[tool]["verdict"] == "pass" and not (RE_TAIL.search(text) and MAPPED in text):
            # clean, but over a resident cache or 0072's copying path: the mapped tail was not what ran
            why = ("no host tail logged (the forced window did not engage)" if not RE_TAIL.search(text) else
                   "the host tail was not mapped into the device's address space (0072's copying path ran)")
            results[tool] = {"verdict": "not checked", "errors": 0, "why": why}
        elif results[tool]["verdict"] == "pass" and a.wide and not RE_DEVICE_PART.search(text):
            results[tool] = {"verdict": "not checked", "errors": 0,
                             "why": "no cells in device memory (--wide asks for a device part)"}
        # the ring's carry logs once a context whether a graph read carried chunks; a run asked to carry
        # (--debug ring-carry) that never read one has not put the carry's copies under the tool
        results[tool]["carry_read"] = bool(RE_CARRY_READ.search(text))
        results[tool]["carry_dropped_on_write"] = CARRY_DROPPED in text
        # a flag of gates.gpu.FLAG_RAN asked for and never logged did not run under the tool
        results[tool]["flags_ran"] = flags_ran(text)
        missing = flags_not_run(a.debug, set(results[tool]["flags_ran"]))
        if results[tool]["verdict"] == "pass" and missing:
            results[tool].update(verdict="not checked", why="; ".join(
                f"--debug names {f}, but under the tool {FLAG_RAN[f][1]}" for f in missing))
        own = [ln for ln in text.splitlines() if ln.startswith(KEEP[0])]
        lines += own[:MAX_LINES] + [f"... {len(own) - MAX_LINES} more sanitizer lines"] * (len(own) > MAX_LINES)
        lines += [ln for ln in text.splitlines() if any(k in ln for k in KEEP[1:])]
        r = results[tool]
        lines.append(f"{tool}: {r['verdict']}" + (f" ({r['why']})" if r["why"] else ""))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines) + "\n")
    ok = bool(results) and all(r["verdict"] == "pass" for r in results.values())
    print(json.dumps({"pass": ok, "tools": results, "out": str(a.out), "device": cards}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
