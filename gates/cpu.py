"""CPU gates for rolling KV: head mode is byte-identical to upstream, forced windows match resident, log lines show,
and a memory window mode does not reach says so and runs as head mode."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gates import make_model
from gates.common import (
    COULD_NOT_RUN,
    DEBUG_ENV,
    RE_FULL,
    RE_FULL_LINE,
    RE_SPAN_SPLIT,
    RE_WINDOW,
    TOL_FILE_MAX_KLD,
    TOL_MAX_ABS_DLOGIT,
    TOL_MAX_ABS_DLOGP,
    TOL_SAME_TOP_PCT,
    TOL_TOOL_MAX_KLD,
    WINDOW_ENV,
    GateError,
    check_own_libraries,
    make_text,
    need_tool,
    own_libraries_env,
    parse_stats,
    parse_windows,
    report_part,
    sha256,
    supports_flag,
    tool,
)

# the checks this program runs (--gates), each reported per model as a part (`a.llama`); a registry gate that runs it
# declares the parts its --gates requires (a test holds them equal)
CHECKS = ("a", "b", "c", "d")
SENSITIVITY_FACTOR = 10.0    # a one-token context change must exceed TOL_MAX_ABS_DLOGP by this factor
TOOL_RETRIES = 4             # llama-perplexity can lose its last log lines at exit (leaked async logger)


@dataclass
class Ctx:
    args: argparse.Namespace
    work: Path
    runs: list = field(default_factory=list)

    def run(self, tag: str, argv: list[str], env_extra: dict | None = None, check: bool = True) -> str:
        """Run one tool, keep its combined log under work/, return the log text."""
        env = os.environ.copy()
        env.pop(WINDOW_ENV, None)  # a stray window in the caller's environment would poison the resident runs
        env.pop(DEBUG_ENV, None)
        env.update(env_extra or {})
        env = own_libraries_env(argv, env)
        log_path = self.work / f"{tag}.log"
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=self.args.timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise GateError(f"{tag}: timed out after {self.args.timeout}s: {' '.join(argv)}") from e
        dt = time.monotonic() - t0
        text = p.stdout.decode("utf-8", "replace")
        log_path.write_text(text)
        self.runs.append({"tag": tag, "argv": argv, "env": env_extra or {}, "rc": p.returncode,
                          "seconds": round(dt, 2), "log": str(log_path)})
        if self.args.verbose:
            print(f"  [{dt:5.1f}s rc={p.returncode}] {tag}", file=sys.stderr)
        if check and p.returncode != 0:
            tail = "\n".join(text.splitlines()[-15:])
            raise GateError(f"{tag}: exit {p.returncode} (log {log_path}):\n{tail}")
        return text







def perturb_text(text: str, seed: int) -> str:
    """Swap one early word of the first perplexity chunk for another vocab word (same token count)."""
    words = text.split(" ")
    i = len(words) // 40  # early in chunk 1, so it sits in the host tail of every forced window
    rng = random.Random(seed)
    choices = [w for w in make_model.WORDS if w != words[i]]
    words[i] = rng.choice(choices)
    return " ".join(words)


def read_kld_base(path: Path) -> dict:
    """Parse a llama-perplexity --kl-divergence-base file into float64 log-probs [rows, n_vocab]."""
    raw = path.read_bytes()
    if raw[:8] != b"_logits_":
        raise GateError(f"{path}: not a --kl-divergence-base file")
    n_ctx = int(np.frombuffer(raw, np.uint32, 1, 8)[0])
    n_vocab, n_chunk = (int(x) for x in np.frombuffer(raw, np.int32, 2, 12))
    off = 20 + 4 * n_ctx * n_chunk
    nv = 2 * ((n_vocab + 1) // 2) + 4
    rows_per_chunk = n_ctx - 1 - n_ctx // 2
    q = np.frombuffer(raw, np.uint16, rows_per_chunk * n_chunk * nv, off).reshape(-1, nv)
    head = q[:, :4].copy().view(np.float32)  # per row: scale, min_log_prob
    scale, min_lp = head[:, 0:1].astype(np.float64), head[:, 1:2].astype(np.float64)
    logp = scale * q[:, 4:4 + n_vocab].astype(np.float64) + min_lp
    return {"n_ctx": n_ctx, "n_vocab": n_vocab, "n_chunk": n_chunk, "logp": logp}


def compare_logp(base: np.ndarray, other: np.ndarray) -> dict:
    """KLD(base||other), max |dlogp| over tokens the base gives p > e^-16, and same-top fraction."""
    if base.shape != other.shape:
        raise GateError(f"log-prob shapes differ: {base.shape} vs {other.shape}")
    live = base > -16.0  # the tool stores everything below max-16 as the floor; ignore it like the tool does
    p = np.exp(base) * live
    kld = np.sum(p * (base - other), axis=1)
    dl = np.abs(base - other)[live]
    return {"rows": int(base.shape[0]), "max_kld": float(kld.max()), "mean_kld": float(kld.mean()),
            "max_abs_dlogp": float(dl.max()) if dl.size else 0.0,
            "same_top_pct": 100.0 * float(np.mean(base.argmax(1) == other.argmax(1)))}


def read_results_logits(path: Path) -> np.ndarray:
    """The f32 'logits' tensor [n_tokens, n_vocab] from a llama-results output file."""
    import gguf  # only needed when llama-results is available

    r = gguf.GGUFReader(str(path))
    for t in r.tensors:
        if t.name == "logits":
            # llama-results declares ne = (n_tokens, n_vocab) but fills it row-major as [token][vocab].
            return np.asarray(t.data, dtype=np.float32).reshape(int(t.shape[0]), -1)
    raise GateError(f"{path}: no 'logits' tensor")




class ArchGates:
    """All three gates for one model."""

    def __init__(self, c: Ctx, arch: str, model: Path, text: Path, text_perturbed: Path, results_text: Path):
        self.c, self.a = c, c.args
        self.arch, self.model = arch, model
        self.text, self.text_perturbed, self.results_text = text, text_perturbed, results_text
        self.up_ppl = need_tool(self.a.upstream_bin, "llama-perplexity")
        self.pa_ppl = need_tool(self.a.patched_bin, "llama-perplexity")
        self.up_res = tool(self.a.upstream_bin, "llama-results")
        self.pa_res = tool(self.a.patched_bin, "llama-results")
        self.has_window = supports_flag(self.pa_ppl, "--kv-residency-mode")

    def common(self) -> list[str]:
        a = self.a
        # -b == -c: one batch per chunk, split into ubatches of -ub: a window < ub splits a ubatch.
        return ["-m", str(self.model), "-c", str(a.ctx), "-b", str(a.ctx), "-ub", str(a.ubatch),
                "--chunks", str(a.chunks), "-fa", "on", "-t", str(a.threads), "--seed", "1", "-ngl", "0",
                # llama's own INFO lines (the position-window line) print only at -lv 4, its debug lines (the attention
                # span's retries, which --debug span-min counts) at -lv 5
                "-lv", "5" if a.debug else "4"]

    def window_args(self, w: int | None) -> tuple[list[str], dict]:
        argv = ["--kv-residency-mode", "window"]
        env = {}
        if w is not None:
            if self.a.force_via == "flag":
                argv += ["--kv-window-cells", str(w)]
            else:
                env[WINDOW_ENV] = str(w)
        if self.a.debug:
            env[DEBUG_ENV] = self.a.debug
        return argv, env

    def ppl_base(self, tag: str, binary: Path, out: Path, extra: list[str] = (), env: dict | None = None,
                 text: Path | None = None, ubatch: int | None = None) -> str:
        common = self.common()
        if ubatch is not None:
            common[common.index("-ub") + 1] = str(ubatch)
            if ubatch == 1:  # one token per decode is ~10x slower: one chunk is enough for this shape
                common[common.index("--chunks") + 1] = "1"
        argv = [str(binary), *common, "-f", str(text or self.text), "--kl-divergence-base", str(out), *extra]
        return self.c.run(f"{self.arch}.{tag}", argv, env)

    def results(self, tag: str, binary: Path, out: Path, extra: list[str] = (), env: dict | None = None) -> str:
        a = self.a
        argv = [str(binary), "-m", str(self.model), "-f", str(self.results_text), "-o", str(out),
                "-c", str(a.results_ctx), "-b", str(a.results_ctx), "-ub", str(a.ubatch), "-fa", "on",
                "-t", str(a.threads), "--seed", "1", "-ngl", "0", "-lv", "4", *extra]
        return self.c.run(f"{self.arch}.{tag}", argv, env)

    # (a) ------------------------------------------------------------------------------------
    def gate_a(self) -> dict:
        w = self.c.work
        up, pa = w / f"{self.arch}.upstream.kld", w / f"{self.arch}.patched-default.kld"
        up_log = self.ppl_base("a.upstream", self.up_ppl, up)
        self.ppl_base("a.patched-default", self.pa_ppl, pa)
        files = {"upstream": sha256(up), "patched_default": sha256(pa)}
        if self.has_window:
            ph = w / f"{self.arch}.patched-head.kld"
            self.ppl_base("a.patched-head", self.pa_ppl, ph, ["--kv-residency-mode", "head"])
            files["patched_head_explicit"] = sha256(ph)
        # -ub 1: every token is its own ubatch, the decode-shaped attention path (split-KV on CPU).
        up1, pa1 = w / f"{self.arch}.upstream-ub1.kld", w / f"{self.arch}.patched-default-ub1.kld"
        self.ppl_base("a.upstream-ub1", self.up_ppl, up1, ubatch=1)
        self.ppl_base("a.patched-default-ub1", self.pa_ppl, pa1, ubatch=1)
        files_ub1 = {"upstream": sha256(up1), "patched_default": sha256(pa1)}
        res = {"kld_base_sha256": files, "ppl": parse_stats(up_log).get("ppl"),
               "kld_base_sha256_ub1": files_ub1,
               "kld_base_identical": len(set(files.values())) == 1 and len(set(files_ub1.values())) == 1}
        if self.up_res and self.pa_res:
            ur, pr = w / f"{self.arch}.upstream.results.gguf", w / f"{self.arch}.patched.results.gguf"
            self.results("a.results-upstream", self.up_res, ur)
            self.results("a.results-patched", self.pa_res, pr)
            lu, lp = read_results_logits(ur), read_results_logits(pr)
            res["f32_logits"] = {"tokens": int(lu.shape[0]), "identical": bool(lu.tobytes() == lp.tobytes()),
                                 "upstream_sha256": hashlib.sha256(lu.tobytes()).hexdigest()}
        else:
            res["f32_logits"] = "skipped: llama-results missing in " + (
                "both dirs" if not (self.up_res or self.pa_res) else
                str(self.a.upstream_bin if not self.up_res else self.a.patched_bin))
        ok = res["kld_base_identical"] and (not isinstance(res["f32_logits"], dict) or res["f32_logits"]["identical"])
        res["ok"] = bool(ok)
        return res

    # (b) + (c) --------------------------------------------------------------------------------
    def tool_kld(self, tag: str, base: Path, extra: list[str], env: dict | None, ubatch: int | None = None) -> tuple[dict, str]:
        """llama-perplexity --kl-divergence against base; rerun when the exit lost the statistics."""
        common = self.common()
        if ubatch is not None:
            common[common.index("-ub") + 1] = str(ubatch)
        argv = [str(self.pa_ppl), *common, "--kl-divergence-base", str(base), "--kl-divergence", *extra]
        for attempt in range(TOOL_RETRIES):
            log = self.c.run(f"{self.arch}.{tag}" + (f".retry{attempt}" if attempt else ""), argv, env)
            stats = parse_stats(log)
            if "max_kld" in stats and "same_top_pct" in stats:
                return stats, log
        return {"lost": f"statistics missing from the log after {TOOL_RETRIES} runs"}, log

    def compare_results(self, ref: np.ndarray, path: Path) -> dict:
        lw = read_results_logits(path)
        if lw.shape != ref.shape:
            raise GateError(f"{path}: logits shape {lw.shape} != resident {ref.shape}")
        d = np.abs(lw.astype(np.float64) - ref.astype(np.float64))
        return {"tokens": int(lw.shape[0]), "identical": bool(lw.tobytes() == ref.tobytes()),
                "max_abs_dlogit": float(d.max()), "same_top_pct": 100.0 * float(np.mean(lw.argmax(1) == ref.argmax(1)))}

    def within(self, tool_stats: dict, files: dict, f32: dict | None) -> bool:
        tool_ok = "lost" in tool_stats or (tool_stats["max_kld"] <= TOL_TOOL_MAX_KLD
                                           and tool_stats["same_top_pct"] >= TOL_SAME_TOP_PCT)
        files_ok = (files["max_abs_dlogp"] <= TOL_MAX_ABS_DLOGP and files["max_kld"] <= TOL_FILE_MAX_KLD
                    and files["same_top_pct"] >= TOL_SAME_TOP_PCT)
        f32_ok = f32 is None or (f32["max_abs_dlogit"] <= TOL_MAX_ABS_DLOGIT and f32["same_top_pct"] >= TOL_SAME_TOP_PCT)
        return bool(tool_ok and files_ok and f32_ok)

    def gate_bc(self) -> tuple[dict, dict]:
        if not self.has_window:
            why = f"{self.pa_ppl} has no --kv-residency-mode (unpatched build?)"
            return {"ok": False, "skipped": why}, {"ok": False, "skipped": why}
        w, a = self.c.work, self.a
        ref_path = w / f"{self.arch}.patched-default.kld"  # head mode; == upstream when gate (a) passed
        ref = read_kld_base(ref_path)["logp"]
        ref_res = None
        if self.pa_res:
            ref_res_path = w / f"{self.arch}.patched.results.gguf"
            if not ref_res_path.exists():
                self.results("b.results-resident", self.pa_res, ref_res_path)
            ref_res = read_results_logits(ref_res_path)

        # Noise reference: the same resident build with -ub 32 (f16-accumulator attention path).
        noise_ub = 32 if a.ubatch != 32 else 16
        nfile = w / f"{self.arch}.noise-ub{noise_ub}.kld"
        argv = [str(self.pa_ppl), *self.common(), "-f", str(self.text), "--kl-divergence-base", str(nfile)]
        argv[argv.index("-ub") + 1] = str(noise_ub)
        self.c.run(f"{self.arch}.b.noise-ub{noise_ub}", argv)
        noise = {"ubatch": noise_ub, "files": compare_logp(ref, read_kld_base(nfile)["logp"])}
        noise["tool"], _ = self.tool_kld(f"b.noise-kld-ub{noise_ub}", ref_path, [], None, ubatch=noise_ub)
        if ref_res is not None:
            npath = w / f"{self.arch}.noise-ub{noise_ub}.results.gguf"
            self.results(f"b.noise-results-ub{noise_ub}", self.pa_res, npath, ["-ub", str(noise_ub)])
            noise["f32_logits"] = self.compare_results(ref_res, npath)

        # Sensitivity control: one changed early token must move logits far above the tolerance,
        # otherwise the model is too insensitive for "window == resident" to mean anything.
        pert = w / f"{self.arch}.perturbed.kld"
        self.ppl_base("b.perturbed", self.pa_ppl, pert, text=self.text_perturbed)
        sens = compare_logp(ref, read_kld_base(pert)["logp"])
        sens_ok = sens["max_abs_dlogp"] >= SENSITIVITY_FACTOR * TOL_MAX_ABS_DLOGP

        # (c) window mode with nothing forced must report FULLY RESIDENT and give resident bytes.
        wa, we = self.window_args(None)
        full_kld = w / f"{self.arch}.window-unforced.kld"
        full_log = self.ppl_base("c.window-unforced", self.pa_ppl, full_kld, wa, we)
        head_log = (w / f"{self.arch}.a.patched-default.log").read_text()
        c_res = {"unforced_fully_resident": bool(RE_FULL.search(full_log)),
                 "unforced_position_window_lines": parse_windows(full_log),
                 "unforced_identical_to_head": sha256(full_kld) == sha256(ref_path),
                 "head_log_mentions_window": bool(RE_WINDOW.search(head_log) or RE_FULL.search(head_log)),
                 "forced": {}}

        per_w = {}
        for win in a.windows:
            wa, we = self.window_args(win)
            # The window run's own 16-bit base file: byte-identical to resident, or how far off.
            wfile = w / f"{self.arch}.window-w{win}.kld"
            base_log = self.ppl_base(f"b.base-w{win}", self.pa_ppl, wfile, wa, we)
            files = compare_logp(ref, read_kld_base(wfile)["logp"])
            files["identical"] = sha256(wfile) == sha256(ref_path)
            # The tool's own KLD against the resident base (full f32 logits vs 16-bit base).
            tool_stats = ({"lost": "not run for this window (--tool-kld-windows)"} if win not in a.tool_kld_windows
                          else self.tool_kld(f"b.kld-w{win}", ref_path, wa, we)[0])
            entry = {"tool": tool_stats, "files": files}
            if ref_res is not None:
                rp = w / f"{self.arch}.results-w{win}.gguf"
                res_log = self.results(f"b.results-w{win}", self.pa_res, rp, wa, we)
                entry["f32_logits"] = self.compare_results(ref_res, rp)
                entry["f32_logits"]["position_window_lines"] = parse_windows(res_log)
            entry["span_splits"] = len(RE_SPAN_SPLIT.findall(base_log))
            entry["ok"] = self.within(tool_stats, files, entry.get("f32_logits"))
            if "span-min" in self.a.debug.split(","):
                # the span is the window: a full ubatch late in the context must have been split, or nothing was tested
                entry["ok"] = entry["ok"] and entry["span_splits"] > 0
            per_w[str(win)] = entry
            lines = parse_windows(base_log)
            # A cache no larger than the forced window (e.g. gemma3's SWA cache) may stay fully resident.
            full = [int(m[2]) for m in RE_FULL_LINE.finditer(base_log)]
            c_res["forced"][str(win)] = {
                "lines": lines, "fully_resident_kv_sizes": full,
                "ok": bool(lines) and all(ln["tail"] > 0 and ln["window"] + ln["tail"] == ln["kv_size"] for ln in lines)
                and all(kv <= win for kv in full),
            }
        # --no-kv-prefill-copy reaches every cache of the model (each logs it) and, where no mapped tail gives a
        # prefill copy room (a CPU build), changes no byte of the smallest forced window's run
        win = min(a.windows)
        wa, we = self.window_args(win)
        pfile = w / f"{self.arch}.window-w{win}-no-prefill-copy.kld"
        plog = self.ppl_base(f"c.no-prefill-copy-w{win}", self.pa_ppl, pfile, [*wa, "--no-kv-prefill-copy"], we)
        caches = len(parse_windows(plog)) + len(RE_FULL_LINE.findall(plog))
        c_res["no_prefill_copy"] = {"window": win, "caches": caches, "logged": len(RE_NO_PREFILL_COPY.findall(plog)),
                                    "identical_to_window": sha256(pfile) == sha256(w / f"{self.arch}.window-w{win}.kld")}
        c_res["no_prefill_copy"]["ok"] = (c_res["no_prefill_copy"]["identical_to_window"]
                                          and 0 < caches <= c_res["no_prefill_copy"]["logged"])
        # Decode-shaped: -ub 1 makes each token its own ubatch (what generation does), against the
        # resident -ub 1 run, since attention numerics depend on the ubatch shape.
        ref1_path = w / f"{self.arch}.patched-default-ub1.kld"
        ref1 = read_kld_base(ref1_path)["logp"]
        per_w1 = {}
        for win in a.decode_windows:
            wa, we = self.window_args(win)
            wfile = w / f"{self.arch}.window-w{win}-ub1.kld"
            base_log = self.ppl_base(f"b.base-w{win}-ub1", self.pa_ppl, wfile, wa, we, ubatch=1)
            files = compare_logp(ref1, read_kld_base(wfile)["logp"])
            files["identical"] = sha256(wfile) == sha256(ref1_path)
            per_w1[str(win)] = {"files": files, "lines": parse_windows(base_log),
                                "ok": self.within({"lost": "not run"}, files, None) and bool(parse_windows(base_log))}
        b_res = {"windows": per_w, "decode_windows_ub1": per_w1, "noise_reference": noise, "sensitivity_one_token_changed": sens,
                 "sensitivity_ok": bool(sens_ok),
                 "ok": bool(per_w) and all(e["ok"] for e in [*per_w.values(), *per_w1.values()]) and sens_ok}
        c_res["ok"] = (c_res["unforced_fully_resident"] and c_res["unforced_identical_to_head"]
                       and all(v["ok"] for v in c_res["forced"].values()) and c_res["no_prefill_copy"]["ok"])
        return b_res, c_res


RE_FALLBACK = re.compile(r"kv-residency-mode window not possible, falling back to head mode: (.*)")
# the KV cache's line when llama_context_params.kv_prefill_copy is false (0089)
RE_NO_PREFILL_COPY = re.compile(r"window mode without the prefill copy's room \(kv_prefill_copy = false\)")
RECURRENT = "llama_memory_recurrent"


def fallback_expectation(name: str) -> tuple[str, str | None]:
    """(memory type the fallback line must name, architecture it must name) for a gate-d model.

    The recurrent line names only its memory (every recurrent arch shares it); the others name the architecture too."""
    if name == "mamba":
        return RECURRENT, None
    if name in make_model.FALLBACK_ARCHS:
        fb = make_model.FALLBACK_ARCHS[name]
        return fb.memory, fb.gguf_arch
    raise GateError(f"gate d: no synthetic model for {name!r}; --fallback-archs takes mamba, "
                    + ", ".join(make_model.FALLBACK_ARCHS))


def names(line: str, word: str) -> bool:
    """word appears in line as a whole name (llama_kv_cache does not match llama_kv_cache_dsa)."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", line) is not None


