"""What a small host tail's staging costs a layer inside a CUDA graph, apart from the attention itself: a probe with
torch on a CUDA machine (no llama.cpp build needed).

Each variant is one CUDA graph of `--layers` layers, replayed many times; a layer is a stand-in for the device part's
attention (a reduction over `--read-mib` of device memory, about as long as the gate model's 37 µs vector kernel)
plus what the tail segments add to it:

* `resident`: the reduction alone;
* `+3 kernels`: the reduction, then three small kernels in a row (the chunk's attention, its combine, the merge);
* `+fork/join`: the reduction beside a small kernel on a second stream, joined before three small kernels;
* `+copy`: the reduction beside a copy of `--chunk-mib` from pinned host memory on a second stream, joined before
  the three small kernels (what a node staging its own chunk does).

The differences between the variants, per layer, split the tail's cost into extra kernels, the fork and join between
streams, and the copy:

    python3 -m gates.stream_probe --out build/gpu-gates/out/stream_probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.stream_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--read-mib", type=float, default=68.0, help="device memory the stand-in attention reads a layer")
    ap.add_argument("--chunk-mib", type=float, default=1.0, help="the staged chunk's K and V a layer")
    ap.add_argument("--replays", type=int, default=200, help="timed replays of each graph (after 20 warm-ups)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the variants")
    ap.add_argument("--out", type=Path, default=Path("build/gpu-gates/out/stream_probe.json"))
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        sys.exit("gates.stream_probe: needs torch with CUDA")
    if not torch.cuda.is_available():
        sys.exit("gates.stream_probe: no CUDA device")

    dev = torch.device("cuda")
    big = torch.ones(int(a.read_mib * (1 << 20)) // 2, dtype=torch.float16, device=dev)
    acc = torch.zeros((), dtype=torch.float32, device=dev)
    n_chunk = int(a.chunk_mib * (1 << 20))
    host = torch.ones(n_chunk, dtype=torch.uint8).pin_memory()
    slot = torch.empty(n_chunk, dtype=torch.uint8, device=dev)
    small = torch.ones(4096, dtype=torch.float32, device=dev)
    side = torch.cuda.Stream()

    def tiny() -> None:  # one small kernel
        small.mul_(1.0000001)

    def layer(kind: str) -> None:
        main_stream = torch.cuda.current_stream()
        if kind in ("fork", "copy"):
            side.wait_stream(main_stream)  # the fork: after the work before the layer
            with torch.cuda.stream(side):
                if kind == "copy":
                    slot.copy_(host, non_blocking=True)
                else:
                    tiny()
        torch.sum(big, dim=0, dtype=torch.float32, out=acc)
        if kind != "resident":
            if kind in ("fork", "copy"):
                main_stream.wait_stream(side)  # the join, before the chunk's kernels
            for _ in range(3):
                tiny()

    variants = {"resident": "resident", "+3 kernels": "kernels", "+fork/join": "fork", "+copy": "copy"}
    graphs = {}
    for name, kind in variants.items():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # eager warm-up on the capture stream
            for _ in range(a.layers):
                layer(kind)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(a.layers):
                layer(kind)
        graphs[name] = g

    def time_graph(g) -> float:  # µs a replay, from events around a batch of replays
        for _ in range(20):
            g.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(a.replays):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / a.replays

    # the copy alone, eager, from pinned memory (µs, median)
    copies = []
    for _ in range(50):
        torch.cuda.synchronize()
        t = time.perf_counter()
        slot.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        copies.append((time.perf_counter() - t) * 1e6)

    samples: dict[str, list[float]] = {name: [] for name in graphs}
    for r in range(a.rounds):
        names = list(graphs)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            samples[name].append(time_graph(graphs[name]))
    med = {name: statistics.median(v) for name, v in samples.items()}
    per_layer = {name: round((med[name] - med["resident"]) / a.layers, 2) for name in med}
    result = {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "layers": a.layers,
        "read_mib": a.read_mib, "chunk_mib": a.chunk_mib, "replays": a.replays, "rounds": a.rounds,
        "us_per_graph": {k: [round(x, 2) for x in v] for k, v in samples.items()},
        "median_us_per_graph": {k: round(v, 2) for k, v in med.items()},
        "median_us_per_layer_resident": round(med["resident"] / a.layers, 2),
        "over_resident_us_per_layer": per_layer,
        "eager_copy_us_median": round(statistics.median(copies), 2),
        "eager_copy_gbps": round(n_chunk / (statistics.median(copies) * 1e-6) / 1e9, 2),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
