"""How a decoded token's time depends on the host tail it reads, fitted two ways, and the tail targets.

* sum model: ms = fixed + MiB x ms_per_mib (the tail is read after the device part's work, never beside it)
* max model: ms = max(compute, MiB x ms_per_mib) (the tail is read beside the device part's work)

Both have two parameters, so their residual sums of squares compare directly: the measurements "follow" the model
with the smaller one. The targets: decode with 1 % of the prompt past the cells in device memory (the forced window
nearest that share; a device part is whole mapping granules) against fully resident (>= 0.9), and
decode with nearly all of it in the tail against the link's limit, the pinned bandwidth over the tail bytes a token
reads (>= 0.9).

`python -m gates.tail_models CURVE.csv --link-gbps G` reads a gate d curve (`rolling_kv_curve.csv`, written by
`gates.gpu`) and prints both fits and the targets; `--gate-f JSON` adds the gate f points recorded in a
`gpu_gates.json`. Measurement only: nothing here fails a gate.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

MIB = 1 << 20
SMALL_TAIL = 0.01
TARGET = 0.9
# the shares a target may be read at: a curve without a point there leaves the target not checked (met None)
SMALL_TAIL_MAX = 0.03
LARGE_TAIL_MIN = 0.95


def _rss(pts: list[tuple[float, float]], f) -> float:
    return sum((y - f(x)) ** 2 for x, y in pts)


def line_fit(pts: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares (intercept, slope) of y = intercept + x * slope over (x, y) points; None when x does not vary."""
    if len(pts) < 2:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return my - slope * mx, slope


def sum_fit(pts: list[tuple[float, float]]) -> dict:
    """Least squares ms = fixed + MiB x ms_per_mib over (MiB, ms) points."""
    line = line_fit(pts)
    if line is None:
        return {}
    fixed, slope = line
    return {"fixed_ms": round(fixed, 4), "ms_per_mib": round(slope, 6),
            "rss": round(_rss(pts, lambda x: fixed + slope * x), 6)}


def max_fit(pts: list[tuple[float, float]]) -> dict:
    """Least squares ms = max(compute, MiB x ms_per_mib): the points sorted by MiB, the first k compute-bound (their
    mean is compute), the rest link-bound (a line through the origin); the best k whose split is consistent."""
    if len(pts) < 2:
        return {}
    pts = sorted(pts)
    best: dict = {}
    for k in range(len(pts) + 1):
        head, rest = pts[:k], pts[k:]
        c = statistics.fmean(y for _, y in head) if head else None
        sxx = sum(x * x for x, _ in rest)
        if rest and sxx == 0:
            continue
        s = sum(x * y for x, y in rest) / sxx if rest else 0.0
        if rest and head and not (all(s * x <= c for x, _ in head) and all(s * x >= c for x, _ in rest)):
            continue
        if not rest and len(head) < len(pts):
            continue
        floor = c if c is not None else 0.0
        rss = _rss(pts, lambda x, floor=floor, s=s: max(floor, s * x))
        if not best or rss < best["rss"]:
            best = {"compute_ms": None if c is None else round(c, 4), "ms_per_mib": round(s, 6),
                    "rss": round(rss, 6), "compute_bound_points": k}
    return best


def compare(pts: list[tuple[float, float]]) -> dict:
    """Both fits, and which one the points follow (the smaller residual sum of squares)."""
    sf, mf = sum_fit(pts), max_fit(pts)
    out = {"points": [{"tail_mib_per_token": round(x, 2), "ms_per_token": round(y, 4)} for x, y in sorted(pts)],
           "sum": sf, "max": mf}
    if sf and mf:
        small, large = sorted((sf["rss"], mf["rss"]))
        if len(pts) < 3 or small == large:
            out["follows"] = "undecided"  # two points fit both models exactly
        else:
            out["follows"] = "sum" if sf["rss"] < mf["rss"] else "max"
            out["rss_ratio"] = round(large / small, 1) if small > 0 else None
    return out


def device_cells(r: dict) -> int:
    """The cells a row's K/V tensors really keep in device memory: the mapped tail's own count where the row has it
    (the window rounded down to the mapping granularity), else the window the sizer kept."""
    v = r.get("device_cells")
    return int(v) if v not in (None, "") else int(r["resident_cells"])


def past_device_share(r: dict) -> float:
    """The share of a row's prompt past the cells its K/V keep in device memory (its forced share where the row does
    not say how many prompt tokens it had)."""
    if not r.get("prompt_tokens"):
        return float(r["tail_share"])
    n_prompt = int(r["prompt_tokens"])
    return round(max(0, n_prompt - device_cells(r)) / n_prompt, 4)


