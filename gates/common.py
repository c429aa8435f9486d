"""What every gate shares: the log lines they read, the tolerances, tool lookup, generated text, tool statistics."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from gates import make_model

WINDOW_ENV = "LLAMA_ARG_KV_WINDOW_CELLS"
DEBUG_ENV = "OPENCOTI_KV_DEBUG"  # the KV window's one debug variable (comma-separated flags)
# kv-attention-span: llama_decode retrying a batch in smaller ubatches (a debug line: -lv 5)
RE_SPAN_SPLIT = re.compile(r"retrying batch size \d+ in ubatches of (\d+) \(attention span\)")
RE_WINDOW = re.compile(r"position window = (\d+) / (\d+) cells resident \+ host tail (\d+) cells \(([\d.]+) MiB host\)")
# 0073's carry trial: once a context, whether the tail ring kept carrying chunks from one decode graph into the next,
# with the two medians it compared (a token carrying, a token not)
RE_CARRY_TRIAL = re.compile(r"tail ring: ring-carry (kept|dropped): a token took ([\d.]+) ms carrying, ([\d.]+) ms not")
RE_FULL = re.compile(r"FULLY RESIDENT")
RE_FULL_LINE = re.compile(r"position window = FULLY RESIDENT \((\d+) / (\d+) cells")
RE_STAT = {
    "mean_kld": re.compile(r"Mean\s+KLD:\s+(-?[\d.]+)"),
    "max_kld": re.compile(r"Maximum KLD:\s+(-?[\d.]+)"),
    "same_top_pct": re.compile(r"Same top p:\s+([\d.]+)"),
    "ppl": re.compile(r"Final estimate: PPL = ([\d.]+)"),
}

# Tolerances for window vs resident (docs/gates.md has the reasoning and the measured numbers).
# llama.cpp's CPU flash attention is not bit-stable across batch shapes: a ubatch below 64 rows takes
# the f16-accumulator path instead of the f32 tiled one, moving logits by 0.02-0.04 (measured).
# A window that changes how the KV rows are grouped may legitimately land anywhere in that noise band,
# so the bounds below sit at 1.3-2.5x that measured noise; each run re-measures it (-ub 32 vs -ub N) and
# reports it, and a one-token change in the context must move logits >= 10x the bound (sensitivity).
TOL_MAX_ABS_DLOGIT = 0.08    # full f32 logits (llama-results), logit std ~3; ub noise 0.04
TOL_MAX_ABS_DLOGP = 0.05     # log-probs from the 16-bit --kl-divergence-base files (step <= 16/65535)
TOL_FILE_MAX_KLD = 2e-4      # KLD from those files; ubatch noise measured 8e-5
TOL_TOOL_MAX_KLD = 2e-4      # llama-perplexity --kl-divergence: identical logits already read 3.8e-5
                             # (its base is 16-bit), ubatch noise more; the brief's 1e-6 is below that floor
TOL_SAME_TOP_PCT = 99.0      # ubatch noise flipped 1 of 255 top tokens (99.6 %) via the tool


class GateError(Exception):
    """A gate could not run (missing binary, tool crashed): reported, never silently skipped."""


# A gate program's exit status when it could not run at all (a tool, model or build it needs is missing): nothing
# was checked, and `forktool gates` reports the gate as not checked (with the program's last line), not as failed.
COULD_NOT_RUN = 2


def could_not_run(msg: str) -> NoReturn:
    """Stop a gate program that cannot run, saying what is missing and what to do (exit COULD_NOT_RUN)."""
    print(msg, file=sys.stderr, flush=True)
    sys.exit(COULD_NOT_RUN)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def report_part(name: str, verdict: str, why: str = "") -> None:
    """The line `forktool gates` reads for each part of a gate that ran: verdict pass, fail or not checked."""
    assert verdict in ("pass", "fail", "not checked"), verdict
    why = " ".join(why.split())
    log(f"forktool-gate-part {name}: {verdict}" + (f": {why}" if why else ""))


def write_whole(path: Path, text: str) -> None:
    """Write a result file a call keeps rewriting as it measures (the curve, its JSON, gate h's points, the gates'
    JSON): into a sibling first, then renamed over it, so a call killed mid-write (its time limit) leaves the last
    whole file, never a truncated one that the next call would read its earlier rows from."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, newline="")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tool(bin_dir: Path, name: str) -> Path | None:
    p = bin_dir / name
    return p if p.is_file() and os.access(p, os.X_OK) else None


