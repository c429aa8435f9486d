"""GPU gates on a CUDA machine: (a) boot repro under a ballast, (b) resident unchanged, (c) window = resident, (d) the curve."""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cpu_gates  # noqa: E402  (sibling script: text generation, KLD parsing)

RE_WINDOW = cpu_gates.RE_WINDOW
RE_PROMPT = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens .*?([\d.]+) tokens per second")
RE_EVAL = re.compile(r"\s eval time =\s*([\d.]+) ms /\s*(\d+) runs .*?([\d.]+) tokens per second")
OOM_LINES = ("failed to allocate compute pp buffers", "graph_reserve: failed to allocate compute buffers",
             "failed to allocate CUDA0 buffer")
MIB = 1 << 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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


def run(tag: str, argv: list[str], work: Path, env: dict | None = None, measure: bool = False,
        timeout: int = 300) -> dict:
    e = dict(os.environ)
    e.pop("OPENCOTI_KV_WINDOW_CELLS", None)
    e.update(env or {})
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
    found = list(RE_WINDOW.finditer(text))
    w = found[-1] if found else None  # with two passes, the last line is the window the context runs with
    if w:
        res["window"] = {"resident": int(w.group(1)), "kv_size": int(w.group(2)), "tail": int(w.group(3)),
                         "tail_mib": float(w.group(4))}
    res["fully_resident"] = "FULLY RESIDENT" in text and not found
    res["measure_pass"] = [ln.strip() for ln in text.splitlines() if "two-pass" in ln or "measure pass" in ln]
    res["window_lines"] = [ln.strip() for ln in text.splitlines() if "position window" in ln]
    res["oom_lines"] = [ln.strip() for ln in text.splitlines() if any(k in ln for k in OOM_LINES)]
    res["text"] = text
    return res


def completion(bin_dir: Path, model: Path, ctx: int, prompt_file: Path, n: int, extra: list[str]) -> list[str]:
    return [str(bin_dir / "llama-completion"), "-m", str(model), "-f", str(prompt_file), "-n", str(n), "-c", str(ctx),
            "-ngl", "99", "-fa", "on", "-ctk", "f16", "-ctv", "f16", "--temp", "0", "--seed", "1", "-no-cnv",
            "--ignore-eos", "-t", "8", "-lv", "4", *extra]


def strip(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "text"}


def gate_a(a: argparse.Namespace, model: Path, work: Path) -> dict:
    prompt = work / "short.txt"
    prompt.write_text(cpu_gates.make_text(60, 7))
    extra = ["--kv-residency-mode", "window", "-fit", "off"]
    ballast = Ballast(a.leave_mib)
    try:
        pre = run("a-pre0089", completion(a.pre_bin, model, a.boot_ctx, prompt, 32, extra), work)
        full = run("a-full", completion(a.full_bin, model, a.boot_ctx, prompt, 32, extra), work)
    finally:
        ballast.close()
    compute = re.findall(r"CUDA0 compute buffer size =\s*([\d.]+) MiB", full["text"])
    ok = (pre["rc"] != 0 and bool(pre["oom_lines"]) and full["rc"] == 0 and bool(full["window"])
          and full.get("decode_tps", 0) > 0)
    return {"pass": ok, "ballast": ballast.line, "ctx": a.boot_ctx, "leave_mib": a.leave_mib,
            "pre0089": {"rc": pre["rc"], "decisive": pre["oom_lines"][:3] + pre["window_lines"][:1]},
            "full": {"rc": full["rc"], "decisive": full["measure_pass"][:3] + full["window_lines"][-1:],
                     "decode_tps": full.get("decode_tps"), "compute_buffer_mib": compute[-1:] }}


