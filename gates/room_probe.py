"""What the prefill copy's room costs a budget-sized window: one declared context and one --vram-target, the window
as it is by default (its compute reserve holds the room) against the window with --no-kv-prefill-copy (no room: the
window keeps those bytes as cells) and against OPENCOTI_KV_DEBUG=no-tail-segments (neither the room nor the decode
segments), beside a reference build at a context sized to the prompt; the runs interleaved, repeated, and reported as
medians with the cells each kept in device memory and the device-memory peak. With --ref-bin (an upstream build) the
window build in head mode runs beside the reference too, so one call also says whether head mode is upstream's
speed at that context. Each run's ratio to the reference of its own repetition is reported as well (paired: drift
within a call moves both).

    python3 -m gates.room_probe --bin B [--ref-bin U] [--ctx 1048576] [--target 1844] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

from gates.common import (
    GateError,
    build_compiler,
    check_own_libraries,
    compilers_differ,
    ensure_model,
    make_text,
    need_tool,
)
from gates.gpu import MODEL_ARGS, completion, run, strip


def variant(v: str) -> tuple[list[str], list[str]]:
    """A --variants item as (OPENCOTI_KV_DEBUG flags, more command-line arguments): the words before the first that
    starts with -- are flags, that word and the rest are arguments."""
    words = v.split()
    at = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    return words[:at], words[at:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.room_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="CUDA build of the whole series")
    ap.add_argument("--ref-bin", type=Path, help="the reference build (default: --bin in head mode)")
    ap.add_argument("--ctx", type=int, default=1048576)
    ap.add_argument("--target", type=int, default=1844, help="--vram-target of the window runs (MiB)")
    ap.add_argument("--words", type=int, default=30000, help="gate d's prompt (35,131 tokens)")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", nargs="*", default=["", "--no-kv-prefill-copy", "no-tail-segments"],
                    help="last on the line (its items may start with --): the window runs, one item each, "
                         "OPENCOTI_KV_DEBUG flags, then from the first word that starts with -- more command-line "
                         "arguments ('' = the window as it is; 'tail-ring --no-kv-prefill-copy' sets both; a later "
                         "--vram-target replaces --target)")
    ap.add_argument("--model", type=Path, help="default: the gates' synthetic model in --work")
    ap.add_argument("--work", type=Path, default=Path("build/gpu-gates"))
    ap.add_argument("--out", type=Path, default=Path("build/gpu-gates/room_probe.json"))
    argv = list(sys.argv[1:] if argv is None else argv)
    variants = None
    if "--variants" in argv:  # everything after it is its items, which argparse would read as options
        at = argv.index("--variants")
        argv, variants = argv[:at], argv[at + 1:]
    a = ap.parse_args(argv)
    if variants is not None:
        a.variants = variants
    a.work.mkdir(parents=True, exist_ok=True)
    try:
        check_own_libraries({"window": need_tool(a.bin, "llama-completion")}
                            | ({"reference": need_tool(a.ref_bin, "llama-completion")} if a.ref_bin else {}),
                            dict(os.environ))
    except GateError as e:
        print(f"gates.room_probe: {e}", file=sys.stderr)
        return 2
    compilers = {"window": build_compiler(need_tool(a.bin, "llama-completion"), dict(os.environ))}
    if a.ref_bin:
        compilers["reference"] = build_compiler(need_tool(a.ref_bin, "llama-completion"), dict(os.environ))
    differ = compilers_differ(compilers, "window", "reference") if a.ref_bin else None
    if differ:
        print(f"note: {differ}", flush=True)
    model = a.model or ensure_model(a.work / "synthetic-8l-2048.gguf", MODEL_ARGS)
    measure = shutil.which("nvidia-smi") is not None  # the device-memory peak, where nvidia-smi can say it
    prompt = a.work / "prompt-d.txt"
    prompt.write_text(make_text(a.words, 5))
    window = ["--kv-residency-mode", "window", "-fit", "off", "--vram-target", str(a.target)]
    configs: dict[str, tuple[list[str], dict]] = {}
    for v in a.variants:
        flags, extra = variant(v)
        env = {"OPENCOTI_KV_DEBUG": ",".join(flags)} if flags else {}
        configs[f"window f16 ctx {a.ctx}" + (f" {v}" if v else "")] = (
            completion(a.bin, model, a.ctx, prompt, a.n, window + extra), env)
    runs: dict[str, list[dict]] = {k: [] for k in configs}
    sized = 0
    for rep in range(a.reps):
        for name, (argv_, env) in configs.items():
            r = strip(run(f"room-{len(runs[name])}-{rep}-{name.replace(' ', '_')}", argv_, a.work, env, measure=measure))
            runs[name].append(r)
            sized = sized or (r.get("prompt_tokens", 0) + a.n + 1023) // 1024 * 1024
            print(f"{name}: rc {r['rc']} peak {r.get('device_mib_peak')} MiB, prefill {r.get('prefill_tps')}, "
                  f"decode {r.get('decode_tps')}, window {r.get('window')}, device cells {r.get('device_cells')}"
                  + (f", layers with a granule more {r['granule_layers']}" if r.get("granule_layers") else ""),
                  flush=True)
        if sized:
            refs = [(f"reference f16 ctx {sized}" + ("" if a.ref_bin else " (head mode)"), a.ref_bin or a.bin, [])]
            if a.ref_bin:  # the window build on upstream's code path, at the reference's context
                refs.append((f"head mode f16 ctx {sized}", a.bin, ["--kv-residency-mode", "head"]))
            for i, (name, b, extra) in enumerate(refs):
                r = strip(run(f"room-ref{i or ''}-{rep}", completion(b, model, sized, prompt, a.n, extra), a.work,
                              measure=measure))
                runs.setdefault(name, []).append(r)
                print(f"{name}: rc {r['rc']} peak {r.get('device_mib_peak')} MiB, prefill {r.get('prefill_tps')}, "
                      f"decode {r.get('decode_tps')}", flush=True)
    summary = {}
    for name, rs in runs.items():
        ok = [r for r in rs if r["rc"] == 0 and r.get("decode_tps")]
        summary[name] = {
            "runs": len(rs), "ok": len(ok),
            "decode_tps_median": statistics.median(r["decode_tps"] for r in ok) if ok else None,
            "prefill_tps_median": statistics.median(r["prefill_tps"] for r in ok) if ok else None,
            "device_mib_peak_max": max((r.get("device_mib_peak") or 0) for r in rs),
            "device_cells": sorted({r.get("device_cells") for r in rs if r.get("device_cells") is not None}),
            "granule_layers": rs[-1].get("granule_layers"),
            "window": rs[-1].get("window"),
            "compute_mib": rs[-1].get("compute_mib"),
        }
    ref_name = next((k for k in summary if k.startswith("reference")), None)
    ref = summary[ref_name]["decode_tps_median"] if ref_name else None
    for name, v in summary.items():
        v["decode_over_reference"] = round(v["decode_tps_median"] / ref, 3) if ref and v["decode_tps_median"] else None
        # each run against the reference run of its own repetition (a repetition without a reference run is left out)
        pairs = [r["decode_tps"] / q["decode_tps"] for r, q in zip(runs[name], runs.get(ref_name, []), strict=False)
                 if r["rc"] == 0 and r.get("decode_tps") and q["rc"] == 0 and q.get("decode_tps")]
        v["decode_over_reference_paired"] = round(statistics.median(pairs), 3) if pairs else None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"ctx": a.ctx, "vram_target_mib": a.target, "compilers": compilers,
                                 **({"compilers_differ": differ} if differ else {}), "summary": summary, "runs": runs},
                                indent=1))
    print(json.dumps(summary, indent=1))
    return 0 if all(v["ok"] == v["runs"] for v in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