def gate_d(c: Ctx, name: str, model: Path, text: Path) -> dict:
    """(d) a memory window mode does not reach: window mode, with a window forced, says at load that it falls back to
    head mode naming the memory type (and the architecture, where the branch is an architecture's own), logs no
    position window, and gives head mode's bytes."""
    a = c.args
    memory, arch = fallback_expectation(name)
    ppl = need_tool(a.patched_bin, "llama-perplexity")
    common = [str(ppl), "-m", str(model), "-f", str(text), "-c", str(a.ctx), "-b", str(a.ctx), "-ub", str(a.ubatch),
              "--chunks", str(a.chunks), "-t", str(a.threads), "--seed", "1", "-ngl", "0", "-lv", "4"]
    head, win = c.work / f"{name}.d.head.kld", c.work / f"{name}.d.window.kld"
    c.run(f"{name}.d.head", [*common, "--kl-divergence-base", str(head)])
    log = c.run(f"{name}.d.window", [*common, "--kv-residency-mode", "window", "--kl-divergence-base", str(win)],
                {WINDOW_ENV: str(min(a.windows))})
    m = RE_FALLBACK.search(log)
    line = m.group(1).strip() if m else None
    same = head.read_bytes() == win.read_bytes()
    logged = bool(RE_WINDOW.search(log))
    names_memory = bool(line) and names(line, memory)
    names_arch = bool(line) and (arch is None or names(line, arch))
    res = {"ok": names_memory and names_arch and not logged and same, "expected_memory": memory,
           "expected_arch": arch, "fallback_line": line, "names_memory": names_memory, "names_arch": names_arch,
           "position_window_logged": logged, "bytes_identical_to_head": same}
    if not res["ok"]:
        res["log_tail"] = "\n".join(log.splitlines()[-15:])
    return res