def need_tool(bin_dir: Path, name: str) -> Path:
    p = tool(bin_dir, name)
    if p is None:
        raise GateError(f"{name} not found in {bin_dir} (build it: make {name})")
    return p


# The shared libraries a build brings beside its programs. CMake writes RUNPATH ($ORIGIN), which the dynamic loader
# searches after LD_LIBRARY_PATH: a directory of another build named there (a host build unpacked on the GPU machine,
# say) would lend its libllama and libggml to this build's programs, and a row named upstream would run the fork.
BUILD_LIBRARIES = ("libllama", "libggml", "libmtmd")
RE_LOADED = re.compile(r"^\s*(\S+) => (.+?)(?: \(0x[0-9a-f]+\))?$")


def program_of(argv: list[str]) -> Path | None:
    """The build's program an argv runs: its first word named llama-* (argv[0], or after a profiler or sanitizer)."""
    for w in argv:
        if Path(w).name.startswith("llama-"):
            return Path(w)
    return None


def own_libraries_env(argv: list[str], env: dict) -> dict:
    """env with the directory of argv's program leading LD_LIBRARY_PATH, so the program loads its own build's
    libraries whatever else LD_LIBRARY_PATH names (see BUILD_LIBRARIES)."""
    program = program_of(argv)
    if program is None:
        return dict(env)
    own = str(program.resolve().parent)
    rest = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d and d != own]
    return dict(env, LD_LIBRARY_PATH=":".join([own, *rest]))


