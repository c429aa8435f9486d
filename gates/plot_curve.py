"""Plot the host-tail vs tokens/s curve from the GPU gate's CSV (docs/gpu/rolling_kv_curve.csv)."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv", type=Path)
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    win = [r for r in rows if r["config"].startswith("window")]
    base = [r for r in rows if not r["config"].startswith("window")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((ax1, "prefill_tps", "prefill tokens/s"), (ax2, "decode_tps", "decode tokens/s")):
        xs = [float(r["host_tail_mib"]) for r in win]
        ys = [float(r[key]) for r in win]
        ax.plot(xs, ys, "o-", label="rolling KV window (--vram-target sweep)")
        for r, x, y in zip(win, xs, ys, strict=True):
            ax.annotate(f"{r['resident_cells']} cells" if r["vram_target_mib"] != "0" else "fully resident",
                        (x, y), textcoords="offset points", xytext=(4, 6), fontsize=7)
        for r in base:
            ax.scatter([float(r["host_tail_mib"])], [float(r[key])], marker="x", color="red", s=60,
                       label="upstream --no-kv-offload (all KV on host)")
        ax.set_xlabel("host tail (MiB)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    ax1.legend(fontsize=7, loc="lower left")
    prompt = win[0]["prompt_tokens"] if win else "?"
    fig.suptitle(f"H200, synthetic 8-layer 0.49B llama, f16 K/V, flash attention, ctx 131072, prompt {prompt} tokens")
    fig.tight_layout()
    fig.savefig(a.output, dpi=120)


if __name__ == "__main__":
    main()