def curve_points(rows: list[dict], n_decoded: int, bytes_per_cell: int) -> list[tuple[float, float]]:
    """(tail MiB read per token, ms per token) of a gate d curve's forced-window rows (config "window"): the tail a
    token reads is the prompt past the cells in device memory, plus half the decoded tokens (the average over the
    decode)."""
    pts = []
    for r in rows:
        if r.get("config") != "window" or str(r.get("rc")) != "0" or not r.get("decode_tps"):
            continue
        n_prompt, cells = int(r["prompt_tokens"]), device_cells(r)
        tail = max(0.0, n_prompt + n_decoded / 2 - cells) if cells < n_prompt + n_decoded else 0.0
        pts.append((tail * bytes_per_cell / MIB, 1000.0 / float(r["decode_tps"])))
    return pts


def tail_targets(rows: list[dict], link_gbps: float, n_decoded: int, bytes_per_cell: int) -> dict:
    """Decode at the small tail (the forced share nearest 1 %) against fully resident, and at the largest tail
    share against the link's limit (link_gbps over the tail bytes a token reads)."""
    win = [r for r in rows if r.get("config") == "window" and str(r.get("rc")) == "0" and r.get("decode_tps")]
    res = [r for r in win if float(r["tail_share"]) == 0.0]
    tails = [r for r in win if float(r["tail_share"]) > 0.0]
    out: dict = {}
    # the small tail is judged at the share really past device memory (a device part is whole mapping granules, so
    # a forced window can keep fewer cells there than it names); rows with none past it are no tail at all
    small_tails = [r for r in tails if past_device_share(r) > 0.0]
    if res and small_tails:
        small = min(small_tails, key=lambda r: abs(past_device_share(r) - SMALL_TAIL))
        ratio = float(small["decode_tps"]) / float(res[0]["decode_tps"])
        past = past_device_share(small)
        out["small_tail"] = {"tail_share": float(small["tail_share"]), "decode_tps": float(small["decode_tps"]),
                             "resident_decode_tps": float(res[0]["decode_tps"]), "ratio": round(ratio, 3),
                             "target": TARGET, "met": ratio >= TARGET}
        if small.get("prompt_tokens"):
            out["small_tail"]["device_tail_share"] = past
        if past > SMALL_TAIL_MAX:
            out["small_tail"] |= {"met": None, "note": f"not checked: no forced window with at most {SMALL_TAIL_MAX} "
                                  f"of the prompt past device memory (the smallest is {past})"}
    if tails and link_gbps > 0:
        large = max(tails, key=lambda r: float(r["tail_share"]))
        n_prompt, cells = int(large["prompt_tokens"]), device_cells(large)
        tail_bytes = (n_prompt + n_decoded / 2 - cells) * bytes_per_cell
        limit = link_gbps * 1e9 / tail_bytes
        ratio = float(large["decode_tps"]) / limit
        out["large_tail"] = {"tail_share": float(large["tail_share"]), "decode_tps": float(large["decode_tps"]),
                             "tail_mib_per_token": round(tail_bytes / MIB, 1), "link_gbps": link_gbps,
                             "link_limit_tps": round(limit, 2), "ratio": round(ratio, 3), "target": TARGET,
                             "met": ratio >= TARGET}
        if float(large["tail_share"]) < LARGE_TAIL_MIN:
            out["large_tail"] |= {"met": None, "note": f"not checked: no forced share of at least {LARGE_TAIL_MIN} "
                                  f"(the largest is {float(large['tail_share'])})"}
    return out


# the confidence a verdict on repeated runs asks of its interval for the median ratio: three runs that all agree
MEDIAN_COVERAGE = 0.75