def gate_b(a: argparse.Namespace, model: Path, work: Path) -> dict:
    prompt = work / "prompt-b.txt"
    prompt.write_text(cpu_gates.make_text(1500, 11))
    runs: dict[str, list[dict]] = {"upstream": [], "full": []}
    for i in range(a.repeat):
        for name, bin_dir, extra in (("upstream", a.upstream_bin, []),
                                     ("full", a.full_bin, ["--kv-residency-mode", "window"])):
            runs[name].append(strip(run(f"b-{name}-{i}", completion(bin_dir, model, 131072, prompt, 128, extra), work)))
    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("prefill_tps", "decode_tps")} for n, rs in runs.items()}
    spread = {n: {k: [min(r[k] for r in rs), max(r[k] for r in rs)] for k in ("prefill_tps", "decode_tps")}
              for n, rs in runs.items()}
    full_ok = all(r["fully_resident"] and not r["measure_pass"] and r["rc"] == 0 for r in runs["full"])
    ratio = {k: med["full"][k] / med["upstream"][k] for k in ("prefill_tps", "decode_tps")}
    return {"pass": full_ok and all(0.9 < v < 1.1 for v in ratio.values()), "median": med, "min_max": spread,
            "ratio_full_over_upstream": ratio, "fully_resident_single_pass": full_ok, "runs": a.repeat,
            "window_line": runs["full"][0].get("window_lines", [])}


def gate_c(a: argparse.Namespace, model: Path, work: Path) -> dict:
    text = work / "ppl.txt"
    text.write_text(cpu_gates.make_text(6000, 3))
    base = work / "resident.kld"
    ppl = str(a.full_bin / "llama-perplexity")
    common = ["-m", str(model), "-f", str(text), "-c", "2048", "-b", "512", "-ub", "512", "-ngl", "99", "-fa", "on",
              "--chunks", "4", "-t", "8", "-lv", "4"]
    r0 = run("c-resident", [ppl, *common, "--kl-divergence-base", str(base)], work)
    out = {"resident_rc": r0["rc"], "windows": []}
    ok = r0["rc"] == 0
    for w in a.windows:
        for _attempt in range(3):  # llama-perplexity can lose its last log lines at exit: retry
            r = run(f"c-window-{w}", [ppl, *common, "--kv-residency-mode", "window", "--kl-divergence-base",
                                      str(base), "--kl-divergence"], work, env={"OPENCOTI_KV_WINDOW_CELLS": str(w)})
            stats = cpu_gates.parse_stats(r["text"])
            if "max_kld" in stats and "same_top_pct" in stats:
                break
        row = {"window": w, "rc": r["rc"], "window_line": r["window_lines"][:1], **stats}
        ok = ok and r["rc"] == 0 and bool(r["window"]) and stats.get("max_kld", 1) <= cpu_gates.TOL_TOOL_MAX_KLD \
            and stats.get("same_top_pct", 0) >= cpu_gates.TOL_SAME_TOP_PCT
        out["windows"].append(row)
    out["pass"] = ok
    out["tolerance"] = {"max_kld": cpu_gates.TOL_TOOL_MAX_KLD, "same_top_pct": cpu_gates.TOL_SAME_TOP_PCT}
    return out