def linked_libraries(program: Path, env: dict) -> dict[str, str]:
    """{library name: the path it resolves to, or 'not found'} for program under env: the dynamic loader's own answer
    (LD_TRACE_LOADED_OBJECTS, what ldd uses; the program itself does not run)."""
    p = subprocess.run([str(program)], env=dict(env, LD_TRACE_LOADED_OBJECTS="1"), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    text = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        raise GateError(f"{program}: the dynamic loader could not list its libraries (exit {p.returncode}): "
                        f"{text.strip()[:300]}")
    return {m.group(1): m.group(2).strip() for m in map(RE_LOADED.match, text.splitlines()) if m}


def foreign_libraries(program: Path, env: dict) -> list[str]:
    """The build libraries (BUILD_LIBRARIES) that program would load from outside its own directory under env, or
    not find at all, as 'name => path' lines (linked_libraries)."""
    own = program.resolve().parent
    return [f"{name} => {where}" for name, where in linked_libraries(program, env).items()
            if name.startswith(BUILD_LIBRARIES) and (where == "not found" or Path(where).resolve().parent != own)]


def check_own_libraries(programs: dict[str, Path], env: dict) -> dict[str, str]:
    """For each named build's program: run as the gates run it (own_libraries_env), every build library it loads
    comes from its own directory, or GateError says which came from where and what to do. Returns {name: that
    directory} for the results."""
    seen: dict[str, str] = {}
    for name, program in programs.items():
        bad = foreign_libraries(program, own_libraries_env([str(program)], env))
        if bad:
            raise GateError(f"the {name} build's {program.name} would load libraries of another build or none: "
                            f"{'; '.join(bad)}. Put the build's shared libraries beside {program} (copy its whole "
                            f"bin directory) and run again")
        seen[name] = str(program.resolve().parent)
    return seen


# The compiler a build's programs were made with, as its version line says ("... built with GNU 13.3.0 for Linux
# x86_64"). Two builds of the same sources made by different compilers run at different speeds (on the H200 the
# series' libllama made by GCC 12.2 prefilled at about 0.78 of the same sources made by GCC 13.3): a ratio between
# builds of different compilers measures the compilers too.
RE_BUILT_WITH = re.compile(r"built with (.+?) for (\S.*?)\s*$", re.M)


def build_compiler(program: Path, env: dict) -> str | None:
    """'COMPILER for TARGET' from `program --version` (run as the gates run it), or None where it says neither."""
    p = subprocess.run([str(program), "--version"], env=own_libraries_env([str(program)], env), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    m = RE_BUILT_WITH.search(p.stdout.decode("utf-8", "replace"))
    return f"{m.group(1)} for {m.group(2)}" if m else None


def compilers_differ(compilers: dict[str, str | None], a: str, b: str) -> str | None:
    """Why builds a and b cannot be compared on speed alone (different or unknown compilers), or None."""
    ca, cb = compilers.get(a), compilers.get(b)
    if ca is None or cb is None:
        unknown = " and ".join(n for n, c in ((a, ca), (b, cb)) if c is None)
        return f"the {unknown} build does not say which compiler made it (no 'built with' in its --version)"
    if ca != cb:
        return (f"the {a} build was made with {ca}, the {b} build with {cb}: a ratio between them measures the "
                f"compilers too (build both with one toolchain, e.g. both on the GPU machine)")
    return None


def supports_flag(binary: Path, flag: str) -> bool:
    """True when `binary --help` lists flag: tells a patched build from an unpatched one."""
    p = subprocess.run([str(binary), "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    return flag in p.stdout.decode("utf-8", "replace")


def rotated(items: list, rep: int) -> list:
    """items in repetition rep's order: the list turned by rep places, so each leads in turn and takes every place
    as often as the repetitions allow. Timed runs interleaved in a fixed order are not comparable: on the H200 the
    same path decoded 3-5 % faster in the third of three places than in the second (two copies a chunk read 0.905 of
    resident in second place in one call and 0.954 in third in another; docs/gates.md, twenty-fifth round)."""
    k = rep % len(items) if items else 0
    return items[k:] + items[:k]


def make_text(n_words: int, seed: int) -> str:
    """Deterministic prose from the synthetic vocab's words, with punctuation and digits for byte tokens."""
    rng = random.Random(seed)
    words = make_model.WORDS
    out: list[str] = []
    for _ in range(n_words):
        w = rng.choice(words)
        if rng.random() < 0.1:
            w = w.capitalize()
        out.append(w)
        r = rng.random()
        if r < 0.06:
            out[-1] += "."
        elif r < 0.08:
            out[-1] += f" {rng.randrange(100000)}"
    return " ".join(out) + "\n"


def parse_stats(text: str) -> dict:
    """llama-perplexity's KLD / same-top / PPL statistics from its log."""
    out = {}
    for k, rx in RE_STAT.items():
        m = rx.search(text)
        if m:
            out[k] = float(m.group(1))
    return out


def carry_trials(text: str) -> list[dict]:
    """Every carry trial's decision in a log: [{kept, carrying_ms, not_carrying_ms}], one a context that tried."""
    return [{"kept": m[1] == "kept", "carrying_ms": float(m[2]), "not_carrying_ms": float(m[3])}
            for m in RE_CARRY_TRIAL.finditer(text)]


def parse_windows(text: str) -> list[dict]:
    """Every `position window = W / kv cells resident + host tail T` line of a log."""
    return [{"window": int(m[1]), "kv_size": int(m[2]), "tail": int(m[3]), "host_mib": float(m[4])}
            for m in RE_WINDOW.finditer(text)]


def ensure_model(path: Path, args: list[str]) -> Path:
    """A synthetic GGUF made by make_model with args (deterministic bytes), reused only while it is the one made here.

    Beside it, `<name>.stamp` records the arguments and the file's sha256; a model without a stamp, made with other
    arguments, or whose bytes changed since (a run cut short, an older generator, a file put there by hand) is made
    again. The model is written under a temporary name and renamed, so a cut-short run never leaves half a model.
    """
    stamp = path.with_name(path.name + ".stamp")
    if path.is_file() and stamp.is_file():
        try:
            rec = json.loads(stamp.read_text())
        except ValueError:
            rec = {}
        if rec.get("args") == list(args) and rec.get("sha256") == sha256(path):
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    part = path.with_name(path.stem + ".part" + path.suffix)
    if make_model.main(["-o", str(part), *args]) != 0:
        part.unlink(missing_ok=True)
        raise GateError(f"make_model failed for {path}")
    os.replace(part, path)
    stamp.write_text(json.dumps({"args": list(args), "sha256": sha256(path)}))
    return path


def card_names(devices: list[str]) -> str:
    """The cards a result recorded (device_cards' strings: name, memory, driver) as a title names them, e.g. 'H200'
    or 'H100 80GB HBM3 and H200'; 'card not recorded' where none was."""
    names = sorted({d.split(",")[0].strip().removeprefix("NVIDIA ").strip() for d in devices if d.strip()})
    return " and ".join(names) if names else "card not recorded"


def device_cards(env: dict | None = None) -> list[str]:
    """The cards this machine shows (nvidia-smi: name, total memory, driver), one string each, recorded beside every
    gate's result so that each figure says which card gave it; empty where nvidia-smi is missing or fails."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip()] if r.returncode == 0 else []