def median_order(n: int, confidence: float) -> tuple[int, float]:
    """The order statistics (k, n + 1 - k) of n values that hold the median of their distribution with at least
    `confidence` (distribution-free: the chance is 1 - 2 P(Bin(n, 1/2) < k)), the narrowest such, and that chance;
    k = 1 (the smallest and largest) where even they hold less. At MEDIAN_COVERAGE a verdict asks every run to agree
    up to 5 runs (2 runs: 50 %, 3: 75 %), and from 6 on lets the smallest and largest go (6 runs: runs 2-5 by size,
    78 %; 7: 2-6, 87.5 %; 9: 3-7, 82 %)."""
    def cover(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= n // 2 and cover(k + 1) >= confidence:
        k += 1
    return k, cover(k)


def add_runs(t: dict, ratios: list[float | None]) -> dict:
    """The spread behind a target judged on medians: each repetition's ratio (None where a run gave none), whether
    every run met it, and the verdict the runs support: met or missed where the runs median_order picks (every run,
    up to 5) lies on one side of the target, else not decided."""
    t["ratio_runs"] = [None if x is None else round(x, 3) for x in ratios]
    got = [x for x in ratios if x is not None]  # judged unrounded: 0.8999 misses 0.9
    t["met_in_every_run"] = bool(got) and len(got) == len(ratios) and all(x >= t["target"] for x in got)
    if t.get("met") is None:
        return t  # not checked (the note says why): no verdict from the runs either

    def span(xs: list[float]) -> str:  # 4 places: 0.8996 is not 0.9
        return f"{round(min(xs), 4):g}-{round(max(xs), 4):g}"

    if len(got) < 2 or len(got) < len(ratios):
        t["runs_verdict"] = f"not decided: {len(got)} of {len(ratios)} runs gave a figure"
        return t
    n = len(got)
    k, coverage = median_order(n, MEDIAN_COVERAGE)
    inner = sorted(got)[k - 1:n + 1 - k]
    if k == 1:
        where, side = f"in each of {n} runs ({span(got)})", f"its {n} runs ({span(got)})"
    else:
        where = (f"in runs {k}-{n + 1 - k} of {n} by size ({span(inner)}, an interval for the median at "
                 f"{coverage:.1%}; all {n}: {span(got)})")
        side = f"runs {k}-{n + 1 - k} of its {n} by size ({span(inner)}; all {n}: {span(got)})"
    t["median_interval"] = {"runs": [k, n + 1 - k], "coverage": round(coverage, 4)}
    if all(x >= t["target"] for x in inner):
        t["runs_verdict"] = f"met {where}"
    elif all(x < t["target"] for x in inner):
        t["runs_verdict"] = f"missed {where}"
    else:
        t["runs_verdict"] = f"not decided: {side} fall on both sides of it"
    return t


def target_line(name: str, t: dict) -> str:
    """One line for a tail target: its measurement and met, missed or not checked (on medians of repeated runs:
    what the runs support, met or missed only where every run agrees)."""
    ref = (f"resident {t['resident_decode_tps']}" if name == "small_tail"
           else f"link limit {t['link_limit_tps']} tok/s ({t['tail_mib_per_token']} MiB at {t['link_gbps']} GB/s)")
    verdict = t.get("note") or t.get("runs_verdict") or ("met" if t["met"] else "missed")
    past = f" ({t['device_tail_share']} past device memory)" if "device_tail_share" in t else ""
    return (f"{name}: share {t['tail_share']}{past}, decode {t['decode_tps']} tok/s against {ref}: "
            f"{t['ratio']} (target {t['target']}, {verdict})")


def follows(c: dict) -> str:
    if c["follows"] == "undecided":
        return f"undecided ({len(c['points'])} points fit both models)"
    ratio = "exactly" if c.get("rss_ratio") is None else f"residuals {c['rss_ratio']}x smaller"
    return f"follows the {c['follows']} model ({ratio})"


def gate_f_points(fit: dict) -> list[tuple[float, float]]:
    return [(p["tail_mib_read_per_token"], p["ms_per_token"]) for p in fit.get("points", [])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.tail_models", description=__doc__.split("\n\n")[0])
    ap.add_argument("curve", type=Path, help="a gate d curve CSV (rolling_kv_curve.csv)")
    ap.add_argument("--link-gbps", type=float, required=True, help="the pinned host-to-device bandwidth measured "
                    "in the same session (gate f's link.pinned_gbps)")
    ap.add_argument("--decoded", type=int, default=64, help="tokens decoded per run (gates.gpu --curve-n)")
    ap.add_argument("--bytes-per-cell", type=int, default=8 * 2 * 4 * 128 * 2,
                    help="K and V bytes of one cell over all layers (the gate model, f16)")
    ap.add_argument("--gate-f", type=Path, help="a gpu_gates.json: also fit each recorded gate f's points")
    ap.add_argument("--json", type=Path, help="write the result here")
    a = ap.parse_args(argv)
    try:
        with a.curve.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        print(f"gates.tail_models: cannot read {a.curve}: {e.strerror}", file=sys.stderr)
        return 1
    if not rows or "tail_share" not in rows[0]:
        print(f"gates.tail_models: {a.curve} is not a gate d curve (no tail_share column)", file=sys.stderr)
        return 1
    res = {"curve": str(a.curve), "decode": compare(curve_points(rows, a.decoded, a.bytes_per_cell)),
           "targets": tail_targets(rows, a.link_gbps, a.decoded, a.bytes_per_cell)}
    if a.gate_f:
        runs = json.loads(a.gate_f.read_text())
        res["gate_f"] = {key[:80]: compare(gate_f_points(run["f_breakdown"]["fit_after"]))
                         for key, run in runs.items()
                         if isinstance(run, dict) and "fit_after" in run.get("f_breakdown", {})}
    d = res["decode"]
    print(f"curve {a.curve}: {len(d['points'])} points")
    if d.get("sum"):
        print(f"  sum model: {d['sum']['fixed_ms']} ms + {d['sum']['ms_per_mib']} ms/MiB, rss {d['sum']['rss']}")
    if d.get("max"):
        print(f"  max model: max({d['max']['compute_ms']} ms, {d['max']['ms_per_mib']} ms/MiB), rss {d['max']['rss']}")
    if d.get("follows"):
        print(f"  {follows(d)}")
    for name, t in res["targets"].items():
        print(f"  {target_line(name, t)}")
    for key, c in res.get("gate_f", {}).items():
        if c.get("follows"):
            print(f"  gate f [{key[:60]}]: {follows(c)}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