RE_MTP_FALLBACK = re.compile(r"kv-residency-mode window not possible, falling back to head mode: (.*\(MTP draft context\).*)")
# kv-split-storage refuses, at load, a context whose cache shares layers of a cache it split (0072)
RE_SHARED_REFUSAL = re.compile(r"failed to initialize the context: (kv-residency-mode window: .*shares layer.*)")


def gate_d_mtp(c: Ctx, name: str, model: Path, text: Path, draft: Path | None = None) -> dict:
    """(d) for an MTP draft context: llama-server with the model's NextN block as draft-mtp (or, with draft, a separate
    draft model: a gemma4-assistant beside its gemma4 target), in head mode and in window mode with a window forced.
    The window server's draft context says it falls back (naming its memory, the architecture and "(MTP draft
    context)"); the main context's line names its own memory and no position window is logged (with draft: the
    target's iSWA cache logs its position windows and no fallback line); the draft context drafted tokens; and both
    servers give the same greedy completion."""
    from gates.needle import Server  # the needle gate's server harness (loopback, its own free port)

    a = c.args
    fb = make_model.PAIR_MODELS[name] if draft else make_model.FALLBACK_ARCHS[name]
    draft_args = ["-md", str(draft)] if draft else []
    server = need_tool(a.patched_bin, "llama-server")
    opts = argparse.Namespace(ctx=a.ctx, threads=a.threads, ngl=0, boot_timeout=a.timeout)
    prompt = " ".join(text.read_text().split()[:a.ctx // 4])  # well inside the context with the 16 drafted tokens
    out = {}
    for mode, env in (("head", {}), ("window", {WINDOW_ENV: str(min(a.windows))})):
        log_path = c.work / f"{name}.d.mtp-{mode}.log"
        t0 = time.monotonic()
        try:
            srv = Server(server, model, [*draft_args, "--spec-type", "draft-mtp", "--kv-residency-mode", mode], env,
                         log_path, opts)
        except RuntimeError as e:  # the tail is often a backtrace: name the failed assertion or error line too
            text_log = log_path.read_text(errors="replace")
            refused = RE_SHARED_REFUSAL.search(text_log) if draft and mode == "window" else None
            if refused and "GGML_ASSERT" not in text_log:  # the copying path's refusal at load: judged below
                out[mode] = {"refused": refused.group(1).strip(), "log": text_log}
                break
            why = [ln for ln in text_log.splitlines() if "GGML_ASSERT" in ln or " E " in ln]
            raise GateError(f"{name}.d.mtp-{mode}: {e}" + ("\nfirst error lines:\n" + "\n".join(why[:3]) if why else "")
                            ) from e
        try:
            r = srv.complete(prompt, 16)
        except (OSError, ValueError) as e:
            raise GateError(f"{name}.d.mtp-{mode}: /completion failed: {e}; log {log_path}:\n"
                            + "\n".join(srv.log().splitlines()[-15:])) from e
        finally:
            srv.stop()
        c.runs.append({"tag": f"{name}.d.mtp-{mode}", "argv": srv.argv, "env": env, "rc": srv.proc.returncode,
                       "seconds": round(time.monotonic() - t0, 2), "log": str(log_path)})
        out[mode] = {"content": r.get("content"), "draft_n": r.get("timings", {}).get("draft_n", 0),
                     "log": log_path.read_text(errors="replace")}
    log = out["window"]["log"]
    if "refused" in out["window"]:  # the draft shares a cache that window mode split (kv-split-storage): refused
        line = out["window"]["refused"]
        res = {"expected_memory": "llama_kv_cache", "expected_arch": fb.gguf_arch, "refused_at_load": line,
               "names_memory": names(line, "llama_kv_cache"), "names_arch": names(line, fb.gguf_arch),
               "drafted_tokens": {"head": out["head"]["draft_n"]}}
        res["ok"] = bool(res["names_memory"] and res["names_arch"] and out["head"]["draft_n"] > 0)
        if not res["ok"]:
            res["log_tail"] = "\n".join(log.splitlines()[-15:])
        return res
    m = RE_MTP_FALLBACK.search(log)
    line = m.group(1).strip() if m else None
    main = [x.group(1) for x in RE_FALLBACK.finditer(log) if "(MTP draft context)" not in x.group(1)]
    res = {"expected_memory": fb.mtp_memory, "expected_arch": fb.gguf_arch, "fallback_line": line,
           "names_memory": bool(line) and names(line, fb.mtp_memory),
           "names_arch": bool(line) and names(line, fb.gguf_arch),
           "main_context_line_names": (not main) if draft else bool(main) and names(main[0], fb.memory),
           "position_window_logged": bool(RE_WINDOW.search(log)),
           "drafted_tokens": {k: v["draft_n"] for k, v in out.items()},
           "completion_identical_to_head": out["head"]["content"] == out["window"]["content"]}
    res["ok"] = bool(res["names_memory"] and res["names_arch"] and res["main_context_line_names"]
                     and res["position_window_logged"] == bool(draft) and out["window"]["draft_n"] > 0
                     and res["completion_identical_to_head"])
    if not res["ok"]:
        res["log_tail"] = "\n".join(log.splitlines()[-15:])
    return res


def gate_parts(result: dict, required: set[str]) -> list[tuple[str, str, str]]:
    """(part, verdict, why) for each check that counts: the required ones of (a)-(c) per model as `a.<model>`, and
    (d) per fallback model as `d.<model>`; a model that stopped with an error fails every part it owed."""
    parts: list[tuple[str, str, str]] = []
    for model, g in result.get("archs", {}).items():
        for k in sorted(required - {"d"}):
            e = g.get(k)
            if "error" in g or not isinstance(e, dict):
                parts.append((f"{k}.{model}", "fail", g.get("error", "did not run")))
            else:
                parts.append((f"{k}.{model}", "pass" if e.get("ok") else "fail", ""))
    if "d" in required:
        for model, d in result.get("fallback", {}).items():
            parts.append((f"d.{model}", "pass" if d.get("ok") else "fail", d.get("error", "")))
    return parts


def summarize(result: dict) -> None:
    p = lambda s="": print(s, file=sys.stderr)  # noqa: E731
    nan = float("nan")

    def row(label: str, e: dict, wl: str = "") -> str:
        t, f, g = e.get("tool", {}), e["files"], e.get("f32_logits", {})
        lost = "(lost)" if "missing" in str(t.get("lost", "")) else "(n/a) "
        tool = f"   {lost}           " if "lost" in t else f"{t.get('max_kld', nan):9.6f} {t.get('same_top_pct', nan):8.3f}%  "
        ok = "" if "ok" not in e else ("PASS" if e["ok"] else "FAIL")
        return (f"   {label:>10}  {tool} {f['max_abs_dlogp']:9.3g} {f['max_kld']:9.3g} {f['same_top_pct']:7.2f}%"
                f"  {g.get('max_abs_dlogit', nan):9.3g} {str(g.get('identical', '-')):>5}  {wl:>14} {ok}")

    for arch, g in result["archs"].items():
        p(f"== {arch} ({g.get('model', '?')})")
        if "error" in g:
            p(f"   ERROR: {g['error']}")
            continue
        a = g["a"]
        f32 = a["f32_logits"]["identical"] if isinstance(a["f32_logits"], dict) else a["f32_logits"]
        p(f"   (a) head == upstream: {'PASS' if a['ok'] else 'FAIL'}  kld-base files identical="
          f"{a['kld_base_identical']}  f32 logits identical={f32}")
        b, c = g["b"], g["c"]
        if "skipped" in b:
            p(f"   (b)(c) {'not run' if b['ok'] else 'FAIL'}: {b['skipped']}")
            continue
        p("   (b)         tool maxKLD sameTop   file max|dlogp| maxKLD  sameTop  f32 max|dlogit| ident   W/kv+tail")
        n = b["noise_reference"]
        p(row(f"noise ub{n['ubatch']}", n))
        for win, e in b["windows"].items():
            wl = ",".join(f"{ln['window']}/{ln['kv_size']}+{ln['tail']}" for ln in c["forced"][win]["lines"]) or "-"
            p(row(f"W={win}", e, wl))
        for win, e in b["decode_windows_ub1"].items():
            wl = ",".join(f"{ln['window']}/{ln['kv_size']}+{ln['tail']}" for ln in e["lines"]) or "-"
            p(row(f"W={win} ub1", {"tool": {"lost": 1}, "files": e["files"], "ok": e["ok"]}, wl))
        s = b["sensitivity_one_token_changed"]
        p(f"   sensitivity (1 context token changed): max|dlogp|={s['max_abs_dlogp']:.3g} max KLD={s['max_kld']:.3g}"
          f" same top {s['same_top_pct']:.1f}% -> {'ok' if b['sensitivity_ok'] else 'TOO INSENSITIVE'}")
        p(f"   (b) {'PASS' if b['ok'] else 'FAIL'}   (c) unforced FULLY RESIDENT={c['unforced_fully_resident']},"
          f" unforced bytes == head={c['unforced_identical_to_head']}, forced windows logged with tail="
          f"{all(v['ok'] for v in c['forced'].values())} -> {'PASS' if c['ok'] else 'FAIL'}")
    for arch, d in result.get("fallback", {}).items():
        if "error" in d:
            p(f"== {arch}: (d) ERROR: {d['error']}")
            continue
        if "refused_at_load" in d:
            p(f"== {arch}: (d) window mode refused at load: {d['refused_at_load']!r}, names {d['expected_memory']}="
              f"{d['names_memory']}, names {d['expected_arch']}={d['names_arch']}, drafted tokens (head)="
              f"{d['drafted_tokens']['head']} -> {'PASS' if d['ok'] else 'FAIL'}")
            if "log_tail" in d:
                p("   log tail:\n" + d["log_tail"])
            continue
        if "drafted_tokens" in d:
            p(f"== {arch}: (d) MTP draft context falls back: {d['fallback_line']!r}, names {d['expected_memory']}="
              f"{d['names_memory']}, names {d['expected_arch']}={d['names_arch']}, main context's line names its "
              f"memory={d['main_context_line_names']}, position window logged={d['position_window_logged']}, drafted "
              f"tokens (head/window)={d['drafted_tokens']['head']}/{d['drafted_tokens']['window']}, completion == "
              f"head={d['completion_identical_to_head']} -> {'PASS' if d['ok'] else 'FAIL'}")
            if "log_tail" in d:
                p("   log tail:\n" + d["log_tail"])
            continue
        p(f"== {arch}: (d) window mode falls back: {d['fallback_line']!r}, names {d['expected_memory']}="
          f"{d['names_memory']}" + (f", names {d['expected_arch']}={d['names_arch']}" if d["expected_arch"] else "")
          + f", position window logged={d['position_window_logged']}, bytes == head={d['bytes_identical_to_head']}"
          f" -> {'PASS' if d['ok'] else 'FAIL'}")
        if "log_tail" in d:
            p("   log tail:\n" + d["log_tail"])
    p(f"overall: {'PASS' if result['ok'] else 'FAIL'} ({result['seconds']:.0f}s, work dir {result['work_dir']})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--patched-bin", type=Path, required=True, help="bin dir of the patched build")
    p.add_argument("--upstream-bin", type=Path, required=True, help="bin dir of the unpatched build")
    p.add_argument("--model", type=Path, action="append",
                   help="GGUF to test (repeatable); default: generate tiny llama, gemma3 (iSWA) and jamba (hybrid) models")
    p.add_argument("--archs", default="llama,gemma3,jamba",
                   help="archs to generate when --model is not given (jamba: the hybrid memory, Mamba + attention; "
                        "'' = none, e.g. for --gates d alone)")
    p.add_argument("--work-dir", type=Path, help="keep logs and files here (default: a temp dir, removed on pass)")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--ubatch", type=int, default=128)
    p.add_argument("--chunks", type=int, default=2)
    p.add_argument("--results-ctx", type=int, default=1024, help="context for the llama-results f32 dump")
    p.add_argument("--windows", default="32,128,200,384",
                   help="forced window sizes in cells; include one < --ubatch so a ubatch straddles window and tail")
    p.add_argument("--tool-kld-windows", default="32",
                   help="windows also checked with llama-perplexity --kl-divergence (its stats are often lost "
                        "at exit, so it is a cross-check; the file comparison covers every window)")
    p.add_argument("--decode-windows", default="32,200",
                   help="forced windows also run with -ub 1 (one token per ubatch, like generation)")
    p.add_argument("--force-via", choices=("env", "flag"), default="env",
                   help=f"force the window with ${WINDOW_ENV} or --kv-window-cells")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=int, default=300, help="seconds per tool run")
    p.add_argument("--fallback-archs", default=",".join(["mamba", *make_model.FALLBACK_ARCHS]),
                   help="gate d: archs to generate whose memory window mode does not reach ('' = none): mamba "
                        "(llama_memory_recurrent) and each of gates.fallback_archs (the caches an architecture's own "
                        "create_memory branch builds)")
    p.add_argument("--mtp-archs", default=",".join(f.name for f in make_model.FALLBACK_ARCHS.values() if f.mtp_memory),
                   help="gate d: archs also generated with a NextN block and served by llama-server with draft-mtp, "
                        "whose MTP draft context window mode does not reach ('' = none)")
    p.add_argument("--assistant-pairs", default="gemma4",
                   help="gate d: 'gemma4' also serves a synthetic gemma4 target with a gemma4-assistant draft "
                        "(draft-mtp) whose iSWA cache shares the target's layers: on the copying tail path window mode "
                        "must refuse the assistant at load, naming it ('' = leave it out)")
    p.add_argument("--gates", default="a,b,c,d", help="subset to require for exit 0, e.g. 'a' before the patch exists")
    p.add_argument("--debug", default="",
                   help="OPENCOTI_KV_DEBUG flags for every window run, e.g. span-min: the attention span is the window "
                        "itself and applies to the copying path, so ubatches past it are split (logged and counted)")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    a.windows = [int(x) for x in a.windows.split(",") if x]
    a.decode_windows = [int(x) for x in a.decode_windows.split(",") if x]
    a.tool_kld_windows = [int(x) for x in a.tool_kld_windows.split(",") if x]
    a.required = set(a.gates.split(","))
    if not a.required <= set(CHECKS):
        p.error(f"--gates takes a comma list of {', '.join(CHECKS)}")
    if not a.model and not [x for x in a.archs.split(",") if x] and a.required & {"a", "b", "c"}:
        p.error(f"--archs '' leaves gate(s) {','.join(sorted(a.required - {'d'}))} no model to check; "
                "pass --gates d, or --archs/--model")
    if "d" in a.required and not [x for x in (a.fallback_archs, a.mtp_archs, a.assistant_pairs) if x]:
        p.error("--fallback-archs '', --mtp-archs '' and --assistant-pairs '' leave gate d no model to check; "
                "drop d from --gates")
    a.fallback_archs = [x for x in a.fallback_archs.split(",") if x]
    a.mtp_archs = [x for x in a.mtp_archs.split(",") if x]
    a.assistant_pairs = [x for x in a.assistant_pairs.split(",") if x]
    if not set(a.assistant_pairs) <= {"gemma4"}:
        p.error("--assistant-pairs takes gemma4 (a gemma4 target with a gemma4-assistant draft) or ''")
    no_mtp = [x for x in a.mtp_archs if not (x in make_model.FALLBACK_ARCHS and make_model.FALLBACK_ARCHS[x].mtp_memory)]
    if no_mtp:
        p.error(f"--mtp-archs: no synthetic MTP model for {', '.join(no_mtp)}; known: "
                + ", ".join(f.name for f in make_model.FALLBACK_ARCHS.values() if f.mtp_memory))
    unknown = [x for x in a.fallback_archs if x != "mamba" and x not in make_model.FALLBACK_ARCHS]
    if unknown:
        p.error(f"--fallback-archs: no synthetic model for {', '.join(unknown)}; known: mamba, "
                + ", ".join(make_model.FALLBACK_ARCHS))
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t0 = time.monotonic()
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="forktool-cpu-gates-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        check_own_libraries({"patched": need_tool(a.patched_bin, "llama-perplexity"),
                             "upstream": need_tool(a.upstream_bin, "llama-perplexity")}, dict(os.environ))
    except GateError as e:
        print(f"gates.cpu: {e}", file=sys.stderr)
        return COULD_NOT_RUN
    c = Ctx(a, work)
    models: list[tuple[str, Path]] = []
    if a.model:
        models = [(m.stem, m.resolve()) for m in a.model]
    else:
        for arch in [x for x in a.archs.split(",") if x]:
            out = work / f"synthetic-{arch}.gguf"
            # 4 layers: with gemma3's pattern 2 that is 2 SWA + 2 full-attention layers, enough for
            # a one-token change far back in the context to pass the sensitivity control.
            make_model.main(["-o", str(out), "--arch", arch, "--layers", "4"])
            models.append((arch, out))
    text, text_p, res_text = work / "text.txt", work / "text-perturbed.txt", work / "results-text.txt"
    # ~3 tokens per 2 words here: (chunks+1) x ctx tokens is enough for llama-perplexity's 2*ctx minimum.
    body = make_text(a.ctx * (a.chunks + 1), seed=7)
    text.write_text(body)
    text_p.write_text(perturb_text(body, seed=8))
    res_text.write_text(make_text(a.results_ctx // 3, seed=9))  # fits in --results-ctx with room to spare

    result: dict = {"archs": {}, "tolerance": {
        "tool_max_kld": TOL_TOOL_MAX_KLD, "same_top_pct": TOL_SAME_TOP_PCT, "file_max_abs_dlogp": TOL_MAX_ABS_DLOGP,
        "file_max_kld": TOL_FILE_MAX_KLD, "f32_max_abs_dlogit": TOL_MAX_ABS_DLOGIT,
        "sensitivity_factor": SENSITIVITY_FACTOR},
        "config": {"ctx": a.ctx, "ubatch": a.ubatch, "chunks": a.chunks, "windows": a.windows,
                   "threads": a.threads, "force_via": a.force_via,
                   "patched_bin": str(a.patched_bin), "upstream_bin": str(a.upstream_bin)}}
    ok = True
    for name, model in models:
        g: dict = {"model": str(model), "model_sha256": sha256(model)}
        try:
            ag = ArchGates(c, name, model, text, text_p, res_text)
            g["a"] = ag.gate_a()
            g["b"], g["c"] = ag.gate_bc() if ({"b", "c"} & a.required) else (
                {"ok": True, "skipped": "not requested"}, {"ok": True, "skipped": "not requested"})
            ok = ok and all(g[k]["ok"] for k in a.required - {"d"})  # d runs on its own models below
        except GateError as e:
            g["error"] = str(e)
            ok = False
        result["archs"][name] = g
    if "d" in a.required:
        result["fallback"] = {}
        for arch in a.fallback_archs:
            out = work / f"synthetic-{arch}.gguf"
            make_model.main(["-o", str(out), "--arch", arch, "--layers", "2"])
            try:
                result["fallback"][arch] = d = gate_d(c, arch, out, text)
                ok = ok and d["ok"]
            except GateError as e:
                result["fallback"][arch] = {"error": str(e), "ok": False}
                ok = False
        for arch in a.mtp_archs:
            out = work / f"synthetic-{arch}-mtp.gguf"
            make_model.main(["-o", str(out), "--arch", arch, "--layers", "2", "--nextn", "1"])
            try:
                result["fallback"][f"{arch}+mtp"] = d = gate_d_mtp(c, arch, out, text)
                ok = ok and d["ok"]
            except GateError as e:
                result["fallback"][f"{arch}+mtp"] = {"error": str(e), "ok": False}
                ok = False
        for _pair in a.assistant_pairs:  # gemma4: the target, then its assistant at its own width
            tgt, dft = work / "synthetic-gemma4.gguf", work / "synthetic-gemma4-assistant.gguf"
            make_model.main(["-o", str(tgt), "--arch", "gemma4", "--layers", "4"])
            make_model.main(["-o", str(dft), "--arch", "gemma4-assistant", "--layers", "2", "--n-embd", "128"])
            try:
                result["fallback"]["gemma4-assistant"] = d = gate_d_mtp(c, "gemma4-assistant", tgt, text, draft=dft)
                ok = ok and d["ok"]
            except GateError as e:
                result["fallback"]["gemma4-assistant"] = {"error": str(e), "ok": False}
                ok = False
    result.update(ok=bool(ok), seconds=round(time.monotonic() - t0, 1), work_dir=str(work), runs=c.runs)
    print(json.dumps(result, indent=2))
    summarize(result)
    for name, verdict, why in gate_parts(result, a.required):
        report_part(name, verdict, why)
    if ok and not a.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