def gate_d(a: argparse.Namespace, model: Path, work: Path, outdir: Path) -> dict:
    prompt = work / "prompt-d.txt"
    prompt.write_text(cpu_gates.make_text(a.curve_words, 5))
    rows = []
    for target in a.targets:
        extra = ["--kv-residency-mode", "window", "-fit", "off"] + (["--vram-target", str(target)] if target else [])
        r = run(f"d-target-{target}", completion(a.full_bin, model, a.curve_ctx, prompt, 64, extra), work, measure=True)
        rows.append({"config": f"window --vram-target {target}", "vram_target_mib": target, "rc": r["rc"],
                     "resident_cells": (r.get("window") or {}).get("resident", a.curve_ctx if r["fully_resident"] else ""),
                     "host_tail_mib": (r.get("window") or {}).get("tail_mib", 0.0),
                     "device_mib_peak": r.get("device_mib_peak"), "prompt_tokens": r.get("prompt_tokens"),
                     "prefill_tps": r.get("prefill_tps"), "decode_tps": r.get("decode_tps")})
        log(f"curve: {rows[-1]}")
    r = run("d-nkvo", completion(a.upstream_bin, model, a.curve_ctx, prompt, 64, ["-nkvo"]), work, measure=True)
    kv_mib = a.curve_ctx * a.kv_bytes_per_cell / MIB
    rows.append({"config": "upstream --no-kv-offload", "vram_target_mib": "", "rc": r["rc"], "resident_cells": 0,
                 "host_tail_mib": round(kv_mib, 1), "device_mib_peak": r.get("device_mib_peak"),
                 "prompt_tokens": r.get("prompt_tokens"), "prefill_tps": r.get("prefill_tps"),
                 "decode_tps": r.get("decode_tps")})
    csv_path = outdir / "rolling_kv_curve.csv"
    with open(csv_path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    within = all(r["rc"] == 0 and (not r["vram_target_mib"] or r["device_mib_peak"] is None
                                   or r["device_mib_peak"] <= r["vram_target_mib"] + a.context_mib)
                 for r in rows if r["config"].startswith("window"))
    return {"pass": within and all(r["rc"] == 0 for r in rows), "csv": str(csv_path), "rows": rows,
            "note": f"device peak includes the CUDA context (~{a.context_mib} MiB), which the budget does not cover"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--full-bin", type=Path, required=True, help="CUDA build of the whole series")
    ap.add_argument("--pre-bin", type=Path, required=True, help="CUDA build of the series without 0089")
    ap.add_argument("--upstream-bin", type=Path, required=True, help="CUDA build of unpatched upstream")
    ap.add_argument("--work", type=Path, default=Path("build/gpu-gates"))
    ap.add_argument("--out", type=Path, default=Path("build/gpu-gates/out"))
    ap.add_argument("--only", default="a,b,c,d")
    ap.add_argument("--boot-ctx", type=int, default=1048576)
    ap.add_argument("--leave-mib", type=int, default=12288, help="device memory the ballast leaves free")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--windows", type=int, nargs="+", default=[1024, 256])
    ap.add_argument("--curve-ctx", type=int, default=131072)
    ap.add_argument("--curve-words", type=int, default=40000)
    ap.add_argument("--targets", type=int, nargs="+", default=[0, 3600, 3000, 2600, 2300, 2100])
    ap.add_argument("--kv-bytes-per-cell", type=int, default=8 * 2 * 4 * 128 * 2, help="layers*(K+V)*kv_heads*dim*f16")
    ap.add_argument("--context-mib", type=int, default=600)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    model = a.work / "synthetic-8l-2048.gguf"
    if not model.is_file():
        subprocess.run([sys.executable, str(HERE / "make_model.py"), "-o", str(model), "--arch", "llama",
                        "--layers", "8", "--n-embd", "2048", "--n-head", "16", "--n-head-kv", "4", "--head-dim", "128",
                        "--n-ff", "8192", "--ctx", "1048576", "--vocab", "512"], check=True)
    results: dict = {}
    for g in a.only.split(","):
        t0 = time.monotonic()
        log(f"== gate {g}")
        try:
            if g == "a":
                results["a_boot_repro"] = gate_a(a, model, a.work)
            elif g == "b":
                results["b_resident_unchanged"] = gate_b(a, model, a.work)
            elif g == "c":
                results["c_window_equals_resident"] = gate_c(a, model, a.work)
            elif g == "d":
                results["d_curve"] = gate_d(a, model, a.work, a.out)
        except Exception as e:  # keep going: one broken gate must not hide the others' results
            results[g] = {"pass": False, "error": f"{type(e).__name__}: {e}"}
        log(f"== gate {g}: {time.monotonic() - t0:.0f} s")
        (a.out / "gpu_gates.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0 if all(v.get("pass") for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
