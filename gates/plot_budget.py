"""Plot decode and prefill against the device-memory budget from gate (g)'s budget_curve.csv, one row per context."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gates.common import card_names  # noqa: E402
from gates.plot import num  # noqa: E402

STYLE = {"f16": "o", "q8_0": "s", "q4_0": "^"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.plot_budget", description=__doc__)
    ap.add_argument("csv", type=Path)
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)
    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    ctxs = sorted({int(r["ctx"]) for r in rows})
    if not ctxs:
        raise SystemExit(f"{a.csv}: no rows")
    # the card of each point, from the side file's per-point provenance (gate g writes it): a curve assembled from
    # calls on different cards says so in each row's title
    side = a.csv.with_suffix(".json")
    points = (json.loads(side.read_text()).get("points") or {}) if side.is_file() else {}

    def cards(ctx: int) -> str:
        return card_names([d for k, v in points.items() if k.split()[0] == str(ctx) for d in v.get("device") or []])

    fig, axes = plt.subplots(len(ctxs), 2, figsize=(13, 4.8 * len(ctxs)), squeeze=False)
    for (ax_pp, ax_tg), ctx in zip(axes, ctxs, strict=True):
        at = [r for r in rows if int(r["ctx"]) == ctx]
        configs = sorted({r["config"] for r in at})
        for ax, key, label in ((ax_pp, "prefill_tps", "prefill tokens/s"), (ax_tg, "decode_tps", "decode tokens/s")):
            for config in configs:
                pts = sorted((int(r["budget_mib"]), num(r[key])) for r in at
                              if r["config"] == config and r["fits_budget"] == "True" and num(r[key]))
                if not pts:
                    continue
                cache = next((c for c in STYLE if f" {c}" in config), "f16")
                if config.startswith("window"):
                    line = "-." if "--" in config else "-"  # a setting besides the cache type
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLE[cache] + line, lw=2, label=config)
                elif "-nkvo" in config:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "r:", label=config)
                elif "sized" in config:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLE[cache] + ":", color="gray", alpha=0.7,
                            label=config)
                else:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLE[cache] + "--", alpha=0.8, label=config)
            ax.set_xlabel("device memory budget (MiB, nvidia-smi, CUDA context included)")
            ax.set_ylabel(label)
            ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
            ax.set_title(f"ctx {ctx:,} ({cards(ctx)}): {label}")
        ax_tg.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{card_names([d for v in points.values() for d in v.get('device') or []])}, synthetic 8-layer "
                 f"llama, same prompt: each configuration at the budgets it fits")
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
