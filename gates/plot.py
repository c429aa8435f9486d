"""Plot prefill and decode against the tail share of the prompt from gate (d)'s CSV and its JSON side file."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gates.common import card_names  # noqa: E402


def num(v: str) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.plot", description=__doc__)
    ap.add_argument("csv", type=Path)
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)
    with open(a.csv) as f:
        rows = list(csv.DictReader(f))
    meta_path = a.csv.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    n_prompt = meta.get("prompt_tokens") or next((num(r["prompt_tokens"]) for r in rows if num(r["prompt_tokens"])), 0)
    link_gbps = (meta.get("link") or {}).get("pinned_gbps")
    cell = meta.get("kv_bytes_per_cell", 16384)

    def series(config: str) -> list[dict]:
        pts = [r for r in rows if r["config"] == config and num(r["decode_tps"]) and num(r["prefill_tps"])]
        return sorted(pts, key=lambda r: float(r["tail_share"]))

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.4))
    for ax, key, label in ((ax1, "prefill_tps", "prefill tokens/s"), (ax2, "decode_tps", "decode tokens/s")):
        before = meta.get("before") or "the build compared as before"
        for config, style, name in (("window", "o-", "rolling KV window (forced, this build)"),
                                    ("window before", "s--", f"rolling KV window, {before}")):
            pts = series(config)
            if pts:
                ax.plot([100 * float(r["tail_share"]) for r in pts], [float(r[key]) for r in pts], style, label=name)
        sized = sorted((r for r in rows if r["config"].startswith("window --vram-target") and num(r[key])),
                       key=lambda r: float(r["tail_share"]))
        if sized:
            mibs = [r["config"].rsplit(" ", 1)[1] for r in sized]
            ax.plot([100 * float(r["tail_share"]) for r in sized], [float(r[key]) for r in sized], "kx", ms=8,
                    label=f"window sized by --vram-target {min(mibs)}-{max(mibs)} MiB")
        for r in rows:
            y = num(r[key])
            if y is None:
                continue
            if r["config"] == "upstream --no-kv-offload":
                ax.axhline(y, color="red", ls=":", label="upstream --no-kv-offload (all KV on host)")
            elif r["config"].startswith("upstream q8_0"):
                fits = 100 * float(r["tail_share"])
                ax.hlines(y, 0, fits, color="green", ls="-.", label=f"upstream q8_0 KV (fits up to {fits:.0f} % tail)")
        if key == "decode_tps" and link_gbps and n_prompt:
            xs = [s / 2 for s in range(2, 201)]
            ax.plot(xs, [link_gbps * 1e9 / (x / 100 * n_prompt * cell) for x in xs], color="gray", lw=1,
                    label=f"link limit ({link_gbps:.0f} GB/s pinned, used tail read once per token)")
        ax.set_xlabel("share of the prompt in the host tail (%)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    fig.legend(*ax2.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)  # under both plots
    fig.suptitle(f"{card_names(meta.get('device') or [])}, synthetic 8-layer llama, f16 K/V, flash attention, "
                 f"ctx {meta.get('ctx', '?')}, "
                 f"prompt {int(n_prompt) if n_prompt else '?'} tokens")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(a.output, dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
