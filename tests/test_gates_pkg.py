"""The gates package: every gate runs as a module from the repo root, shared helpers parse what the tools print."""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["gates.cpu", "gates.gpu", "gates.needle", "gates.demo", "gates.make_model", "gates.bundle", "gates.model_bench",
           "gates.sanitizer", "gates.tail_models", "gates.kernel_profile", "gates.room_probe",
           "gates.stream_probe", "gates.bench_noise", "gates.host_build", "gates.device_pieces"]


def run_module(mod: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", mod, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("mod", MODULES)
def test_every_gate_runs_as_a_module(mod: str):
    r = run_module(mod, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout


def test_no_sys_path_edits_in_gates():
    offenders = [p.name for p in (ROOT / "gates").glob("*.py") if re.search(r"sys\.path\.(insert|append)", p.read_text())]
    assert offenders == []


def test_parse_windows_and_stats():
    from gates.common import parse_stats, parse_windows

    log = ("llama_kv_cache: position window = 256 / 131072 cells resident + host tail 130816 cells (2044.00 MiB host) "
           "[CUDA0, forced]\n"
           "Mean    KLD:   0.000012 ±   0.000001\nMaximum KLD:   0.000029\nSame top p: 100.000 ± 0.000 %\n")
    assert parse_windows(log) == [{"window": 256, "kv_size": 131072, "tail": 130816, "host_mib": 2044.0}]
    assert parse_stats(log) == {"mean_kld": 0.000012, "max_kld": 0.000029, "same_top_pct": 100.0}
    assert parse_windows("position window = FULLY RESIDENT (512 / 512 cells") == []


def test_make_text_is_deterministic():
    from gates.common import make_text

    assert make_text(200, 3) == make_text(200, 3)
    assert make_text(200, 3) != make_text(200, 4)


def test_ensure_model_writes_the_same_bytes(tmp_path: Path):
    pytest.importorskip("gguf")
    from gates.common import ensure_model, sha256

    a = ensure_model(tmp_path / "a.gguf", ["--layers", "1"])
    b = ensure_model(tmp_path / "b.gguf", ["--layers", "1"])
    assert sha256(a) == sha256(b)
    mtime = a.stat().st_mtime_ns
    ensure_model(a, ["--layers", "1"])  # present: left alone
    assert a.stat().st_mtime_ns == mtime


def fake_tool(path: Path, text: str, script: bool = False) -> Path:
    """A stand-in tool: prints text, or with script=True runs it as sh (so its output can follow its arguments)."""
    path.write_text("#!/bin/sh\n" + text + "\n" if script else "#!/bin/sh\ncat <<'EOF'\n" + text + "\nEOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_gpu_run_parses_a_completion_log(tmp_path: Path):
    from gates.gpu import run

    tool = fake_tool(tmp_path / "llama-completion", "\n".join([
        "llama_kv_cache: position window = 256 / 1048576 cells resident + host tail 1048320 cells (16380.00 MiB host) "
        "[CUDA0, measure pass, budget 0.00 MiB]",
        "llama_context: two-pass compute reserve: pass 1 (measure) with a minimal KV window",
        "sched_reserve:      CUDA0 compute buffer size =  4111.76 MiB",
        "llama_kv_cache: position window = 149760 / 1048576 cells resident + host tail 898816 cells (14044.00 MiB host) "
        "[CUDA0, auto, budget 2343.56 MiB]",
        "sched_reserve:      CUDA0 compute buffer size =  3965.76 MiB",
        "sched_reserve:  CUDA_Host compute buffer size =   136.01 MiB",
        "sched_reserve: graph (pp bs=512, tg bs=1): nodes = 293 / 261, splits = 26 / 18, input objects = 4 / 4, "
        "input tensors = 9 / 9",
        "common_perf_print: prompt eval time =     573.10 ms / 35131 tokens (    0.02 ms per token, 61300.00 tokens per second)",
        "common_perf_print:        eval time =      26.69 ms /    31 runs   (    0.86 ms per token,  1161.48 tokens per second)",
        "common_perf_print:    graphs reused =         29",
        "0.01.2 I opencoti_copy_kv_rows: OPENCOTI_KV_DEBUG tail-copy-2d: K and V cells in one pitched copy",
        "0.0 I cmn  common_param: common_params_print_info: build 5 (0c1e5709+0089.9b49f91e) with GNU 13.3.0 for Linux",
    ]))
    r = run("t", [str(tool)], tmp_path)
    assert r["rc"] == 0
    assert r["window"] == {"resident": 149760, "kv_size": 1048576, "tail": 898816, "tail_mib": 14044.0}
    assert r["compute_mib"] == [4111.76, 3965.76]
    assert r["graphs"] == [{"nodes_pp": 293, "nodes_tg": 261, "splits_pp": 26, "splits_tg": 18}]
    assert r["compute_buffers_mib"] == {"CUDA0": 3965.76, "CUDA_Host": 136.01}
    assert (r["prompt_tokens"], r["prefill_tps"], r["decode_tps"]) == (35131, 61300.0, 1161.48)
    assert r["decode_ms_per_token"] == pytest.approx(26.69 / 31)
    assert (r["graphs_reused"], r["decode_runs"]) == (29, 31)
    assert r["debug_lines"][0] == "OPENCOTI_KV_DEBUG tail-copy-2d: K and V cells in one pitched copy"
    assert (r["build"], r["compiler"]) == ("0c1e5709+0089.9b49f91e", "GNU 13.3.0 for Linux")
    assert r["measure_pass"] and not r["fully_resident"]
    assert (tmp_path / "t.log").read_text().startswith(str(tool))


def _0073_log_format(anchor: str) -> str:
    """The format string of the GGML_LOG_INFO call in patch 0073 whose text holds anchor: its string literals joined,
    without the leading `%s: ` (__func__) and the newline."""
    patch = next((ROOT / "patches").glob("0073-*.patch")).read_text()
    start = patch.index(anchor)
    call = patch[patch.rindex("GGML_LOG_INFO(", 0, start):patch.index("__func__", start)]
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', call)).replace("\\n", "").removeprefix("%s: ")


def test_the_carry_line_the_gates_read_is_the_line_0073_logs():
    # gates.gpu.RE_CARRY_READ reads a line fattn.cu prints with printf: the format in the patch, rendered with
    # numbers, must be what the pattern reads (a carry asked for and never logged is "not checked")
    from gates.gpu import RE_CARRY_READ

    fmt = _0073_log_format("tail ring: %zu carried chunk(s) read by graph")
    line = fmt.replace("%zu", "3").replace("%llu", "7")
    m = RE_CARRY_READ.search(line)
    assert m and m.group(1) == "3", line


def test_the_carry_trial_line_the_gates_read_is_the_line_0073_logs():
    # gates.common.carry_trials reads the carry trial's decision, which fattn.cu prints with printf: the format in the
    # patch, rendered both ways, must be what the parser reads
    from gates.common import carry_trials

    fmt = _0073_log_format("tail ring: ring-carry %s: a token took")
    kept = fmt.replace("%s", "kept", 1).replace("%.3f", "1.100", 1).replace("%.3f", "1.250", 1).replace("%d", "8")
    dropped = fmt.replace("%s", "dropped", 1).replace("%.3f", "2.204", 1).replace("%.3f", "1.279", 1)
    assert carry_trials("opencoti_ring_trial_tick: " + kept) == [
        {"kept": True, "carrying_ms": 1.1, "not_carrying_ms": 1.25}], kept
    assert carry_trials(dropped) == [{"kept": False, "carrying_ms": 2.204, "not_carrying_ms": 1.279}], dropped
    assert carry_trials("tail ring: 3 carried chunk(s) read by graph 7") == []


def test_gpu_run_reads_the_cells_a_mapped_tail_really_keeps_in_device_memory(tmp_path: Path):
    from gates.gpu import budget_rows, run

    mapped = ("llama_kv_cache: host tail mapped into the device's address space: {dev} MiB device + 4450.50 MiB pinned "
              "host, 2 K/V buffers, {cells} cells in device memory (attention reads the tail in place unless a ubatch "
              "has room to copy the used cells)")
    tool = fake_tool(tmp_path / "llama-completion", "\n".join([
        mapped.format(dev="0.00", cells=256),  # the measure pass: not the cache the context runs with
        "llama_context: two-pass compute reserve: measured 113 MiB, pass 2 sizes the KV window with a 369 MiB "
        "reserve and 3072 bytes per cell of attention span",
        "llama_kv_cache: position window = 35840 / 1048576 cells resident + host tail 1012736 cells (4450.50 MiB "
        "host) [CUDA0, auto, budget 166.87 MiB]",
        mapped.format(dev="128.00", cells=29127),
        mapped.format(dev="2.00", cells=30000),  # a second cache (another row size): the fewest cells count
        "common_perf_print:        eval time =      26.69 ms /    31 runs   (    0.86 ms per token,  1161.48 tokens per second)",
    ]))
    r = run("t", [str(tool)], tmp_path)
    assert r["window"]["resident"] == 35840 and r["device_cells"] == 29127
    row = budget_rows(1048576, [1950], "window q4_0", r, 1048576, target=1466)[0]
    assert (row["resident_cells"], row["device_cells"]) == (35840, 29127)


def test_gpu_run_reads_the_reserve_summary_when_pp_and_tg_graphs_agree(tmp_path: Path):
    from gates.gpu import run

    tool = fake_tool(tmp_path / "llama-completion", "sched_reserve: graph: nodes = 293, splits = 2, input objects = 4, "
                     "input tensors = 9\nsched_reserve: graph splits = 7")
    assert run("t", [str(tool)], tmp_path)["graphs"] == [{"nodes_pp": 293, "nodes_tg": 293, "splits_pp": 2,
                                                          "splits_tg": 2}]


def test_gpu_bench_reads_llama_bench_json(tmp_path: Path):
    import argparse

    from gates.gpu import bench

    doc = [{"n_prompt": 2048, "n_gen": 0, "samples_ts": [146000.5, 145000.0]},
           {"n_prompt": 0, "n_gen": 128, "samples_ts": [1750.0, 1748.5]}]
    fake_tool(tmp_path / "llama-bench", "main: loading\n" + json.dumps(doc))
    a = argparse.Namespace(bench_pp=2048, bench_tg=128, bench_reps=2, bench_cpus="", bench_args="")
    assert bench(tmp_path, tmp_path / "m.gguf", "b", tmp_path, a, []) == {"pp": [146000.5, 145000.0],
                                                                        "tg": [1750.0, 1748.5]}


def steady_gate_b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str, full_compiler: str = "GNU 13.3.0",
                  upstream_compiler: str = "GNU 13.3.0"):
    """gates.gpu and gate b's arguments for a full build and an upstream build whose llama-bench prints the same
    figures every call and logs '<build> <arguments>' to tmp_path/calls.txt: (module, args)."""
    gpu, full = fake_gpu_bin(tmp_path, monkeypatch, [
        'echo "llama_kv_cache: position window = FULLY RESIDENT (131072 / 131072 cells on CUDA0, 2048.00 MiB, auto)"'],
        compiler=full_compiler)
    upstream = fake_upstream_bin(tmp_path, compiler=upstream_compiler)
    doc = json.dumps([{"n_prompt": 2048, "n_gen": 0, "samples_ts": [100000.0]},
                      {"n_prompt": 0, "n_gen": 128, "samples_ts": [1700.0]}])
    for b in (full, upstream):
        fake_tool(b / "llama-bench", f'echo "{b.name} $*" >> {tmp_path}/calls.txt\ncat <<\'EOF\'\n{doc}\nEOF', script=True)
    return gpu, gpu.parse_args(["--full-bin", str(full), "--pre-bin", str(full), "--upstream-bin", str(upstream),
                                "--bench-rounds", "5", "--bench-cpus", "", *args])


def test_gate_b_gives_the_residency_flags_to_the_full_build_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # upstream's llama-bench has no --kv-residency-mode: it runs without; the full build runs in window and head mode
    gpu, a = steady_gate_b(tmp_path, monkeypatch)
    res = gpu.gate_b(a, tmp_path / "m.gguf", tmp_path)
    assert res["pass"] and res["fully_resident_single_pass"]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 3 * 6  # a warm-up and 5 rounds of each build
    assert all("--kv-residency-mode" not in c for c in calls if c.startswith("upstream "))
    full_calls = [c for c in calls if c.startswith("full ")]
    assert sum(c.endswith("--kv-residency-mode window") for c in full_calls) == 6
    assert sum(c.endswith("--kv-residency-mode head") for c in full_calls) == 6
    spans = res["process_seconds"]  # [start, end] of each round's process, from the first round's start
    assert sorted(spans) == ["full", "full_head", "upstream"] and all(len(v) == 5 for v in spans.values())
    assert all(0 <= s0 <= s1 for v in spans.values() for s0, s1 in v)
    assert spans["upstream"][0][0] == 0  # upstream leads the first round


def test_median_interval_takes_the_order_statistics_whose_coverage_reaches_the_confidence():
    from gates.gpu import median_interval

    assert median_interval([1.0, 2.0, 3.0, 4.0], 0.9) is None  # even the range covers only 0.875
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0], 0.9) == (1.0, 5.0, 0.9375)  # 5 values: the range
    lo, hi, cover = median_interval([float(x) for x in range(1, 10)], 0.9)  # 9 values: x(2) .. x(8)
    assert (lo, hi) == (2.0, 8.0) and cover == pytest.approx(1 - 2 * 10 / 512)


def test_gate_b_compare_is_an_equivalence_test_on_the_paired_round_ratios():
    from gates.gpu import compare

    def rounds(levels: list[float], factor: float = 1.0) -> list[list[float]]:
        return [[x * factor, x * factor * 1.01] for x in levels]

    # the machine drifts between rounds by 30 %, both builds alike: the paired ratios are steady and equal -> pass
    drift = [100.0, 130.0, 95.0, 120.0, 105.0]
    r = compare({"full": rounds(drift, 0.99), "upstream": rounds(drift)}, "full", "upstream")
    assert (r["verdict"], r["pass"]) == ("pass", True)
    assert r["interval"] == [0.99, 0.99] and r["interval_confidence"] == 0.9375
    assert r["noise"] > 0.3  # the old range-of-medians figure would have made this prefill unjudgeable
    # a steady 10 % slowdown under the same drift: the interval lies wholly below 0.95 -> fail, saying so
    r = compare({"full": rounds(drift, 0.9), "upstream": rounds(drift)}, "full", "upstream")
    assert (r["verdict"], r["pass"]) == ("fail", False) and "lies outside 1 +- 0.050" in r["why"]
    # the nineteenth round's prefill (GCC 12 series against GCC 13 upstream): its paired ratios fail the 5 % margin
    ratios = [0.7324, 0.6864, 0.8786, 0.7559, 0.7015]
    r = compare({"full": [[100.0 * q] for q in ratios], "upstream": [[100.0]] * 5}, "full", "upstream")
    assert r["verdict"] == "fail" and r["interval"] == [0.6864, 0.8786]
    # ratios that straddle the margin: not checked, never a pass, whatever their median
    mixed = [1.0, 0.93, 1.02, 1.08, 0.99]
    r = compare({"full": [[100.0 * q] for q in mixed], "upstream": [[100.0]] * 5}, "full", "upstream")
    assert (r["verdict"], r["pass"]) == ("not checked", False) and "too noisy to tell" in r["why"]
    r = compare({"full": [[100.0 * q] for q in mixed], "upstream": [[100.0]] * 5}, "full", "upstream", margin=0.10)
    assert r["verdict"] == "pass"
    # too few rounds for any interval: not checked
    r = compare({"full": [[99.0], [99.0]], "upstream": [[100.0], [100.0]]}, "full", "upstream")
    assert r["verdict"] == "not checked" and "2 round(s) give no interval" in r["why"]


def test_gate_b_asks_whether_the_window_code_changed_resident_and_whether_the_series_is_slower():
    """Window mode against head mode of the same binary, two-sided; the series against upstream, one-sided: a series
    that prefills 6 % faster than upstream in both modes passes (the build, not the window code) and says so; a
    window mode 8 % slower than its own head mode fails, whatever upstream does; a series 8 % slower than upstream
    fails."""
    from gates.gpu import compare, resident_verdict

    drift = [100.0, 130.0, 95.0, 120.0, 105.0, 98.0, 125.0]

    def rounds(factor: float) -> list[list[float]]:
        return [[x * factor, x * factor * 1.01] for x in drift]

    faster = resident_verdict({"full": rounds(1.06), "full_head": rounds(1.06), "upstream": rounds(1.0)}, 0.05, 0.9)
    assert (faster["verdict"], faster["pass"]) == ("pass", True) and "why" not in faster
    assert "lies above 1 + 0.050" in faster["faster"] and faster["window_vs_head"]["verdict"] == "pass"
    assert faster["sided"] == "lower" and faster["window_vs_head"]["sided"] == "both"
    # the same figures under the two-sided test alone would fail: equal within 5 % they are not
    assert compare({"full": rounds(1.06), "upstream": rounds(1.0)}, "full", "upstream")["verdict"] == "fail"
    slow_window = resident_verdict({"full": rounds(0.98), "full_head": rounds(1.06), "upstream": rounds(1.0)},
                                   0.05, 0.9)
    assert (slow_window["verdict"], slow_window["pass"]) == ("fail", False)
    assert slow_window["why"].startswith("window against head mode: ") and "lies outside 1 +- 0.050" in slow_window["why"]
    slow_series = resident_verdict({"full": rounds(0.92), "full_head": rounds(0.92), "upstream": rounds(1.0)},
                                   0.05, 0.9)
    assert slow_series["verdict"] == "fail" and slow_series["why"].startswith("against upstream: ")
    assert "slowdown" in slow_series["why"]
    with pytest.raises(ValueError, match="sided"):
        compare({"full": rounds(1.0), "upstream": rounds(1.0)}, "full", "upstream", sided="upper")


def test_gate_b_is_not_checked_where_prefill_is_too_noisy_to_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """llama-bench's prefill swinging by 40 % from one process to the next (the H200's pp 2048 did): the paired
    ratios straddle the margin, so gate b does not pass, says which half it could not judge and why; decode, steady,
    is judged."""
    gpu, full = fake_gpu_bin(tmp_path, monkeypatch, [
        'echo "llama_kv_cache: position window = FULLY RESIDENT (131072 / 131072 cells on CUDA0, 2048.00 MiB, auto)"'])
    upstream = fake_upstream_bin(tmp_path)
    for b in (full, upstream):
        # every other call's prefill is 40 % faster, whichever build it is; decode is the same in every call
        fake_tool(b / "llama-bench", "\n".join([
            f'n=$(cat {tmp_path}/n 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/n',
            'if [ $((n % 2)) = 0 ]; then pp=100000.0; else pp=140000.0; fi',
            'echo "[{\\"n_prompt\\": 2048, \\"n_gen\\": 0, \\"samples_ts\\": [$pp]},'
            ' {\\"n_prompt\\": 0, \\"n_gen\\": 128, \\"samples_ts\\": [1700.0]}]"']), script=True)
    a = gpu.parse_args(["--full-bin", str(full), "--pre-bin", str(full), "--upstream-bin", str(upstream),
                        "--bench-rounds", "5", "--bench-cpus", "", "--bench-max-rounds", "5"])
    res = gpu.gate_b(a, tmp_path / "m.gguf", tmp_path)
    assert res["pp"]["verdict"] == "not checked" and res["tg"]["verdict"] == "pass"
    assert (res["pass"], res["verdict"], res["not_checked"]) == (False, "not checked", ["pp"])
    assert res["rounds"] == 5 and res["looks"] == [{"rounds": 5, "pp": "not checked", "tg": "pass"}]
    # with more rounds allowed, the gate runs them where a half is not checked, looking again after each batch
    (tmp_path / "n").unlink()
    a = gpu.parse_args(["--full-bin", str(full), "--pre-bin", str(full), "--upstream-bin", str(upstream),
                        "--bench-rounds", "5", "--bench-cpus", "", "--bench-extend", "4", "--bench-max-rounds", "13"])
    res = gpu.gate_b(a, tmp_path / "m.gguf", tmp_path)
    assert [look["rounds"] for look in res["looks"]] == [5, 9, 13][:len(res["looks"])]
    assert res["looks"][0]["pp"] == "not checked" and all(look["tg"] == "pass" for look in res["looks"])
    assert all(look["pp"] == "not checked" for look in res["looks"][:-1])  # it stops at the first decided look
    assert res["rounds"] == res["looks"][-1]["rounds"] and len(res["pp"]["samples"]["full"]) == res["rounds"]
    assert int((tmp_path / "n").read_text()) == 3 * (1 + res["rounds"])  # llama-bench: the warm-ups and the rounds


def test_gate_b_more_rounds_only_while_a_half_is_not_checked_and_up_to_the_cap():
    from gates.gpu import more_rounds, parse_args

    with pytest.raises(SystemExit):  # no round at all would judge nothing: refused before anything runs
        parse_args(["--full-bin", "f", "--pre-bin", "p", "--upstream-bin", "u", "--bench-rounds", "0"])

    assert more_rounds(30, {"pp": "not checked", "tg": "pass"}, 15, 60) == 45
    assert more_rounds(45, {"pp": "not checked", "tg": "pass"}, 15, 50) == 50
    assert more_rounds(60, {"pp": "not checked", "tg": "pass"}, 15, 60) == 0  # the cap
    assert more_rounds(30, {"pp": "fail", "tg": "pass"}, 15, 60) == 0  # decided: a fail is not run again
    assert more_rounds(30, {"pp": "not checked", "tg": "pass"}, 0, 60) == 0  # extending off


def test_gate_b_passes_its_bench_args_to_every_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    gpu, a = steady_gate_b(tmp_path, monkeypatch, "--bench-args", "-t 1 -ub 2048")
    res = gpu.gate_b(a, tmp_path / "m.gguf", tmp_path)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 3 + 5 * 3  # a warm-up and five rounds of three builds
    assert all(" -t 1 -ub 2048" in c for c in calls)
    assert res["args"] == "-t 1 -ub 2048" and res["pp"]["verdict"] == "pass"


def test_gate_b_is_not_checked_between_builds_of_different_compilers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The same figures that pass between builds of one compiler judge nothing between GCC 12 and GCC 13 builds: the
    ratios are reported, the verdict is not checked and says why; a build that names no compiler is not vouched for."""
    gpu, a = steady_gate_b(tmp_path, monkeypatch, full_compiler="GNU 12.2.0", upstream_compiler="GNU 13.3.0")
    res = gpu.gate_b(a, tmp_path / "m.gguf", tmp_path)
    assert res["pp"]["verdict"] == "pass" and res["tg"]["verdict"] == "pass"  # the figures alone would pass
    assert (res["pass"], res["verdict"], res["not_checked"]) == (False, "not checked", ["pp", "tg"])
    assert res["compilers"] == {"full": "GNU 12.2.0 for Linux x86_64", "upstream": "GNU 13.3.0 for Linux x86_64"}
    assert "made with GNU 12.2.0 for Linux x86_64, the upstream build with GNU 13.3.0" in res["why_not_checked"]
    fake_tool(a.upstream_bin / "llama-completion", "echo version: 1", script=True)  # says no compiler
    res = gpu.gate_b(a, tmp_path / "m.gguf", tmp_path)
    assert res["verdict"] == "not checked" and "upstream build does not say which compiler" in res["why_not_checked"]


def test_bench_noise_reports_each_variants_spread_between_processes(tmp_path: Path):
    """Pinned runs steady, unpinned runs alternating 100k / 140k tok/s prefill: the spreads say which is which."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tool(bin_dir / "llama-bench", "\n".join([
        f'n=$(cat {tmp_path}/n 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/n',
        'case " $* " in *" -t 1 "*) pp=120000.0;; *) if [ $((n / 2 % 2)) = 0 ]; then pp=100000.0; else pp=140000.0; fi;; esac',
        'echo "[{\\"n_prompt\\": 2048, \\"n_gen\\": 0, \\"samples_ts\\": [$pp, $pp]},'
        ' {\\"n_prompt\\": 0, \\"n_gen\\": 128, \\"samples_ts\\": [1700.0, 1690.0]}]"']), script=True)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    out = tmp_path / "noise.json"
    r = run_module("gates.bench_noise", "--bin", str(bin_dir), "--model", str(tmp_path / "m.gguf"), "--procs", "4",
                   "--work", str(tmp_path / "w"), "--out", str(out), "--variants", "|", "|-t 1")
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())["summary"]
    assert s["|"]["pp"]["between_process_spread"] == pytest.approx(40000 / 120000, abs=1e-3)
    assert s["|-t 1"]["pp"]["between_process_spread"] == 0.0
    assert s["|-t 1"]["tg"]["within_process_spread_median"] == pytest.approx(10 / 1695, abs=1e-4)
    assert sorted(s["|"]["pp"]["process_medians"]) == [100000.0, 100000.0, 140000.0, 140000.0]
    bad = run_module("gates.bench_noise", "--bin", str(bin_dir), "--model", str(tmp_path / "m.gguf"),
                     "--work", str(tmp_path / "w"), "--variants", "0-7")
    assert bad.returncode == 2 and "write it as CPUS|ARGS" in bad.stderr


def test_linear_fit_recovers_fixed_cost_and_bandwidth():
    from gates.gpu import MIB, linear_fit

    pts = [{"tail_mib_read_per_token": x, "ms_per_token": 2.0 + 0.02 * x} for x in (0.0, 100.0, 500.0)]
    fit = linear_fit(pts)
    assert fit["fixed_ms"] == pytest.approx(2.0)
    assert fit["ms_per_mib"] == pytest.approx(0.02)
    assert fit["effective_gbps"] == pytest.approx(round(MIB / 1e9 / 0.02e-3, 2))
    assert linear_fit(pts[:1]) == {}


def test_tail_models_tell_the_sum_model_from_the_max_model():
    from gates.tail_models import compare

    xs = [0.0, 5.5, 55.0, 165.0, 357.0, 545.0]
    summed = [(x, 1.0 + 0.02 * x + (0.01 if i % 2 else -0.01)) for i, x in enumerate(xs)]
    maxed = [(x, max(1.0, 0.02 * x) + (0.01 if i % 2 else -0.01)) for i, x in enumerate(xs)]
    s, m = compare(summed), compare(maxed)
    assert s["follows"] == "sum" and m["follows"] == "max"
    assert s["sum"]["fixed_ms"] == pytest.approx(1.0, abs=0.02) and s["sum"]["ms_per_mib"] == pytest.approx(0.02, abs=1e-4)
    assert m["max"]["compute_ms"] == pytest.approx(1.0, abs=0.02) and m["max"]["ms_per_mib"] == pytest.approx(0.02, abs=1e-4)
    assert m["max"]["compute_bound_points"] == 2  # 0 and 5.5 MiB take less than 1 ms at 0.02 ms/MiB, 55 MiB more
    assert compare(summed[:2])["follows"] == "undecided"


def version_line(compiler: str) -> str:
    """The version line a llama.cpp program prints, naming the compiler that made it (sh)."""
    return f'echo "version: 1 (0c1e5709) built with {compiler} for Linux x86_64" >&2'


def fake_gpu_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[str], compiler: str = "GNU 13.3.0"):
    """gates.gpu with a 55 GB/s link and a stand-in llama-completion (sh `lines`, after its version line) in
    tmp_path/full: (module, args)."""
    import gates.gpu as gpu

    monkeypatch.setattr(gpu, "link_bandwidth", lambda: {"pinned_gbps": 55.0})
    bin_dir = tmp_path / "full"
    bin_dir.mkdir()
    fake_tool(bin_dir / "llama-completion", "\n".join([version_line(compiler), *lines]), script=True)
    return gpu, bin_dir


def fake_upstream_bin(tmp_path: Path, compiler: str = "GNU 13.3.0") -> Path:
    """tmp_path/upstream with a llama-completion that only says which compiler made it."""
    d = tmp_path / "upstream"
    d.mkdir()
    fake_tool(d / "llama-completion", version_line(compiler), script=True)
    return d


def test_gate_f_adds_a_resident_point_and_fits_both_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # decode time = 1 ms + 0.02 ms per MiB of used tail (the sum model), the tail = 35,131 + 16 - the forced window
    gpu, bin_dir = fake_gpu_bin(tmp_path, monkeypatch, [
        'cells=${LLAMA_ARG_KV_WINDOW_CELLS:-131072}',
        'tail=$((35131 + 16 - cells)); [ $tail -lt 0 ] && tail=0',
        'us=$((1000 + tail * 16384 / 1048576 * 20))',
        '[ "$cells" = "$FAIL_AT" ] && exit 1',
        'echo "sched_reserve: graph (pp bs=512, tg bs=1): nodes = 254 / 254, splits = 2 / 2, input objects = 4 / 4"',
        'echo "common_perf_print: prompt eval time =  573.10 ms / 35131 tokens (0.02 ms per token, 61300.00 tokens per second)"',
        'echo "common_perf_print:        eval time =  $((us * 31 / 1000)).$((us * 31 % 1000)) ms /    31 runs   '
        '(1.00 ms per token,  1000.00 tokens per second)"'])
    a = gpu.parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir)])
    res = gpu.gate_f(a, tmp_path / "m.gguf", tmp_path)
    assert res["pass"] and res["not_measured"] == []
    assert res["sched_after"]["splits_tg"] == 2
    assert [p["window"] for p in res["fit_after"]["points"]] == [256, 12288, 24576]  # the line: tailed points only
    models = res["models_after"]
    assert [p["tail_mib_per_token"] for p in models["points"]][0] == 0.0  # the resident run (window = the context)
    assert len(models["points"]) == 4 and models["follows"] == "sum"
    assert models["sum"]["fixed_ms"] == pytest.approx(1.0, abs=0.01)
    # a run that fails leaves its point unmeasured: the gate says which and does not pass
    monkeypatch.setenv("FAIL_AT", "12288")
    res = gpu.gate_f(a, tmp_path / "m.gguf", tmp_path)
    assert res["pass"] is False and res["not_measured"] == ["after: the decode at window 12288 (rc 1)"]


def test_gate_d_fails_when_the_curve_misses_0089_s_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # resident 900 tok/s; a window with a tail decodes at $TG and prefills at $PP; -nkvo 12 / 9,000 tok/s
    gpu, bin_dir = fake_gpu_bin(tmp_path, monkeypatch, [
        'case "$*" in *-nkvo*) pp=9000.00; tg=12.00;;',
        '  *) c=${LLAMA_ARG_KV_WINDOW_CELLS:-131072}; if [ "$c" -ge 35131 ]; then pp=60000.00; tg=900.00; '
        'echo "llama_kv_cache: position window = FULLY RESIDENT (131072 / 131072 cells on CUDA0)"; else pp=$PP; tg=$TG; '
        'echo "llama_kv_cache: position window = $c / 131072 cells resident + host tail $((131072 - c)) cells '
        '(1.00 MiB host)"; fi;; esac',
        'echo "common_perf_print: prompt eval time =  573.10 ms / 35131 tokens (0.02 ms per token, $pp tokens per second)"',
        'echo "common_perf_print:        eval time =  70.00 ms /    63 runs   (1.00 ms per token,  $tg tokens per second)"'])
    a = gpu.parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                        "--work", str(tmp_path), "--out", str(tmp_path), "--targets"])
    # the 0073 round's figures: every target met
    monkeypatch.setenv("PP", "31000.00")
    monkeypatch.setenv("TG", "82.00")
    a.device = ["NVIDIA H200, 143771 MiB, 580.159.04"]  # main() reads the cards once
    res = gpu.gate_d(a, tmp_path / "m.gguf", tmp_path, tmp_path)
    checks = {c["target"]: c for c in res["targets"]["checks"]}
    assert res["pass"] is True and all(c["met"] for c in checks.values())
    assert checks["decode_vs_nkvo"]["value"] == pytest.approx(82 / 12, abs=1e-3)
    # the curve's side file names the card, so the plot's title does not have to guess it
    assert json.loads((tmp_path / "rolling_kv_curve.json").read_text())["device"] == a.device
    # decode past the span read in place, prefill without the copy: the run exits 0, but the gate fails
    monkeypatch.setenv("PP", "8560.00")
    monkeypatch.setenv("TG", "21.70")
    res = gpu.gate_d(a, tmp_path / "m.gguf", tmp_path, tmp_path)
    checks = {c["target"]: c for c in res["targets"]["checks"]}
    assert all(r["rc"] == 0 for r in res["rows"]) and res["pass"] is False
    assert [n for n, c in checks.items() if not c["met"]] == [
        "decode_at_max_share_tps", "decode_vs_link", "decode_vs_nkvo", "prefill_at_half_vs_nkvo"]
    assert checks["prefill_at_half_vs_nkvo"]["value"] == pytest.approx(8560 / 9000, abs=1e-3)
    # a target without a value is missed, not skipped
    assert gpu.curve_checks({})[0] == {"target": "decode_at_max_share_tps", "value": None, "bound": 60.0, "met": False}


def test_gate_d_judges_the_tail_targets_on_the_medians_of_interleaved_runs(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    # resident 900 tok/s; the whole-granule window (34,816 cells) decodes 700 in its first run, 850 and 860 in the
    # repeats: the single run misses 0.9 of resident, the median (850 / 900) meets it
    (tmp_path / "seq").write_text("700\n850\n860\n")
    gpu, bin_dir = fake_gpu_bin(tmp_path, monkeypatch, [
        'case "$*" in *-nkvo*) tg=12.00;;',
        '  *) c=${LLAMA_ARG_KV_WINDOW_CELLS:-131072}; if [ "$c" -ge 35131 ]; then tg=900.00; '
        'echo "llama_kv_cache: position window = FULLY RESIDENT (131072 / 131072 cells on CUDA0)"; '
        'elif [ "$c" -eq 34816 ]; then tg=$(head -n1 "$SEQ").00; sed -i 1d "$SEQ"; '
        'echo "llama_kv_cache: position window = $c / 131072 cells resident + host tail $((131072 - c)) cells '
        '(1.00 MiB host)"; else tg=82.00; '
        'echo "llama_kv_cache: position window = $c / 131072 cells resident + host tail $((131072 - c)) cells '
        '(1.00 MiB host)"; fi;; esac',
        'echo "common_perf_print: prompt eval time =  573.10 ms / 35131 tokens (0.02 ms per token, 31000.00 tokens per second)"',
        'echo "common_perf_print:        eval time =  70.00 ms /    63 runs   (1.00 ms per token,  $tg tokens per second)"',
        'echo "common_perf_print:    graphs reused = 61"'])
    monkeypatch.setenv("SEQ", str(tmp_path / "seq"))
    monkeypatch.setattr(gpu, "link_bandwidth", lambda: {"pinned_gbps": 50.0})
    a = gpu.parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                        "--work", str(tmp_path), "--out", str(tmp_path), "--targets", "--shares", "0.5", "1.0",
                        "--small-tail-reps", "3"])
    res = gpu.gate_d(a, tmp_path / "m.gguf", tmp_path, tmp_path)
    single, med = res["targets"]["tail"]["small_tail"], res["targets"]["tail_medians"]["small_tail"]
    assert single["decode_tps"] == 700.0 and single["met"] is False
    assert med["decode_tps"] == 850.0 and med["ratio"] == pytest.approx(850 / 900, abs=1e-3) and med["met"] is True
    assert res["targets"]["tail_medians"]["runs"] == 3
    # llama's reused graphs against its decode runs, per repetition of each point
    assert res["targets"]["medians"]["graphs_reused_of_decodes"]["small"] == [[61, 63]] * 3
    # the spread behind the median: met on the median, not in every repetition
    assert med["ratio_runs"] == [round(700 / 900, 3), round(850 / 900, 3), round(860 / 900, 3)]
    assert med["met_in_every_run"] is False
    # so the line does not say met: the runs fall on both sides of the target
    assert med["runs_verdict"] == "not decided: its 3 runs (0.7778-0.9556) fall on both sides of it"
    from gates import tail_models

    line = tail_models.target_line("small_tail", med)
    assert line.endswith("(target 0.9, not decided: its 3 runs (0.7778-0.9556) fall on both sides of it)"), line
    # the largest tail (256 cells: 34,907 cells of K and V a token past them at 50 GB/s) decodes 82 in every run
    large = res["targets"]["tail_medians"]["large_tail"]
    limit = 50e9 / ((35131 + 32 - 256) * 16384)
    assert large["ratio_runs"] == [round(82 / limit, 3)] * 3 and large["met_in_every_run"] is True
    assert large["runs_verdict"] == f"met in each of 3 runs ({round(82 / limit, 4):g}-{round(82 / limit, 4):g})"
    assert (tmp_path / "seq").read_text() == ""  # the small tail ran once in the curve and twice repeated


def test_gate_d_runs_the_small_tail_and_resident_in_more_pairs_than_the_other_points(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    # resident 1000 tok/s; the small tail swings on both sides of 0.9 run to run, but the runs around the median of
    # 11 lie above it: three runs would not decide, eleven do
    small = [800, 950, 910, 930, 780, 920, 960, 915, 925, 940, 905]
    (tmp_path / "seq").write_text("".join(f"{x}\n" for x in small))
    gpu, bin_dir = fake_gpu_bin(tmp_path, monkeypatch, [
        'c=${LLAMA_ARG_KV_WINDOW_CELLS:-full}; case "$*" in *-nkvo*) c=nkvo;; esac; echo "$c" >> "$ORDER"',
        'case "$c" in nkvo) tg=12.00;;',
        '  full) tg=1000.00; echo "llama_kv_cache: position window = FULLY RESIDENT (131072 / 131072 cells on CUDA0)";;',
        '  34816) tg=$(head -n1 "$SEQ").00; sed -i 1d "$SEQ"; '
        'echo "llama_kv_cache: position window = $c / 131072 cells resident + host tail $((131072 - c)) cells '
        '(1.00 MiB host)";;',
        '  *) tg=82.00; echo "llama_kv_cache: position window = $c / 131072 cells resident + host tail '
        '$((131072 - c)) cells (1.00 MiB host)";; esac',
        'echo "common_perf_print: prompt eval time =  573.10 ms / 35131 tokens (0.02 ms per token, 31000.00 tokens per second)"',
        'echo "common_perf_print:        eval time =  70.00 ms /    63 runs   (1.00 ms per token,  $tg tokens per second)"'])
    monkeypatch.setenv("SEQ", str(tmp_path / "seq"))
    monkeypatch.setenv("ORDER", str(tmp_path / "order"))
    a = gpu.parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                        "--work", str(tmp_path), "--out", str(tmp_path), "--targets", "--shares", "0.5", "1.0",
                        "--target-reps", "3", "--small-tail-reps", "11"])
    res = gpu.gate_d(a, tmp_path / "m.gguf", tmp_path, tmp_path)
    assert (tmp_path / "seq").read_text() == ""  # every small-tail run was made: 1 in the curve, 2 repeats, 8 pairs
    med = res["targets"]["tail_medians"]
    assert med["runs"] == 3 and med["small_tail_runs"] == 11
    t = med["small_tail"]
    assert t["ratio_runs"] == [x / 1000 for x in small]
    assert t["runs_verdict"].startswith("met in runs 4-8 of 11 by size"), t["runs_verdict"]
    # the other points ran 3 times each; the pairs after them take turns leading
    order = (tmp_path / "order").read_text().split()
    assert order.count("nkvo") == 3 and order.count("256") == 3
    pairs = order[-16:]
    assert [pairs[i:i + 2] for i in range(0, 16, 2)] == [["34816", "full"], ["full", "34816"]] * 4
    # three runs of the same swing would not have decided it
    assert tail_models_verdict(small[:3]).startswith("not decided")


def tail_models_verdict(ratios_tps: list[int]) -> str:
    from gates import tail_models

    return tail_models.add_runs({"target": 0.9, "met": True}, [x / 1000 for x in ratios_tps])["runs_verdict"]


def test_tail_target_runs_verdict_up_to_five_runs_says_met_or_missed_only_where_every_run_agrees():
    from gates import tail_models

    def t(ratios, met=True):
        return tail_models.add_runs({"target": 0.9, "met": met}, ratios)

    assert t([0.88, 0.893, 0.89])["runs_verdict"] == "missed in each of 3 runs (0.88-0.893)"
    assert t([0.91, 0.95])["runs_verdict"] == "met in each of 2 runs (0.91-0.95)"
    # judged before rounding, and shown to 4 places: 0.89996 misses 0.9 though it shows as 0.9
    assert t([0.95, 0.8996])["runs_verdict"] == "not decided: its 2 runs (0.8996-0.95) fall on both sides of it"
    assert t([0.95, 0.89996])["runs_verdict"] == "not decided: its 2 runs (0.9-0.95) fall on both sides of it"
    assert t([0.89996, 0.89])["runs_verdict"] == "missed in each of 2 runs (0.89-0.9)"
    # a run without a figure leaves the target undecided, whatever the others say
    gap = t([0.95, None, 0.96])
    assert gap["runs_verdict"] == "not decided: 2 of 3 runs gave a figure" and gap["met_in_every_run"] is False
    assert t([0.95])["runs_verdict"] == "not decided: 1 of 1 runs gave a figure"  # one run is no spread
    # a target that could not be checked keeps its note, and gets no verdict from runs
    unchecked = t([0.95, 0.96], met=None)
    assert "runs_verdict" not in unchecked and unchecked["ratio_runs"] == [0.95, 0.96]


def test_median_order_is_the_narrowest_order_statistics_with_the_coverage_asked():
    from gates import tail_models

    # distribution-free: P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Bin(n, 1/2) < k)
    cov = tail_models.MEDIAN_COVERAGE
    assert [tail_models.median_order(n, cov) for n in (2, 3, 5, 6, 7, 9)] == [
        (1, 0.5), (1, 0.75), (1, 0.9375), (2, 0.78125), (2, 0.875), (3, 0.8203125)]
    for n in range(2, 16):  # the next narrower interval would fall under the coverage (where there is one)
        k, got = tail_models.median_order(n, cov)
        assert k == 1 or got >= cov
        if k + 1 <= n // 2:
            narrower = 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
            assert narrower < cov


def test_tail_target_verdict_from_seven_runs_lets_the_smallest_and_largest_go():
    from gates import tail_models

    def t(ratios):
        return tail_models.add_runs({"target": 0.9, "met": True}, ratios)

    # one slow run among seven (a resident run that happened to be fast) no longer undecides a clear median
    met = t([0.86, 0.93, 0.95, 0.94, 0.92, 0.91, 0.97])
    assert met["runs_verdict"] == ("met in runs 2-6 of 7 by size (0.91-0.95, an interval for the median at 87.5%; "
                                   "all 7: 0.86-0.97)")
    assert met["met_in_every_run"] is False and met["median_interval"] == {"runs": [2, 6], "coverage": 0.875}
    # but two runs under the target, one inside the interval, leave it undecided
    assert t([0.86, 0.93, 0.95, 0.94, 0.92, 0.89, 0.97])["runs_verdict"] == (
        "not decided: runs 2-6 of its 7 by size (0.89-0.95; all 7: 0.86-0.97) fall on both sides of it")
    assert t([0.8, 0.85, 0.86, 0.84, 0.92, 0.89, 0.87])["runs_verdict"].startswith("missed in runs 2-6 of 7 by size")
    # three runs: every run must agree, as before
    assert t([0.863, 0.935, 0.917])["runs_verdict"] == "not decided: its 3 runs (0.863-0.935) fall on both sides of it"


def test_tail_models_count_the_tail_past_the_cells_in_device_memory():
    from gates import tail_models

    # a 34,780-cell window whose tensors keep 32,768 cells in device memory (2 MiB granules of 1 KiB rows)
    rows = [{"config": "window", "rc": 0, "tail_share": 0.0, "resident_cells": 131072, "device_cells": "",
             "prompt_tokens": 35131, "decode_tps": 930.0},
            {"config": "window", "rc": 0, "tail_share": 0.01, "resident_cells": 34780, "device_cells": 32768,
             "prompt_tokens": 35131, "decode_tps": 481.0}]
    pts = tail_models.curve_points(rows, 64, 16384)
    assert pts[0][0] == 0.0
    assert pts[1][0] == pytest.approx((35131 + 32 - 32768) * 16384 / 2**20)  # 37.4 MiB, not the window's 5.9
    rows[1]["device_cells"] = ""  # an older curve without the column: the window it kept
    assert tail_models.curve_points(rows, 64, 16384)[1][0] == pytest.approx((35131 + 32 - 34780) * 16384 / 2**20)
    # the small-tail target is judged at the share past device memory: 6.7 % there is no 1 % tail
    rows[1]["device_cells"] = 32768
    t = tail_models.tail_targets(rows, 55.0, 64, 16384)
    assert t["small_tail"]["device_tail_share"] == round((35131 - 32768) / 35131, 4) and t["small_tail"]["met"] is None
    assert "not checked: no forced window with at most 0.03 of the prompt past device memory (the smallest is 0.0673)" \
        in tail_models.target_line("small_tail", t["small_tail"])
    # a window of whole granules (34,816 cells, 0.9 % past device memory) is the one it is judged at
    rows.append({"config": "window", "rc": 0, "tail_share": 0.009, "resident_cells": 34816, "device_cells": 34816,
                 "prompt_tokens": 35131, "decode_tps": 600.0})
    t = tail_models.tail_targets(rows, 55.0, 64, 16384)
    assert t["small_tail"]["tail_share"] == 0.009 and t["small_tail"]["device_tail_share"] == 0.009
    assert t["small_tail"]["ratio"] == pytest.approx(600 / 930, abs=1e-3) and t["small_tail"]["met"] is False
    # a forced window whose device part holds the whole prompt has no tail: never the small-tail point
    rows[-1]["device_cells"] = 36864
    assert tail_models.tail_targets(rows, 55.0, 64, 16384)["small_tail"]["tail_share"] == 0.01


def test_tail_models_targets_from_a_curve_csv(tmp_path: Path):
    rows = [("window", 0.0, 0, 131072, 35131, 1000.0), ("window", 0.01, 0, 34780, 35131, 950.0),
            ("window", 0.5, 0, 17566, 35131, 150.0), ("window", 0.9927, 0, 256, 35131, 80.0),
            ("upstream --no-kv-offload", 1.0, 0, 0, 35131, 15.0)]
    curve = tmp_path / "rolling_kv_curve.csv"
    with curve.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "tail_share", "rc", "resident_cells", "prompt_tokens", "decode_tps"])
        w.writerows(rows)
    out = tmp_path / "models.json"
    r = run_module("gates.tail_models", str(curve), "--link-gbps", "55", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    small, large = res["targets"]["small_tail"], res["targets"]["large_tail"]
    assert small["ratio"] == 0.95 and small["met"]
    tail_bytes = (35131 + 32 - 256) * 8 * 2 * 4 * 128 * 2  # the prompt past the window, half the 64 decoded tokens
    assert large["link_limit_tps"] == round(55e9 / tail_bytes, 2)
    assert large["ratio"] == round(80.0 / (55e9 / tail_bytes), 3) and not large["met"]
    assert len(res["decode"]["points"]) == 4  # the forced-window rows only
    assert "0.95 (target 0.9, met)" in r.stdout
    # a curve without a point near 1 % (or near 100 %) leaves that target not checked, never met or missed
    from gates import tail_models

    far = [{"config": c, "tail_share": t, "rc": rc, "resident_cells": n, "prompt_tokens": p, "decode_tps": d}
           for c, t, rc, n, p, d in rows if t not in (0.01, 0.9927)]
    t = tail_models.tail_targets(far, 55.0, 64, 8 * 2 * 4 * 128 * 2)
    assert t["small_tail"]["met"] is None and t["small_tail"]["tail_share"] == 0.5
    assert t["large_tail"]["met"] is None and "not checked" in tail_models.target_line("large_tail", t["large_tail"])
    assert "not checked: no forced window with at most 0.03 of the prompt past device memory" \
        in tail_models.target_line("small_tail", t["small_tail"])


def test_tail_models_refuses_a_file_that_is_not_a_curve(tmp_path: Path):
    bad = tmp_path / "budget_curve.csv"
    bad.write_text("ctx,budget_mib\n131072,1900\n")
    r = run_module("gates.tail_models", str(bad), "--link-gbps", "55")
    assert r.returncode == 1 and "not a gate d curve" in r.stderr
    r = run_module("gates.tail_models", str(tmp_path / "missing.csv"), "--link-gbps", "55")
    assert r.returncode == 1 and "cannot read" in r.stderr


def test_plot_writes_a_png(tmp_path: Path):
    pytest.importorskip("matplotlib")
    from gates.plot import main

    csv_path = tmp_path / "c.csv"
    csv_path.write_text("config,tail_share,rc,resident_cells,device_mib_peak,prompt_tokens,prefill_tps,decode_tps\n"
                        "window,0.0,0,131072,3800,35131,61000,980\n"
                        "window,0.5,0,17565,2900,35131,30000,90\n"
                        "window,1.0,0,256,2600,35131,20000,60\n"
                        "upstream --no-kv-offload,1.0,0,0,2000,35131,10959,15\n")
    csv_path.with_suffix(".json").write_text(json.dumps({"prompt_tokens": 35131, "ctx": 131072,
                                                         "link": {"pinned_gbps": 55.0}}))
    assert main([str(csv_path), "-o", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_titles_name_the_cards_the_results_recorded():
    from gates.common import card_names

    h200, h100 = "NVIDIA H200, 143771 MiB, 580.159.04", "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"
    assert card_names([h200, h200]) == "H200"
    assert card_names([h200, h100]) == "H100 80GB HBM3 and H200"
    assert card_names([]) == card_names([" "]) == "card not recorded"


def test_plot_budget_names_each_context_s_cards_from_the_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes
    import matplotlib.figure

    from gates.plot_budget import main

    titles: list[str] = []
    set_title, suptitle = matplotlib.axes.Axes.set_title, matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, t, *k, **kw: (titles.append(t),
                                                                                     set_title(ax, t, *k, **kw))[1])
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda f, t, *k, **kw: (titles.append(t),
                                                                                      suptitle(f, t, *k, **kw))[1])
    csv_path = tmp_path / "budget_curve.csv"
    csv_path.write_text("ctx,budget_mib,config,fits_budget,prefill_tps,decode_tps\n"
                        "131072,2100,window f16,True,40000,150\n131072,2400,window f16,True,60000,900\n"
                        "1048576,2300,window f16,True,50000,800\n1048576,2900,window f16,True,55000,850\n")
    csv_path.with_suffix(".json").write_text(json.dumps({"points": {
        "131072 2100": {"device": ["NVIDIA H200, 143771 MiB, 580.159.04"]},
        "1048576 2300": {"device": ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"]}}}))
    assert main([str(csv_path), "-o", str(tmp_path / "b.png")]) == 0
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ctx 131,072 (H200): decode tokens/s" in titles
    assert "ctx 1,048,576 (H100 80GB HBM3): prefill tokens/s" in titles
    assert any(t.startswith("H100 80GB HBM3 and H200, ") for t in titles)


def test_gpu_before_copy_runs_the_full_build_on_the_copying_path(tmp_path: Path):
    from gates.gpu import gate_e, parse_args

    bin_dir = tmp_path / "full"
    bin_dir.mkdir()
    tool = bin_dir / "llama-completion"
    tool.write_text('#!/bin/sh\nif [ "$OPENCOTI_KV_DEBUG" = copy-tail ]; then mib=4096.01; else mib=1084.01; fi\n'
                    'echo "sched_reserve:      CUDA0 compute buffer size =  $mib MiB"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    a = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--before-copy", "--buffer-ctxs", "1048576"])
    assert a.before_bin == bin_dir and a.before_env == {"OPENCOTI_KV_DEBUG": "copy-tail"}
    res = gate_e(a, tmp_path / "m.gguf", tmp_path)
    assert res["pass"]
    assert res["rows"] == [{"ctx": 1048576, "upstream_mib": 1084.01, "upstream_rc": 0, "window_mib": 1084.01,
                            "window_rc": 0, "window_before_mib": 4096.01, "window_before_rc": 0}]
    assert all(c["met"] for c in res["checks"])
    # without --before-copy there is no "before" build
    b = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir)])
    assert b.before_bin is None and b.before_env == {}
    # --compare-debug: the full build with other debug flags is "before"
    c = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--compare-debug", "no-tail-segments"])
    assert c.before_bin == bin_dir and c.before_env == {"OPENCOTI_KV_DEBUG": "no-tail-segments"}
    assert c.before_label == "this build with OPENCOTI_KV_DEBUG=no-tail-segments"
    with pytest.raises(SystemExit):
        parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--compare-debug", "no-tail-segments", "--before-copy"])


def test_gpu_needs_the_build_without_0089_only_for_gate_a(tmp_path: Path, capsys: pytest.CaptureFixture):
    # no other gate runs the series without 0089, so a machine without time for that build runs the others
    from gates.gpu import builds_used, main, parse_args

    full, up, missing = tmp_path / "full", tmp_path / "upstream", tmp_path / "pre0089-not-built"
    args = ["--full-bin", str(full), "--pre-bin", str(missing), "--upstream-bin", str(up)]
    assert builds_used(parse_args([*args, "--only", "b,h"])) == {"full": full, "upstream": up}
    assert builds_used(parse_args([*args, "--only", "g,a"])) == {"full": full, "pre0089": missing, "upstream": up}
    assert list(builds_used(parse_args([*args, "--before-copy"]))) == ["full", "pre0089", "upstream", "before"]
    # --pre-bin is asked for only where gate a runs: without it the other gates run, gate a is refused at once
    bare = ["--full-bin", str(full), "--upstream-bin", str(up)]
    assert builds_used(parse_args([*bare, "--only", "g,h"])) == {"full": full, "upstream": up}
    for only in (["--only", "g,a"], []):  # the default --only holds a
        with pytest.raises(SystemExit):
            parse_args([*bare, *only])
    assert "--pre-bin is required for gate a" in capsys.readouterr().err
    # where gate a runs, the missing build stops it before any gate, naming the program and where it was looked for
    for d in (full, up):
        d.mkdir()
        fake_tool(d / "llama-completion", "echo ok")
    assert main([*args, "--only", "a", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]) == 2
    assert f"llama-completion not found in {missing}" in capsys.readouterr().err


def _up(config: str, budget: int, ctx: int, fits: bool, pp: float | str = "", tg: float | str = "",
        kv_ctx: int | None = None) -> dict:
    return {"ctx": ctx, "budget_mib": budget, "config": config, "fits_budget": fits, "prefill_tps": pp,
            "decode_tps": tg, "kv_ctx": kv_ctx or ctx}


def test_budget_rows_give_an_upstream_run_a_row_per_budget_and_a_window_run_its_own():
    from gates.gpu import budget_rows

    up = {"rc": 0, "device_mib_peak": 2500, "prefill_tps": 60000.0, "decode_tps": 700.0, "prompt_tokens": 35131}
    rows = budget_rows(131072, [2000, 3000], "upstream q4_0", up, 131072)
    assert [(r["budget_mib"], r["fits_budget"], r["decode_tps"], r["note"]) for r in rows] == [
        (2000, False, "", "does not fit"), (3000, True, 700.0, "")]
    assert rows[1]["resident_cells"] == 131072 and rows[1]["vram_target_mib"] == ""
    nkvo = budget_rows(131072, [2000], "upstream f16 -nkvo", up | {"device_mib_peak": 1900}, 131072)
    assert nkvo[0]["fits_budget"] and nkvo[0]["resident_cells"] == 0
    win = {"rc": 0, "device_mib_peak": 2390, "prefill_tps": 40000.0, "decode_tps": 600.0,
           "window": {"resident": 25600, "kv_size": 131072, "tail": 105472, "tail_mib": 400.0}}
    w = budget_rows(131072, [2400], "window q4_0", win, 131072, target=1950)
    assert len(w) == 1 and w[0]["fits_budget"] and w[0]["resident_cells"] == 25600 and w[0]["vram_target_mib"] == 1950
    # over its budget (the overhead estimate was short): figures kept out, said so
    over = budget_rows(131072, [2300], "window q4_0", win, 131072, target=1850)
    assert not over[0]["fits_budget"] and over[0]["note"] == "does not fit" and over[0]["decode_tps"] == ""
    failed = budget_rows(131072, [2300], "window q8_0", {"rc": 1, "device_mib_peak": 900}, 131072, target=1850)
    assert failed[0]["note"] == "did not boot" and not failed[0]["fits_budget"]


def test_budget_goals_compare_the_best_window_with_what_upstream_serves_at_that_budget():
    from gates.gpu import budget_goals

    ctx = 131072
    rows = [
        # 2000 MiB: only -nkvo fits upstream; the window decodes 15x faster
        _up("upstream q4_0", 2000, ctx, False), _up("upstream f16 -nkvo", 2000, ctx, True, 8000.0, 10.0),
        _up("window q4_0", 2000, ctx, True, 30000.0, 150.0), _up("window f16", 2000, ctx, True, 35000.0, 140.0),
        # 3000 MiB: upstream q4_0 fits; window q4_0 reaches 0.986 / 0.983 of it
        _up("upstream q4_0", 3000, ctx, True, 60000.0, 700.0), _up("upstream f16 -nkvo", 3000, ctx, True, 8000.0, 10.0),
        _up("window q4_0", 3000, ctx, True, 59000.0, 690.0), _up("window f16", 3000, ctx, True, 45000.0, 500.0),
        # sized to the prompt: a reference, never the goal's comparison
        _up("upstream f16 ctx sized to the prompt", 3000, ctx, True, 64000.0, 980.0, kv_ctx=36864),
        # 3500 MiB: the window falls short in prefill
        _up("upstream q4_0", 3500, ctx, True, 60000.0, 700.0), _up("window q4_0", 3500, ctx, True, 50000.0, 700.0),
        # 1500 MiB: nothing upstream fits
        _up("upstream f16 -nkvo", 1500, ctx, False), _up("window f16", 1500, ctx, True, 20000.0, 100.0),
    ]
    g = {x["budget_mib"]: x for x in budget_goals(rows)}
    assert g[2000]["reference"] == "upstream f16 -nkvo" and g[2000]["decode_ratio"] == 15.0 and g[2000]["met"] is True
    assert g[3000]["reference"] == "upstream q4_0" and g[3000]["best_window"] == "window q4_0"
    assert (g[3000]["decode_ratio"], g[3000]["prefill_ratio"], g[3000]["met"]) == (0.986, 0.983, True)
    assert g[3500]["met"] is False and g[3500]["prefill_ratio"] == 0.833
    assert g[1500]["met"] is None and g[1500]["best_window"] == "window f16"


def test_write_budget_csv_keeps_the_rows_of_contexts_measured_in_an_earlier_call(tmp_path: Path):
    from gates.gpu import BUDGET_FIELDS, write_budget_csv

    path = tmp_path / "budget_curve.csv"
    first = [_up("window f16", 2000, 131072, True, 1.0, 2.0) | {k: "" for k in BUDGET_FIELDS if k not in
                                                                  ("ctx", "budget_mib", "config", "fits_budget",
                                                                   "prefill_tps", "decode_tps", "kv_ctx")}]
    write_budget_csv(path, first, [131072])
    second = [dict(first[0], ctx=1048576, kv_ctx=1048576, budget_mib=3000)]
    rows = write_budget_csv(path, second, [1048576])
    assert [(r["ctx"], r["budget_mib"]) for r in rows] == [(131072, 2000), (1048576, 3000)]
    assert path.read_text().splitlines()[0] == ",".join(BUDGET_FIELDS)
    # measuring a context again replaces its rows
    again = write_budget_csv(path, [dict(second[0], budget_mib=3100)], [1048576])
    assert [(r["ctx"], r["budget_mib"]) for r in again] == [(131072, 2000), (1048576, 3100)]
    # a curve too long for one call, a few budgets a call: a (ctx, budget) point replaces that point's rows only
    more = write_budget_csv(path, [dict(second[0], budget_mib=5000, decode_tps=7.0)], {(1048576, 5000)})
    assert [(r["ctx"], r["budget_mib"]) for r in more] == [(131072, 2000), (1048576, 3100), (1048576, 5000)]
    redo = write_budget_csv(path, [dict(second[0], budget_mib=3100, decode_tps=9.0)], {(1048576, 3100)})
    assert [(r["ctx"], r["budget_mib"], float(r["decode_tps"])) for r in redo] == [
        (131072, 2000, 2.0), (1048576, 3100, 9.0), (1048576, 5000, 7.0)]


def test_a_curve_write_cut_short_leaves_the_last_whole_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # a call killed by its time limit while it rewrote the curve left it truncated, and the next call keeps the rows
    # of the points it does not measure from that file: the write goes to a sibling renamed over it
    import gates.common as common
    from gates.gpu import BUDGET_FIELDS, write_budget_csv

    path = tmp_path / "budget_curve.csv"
    row = _up("window f16", 2000, 131072, True, 1.0, 2.0) | {k: "" for k in BUDGET_FIELDS if k not in
                                                             ("ctx", "budget_mib", "config", "fits_budget",
                                                              "prefill_tps", "decode_tps", "kv_ctx")}
    write_budget_csv(path, [row], [131072])
    before = path.read_bytes()

    def killed(src, dst):
        assert Path(src).read_text().count("\n") == 3  # the new file was whole beside the old one
        raise KeyboardInterrupt  # the time limit, between the write and the rename

    monkeypatch.setattr(common.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_budget_csv(path, [dict(row, ctx=1048576, kv_ctx=1048576, budget_mib=3000)], [1048576])
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["budget_curve.csv"]
    monkeypatch.undo()
    common.write_whole(path, "whole\n")
    assert path.read_text() == "whole\n" and sorted(p.name for p in tmp_path.iterdir()) == ["budget_curve.csv"]


def test_gate_g_measures_every_configuration_at_every_budget(tmp_path: Path):
    from gates.gpu import gate_g, parse_args

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # a stand-in llama-completion: window runs log a window, -nkvo decodes slowly, q4_0 faster than f16
    fake_tool(bin_dir / "llama-completion", "\n".join([
        'case "$*" in *vram-target*) echo "llama_kv_cache: position window = 25600 / 131072 cells resident + host '
        'tail 105472 cells (400.00 MiB host) [CUDA0, auto, budget 100.00 MiB]";; esac',
        'case "$*" in *-nkvo*) tg=10.00;; *q4_0*) tg=700.00;; *--no-kv-prefill-copy*) tg=650.00;; *) tg=600.00;; esac',
        'echo "common_perf_print: prompt eval time =     573.10 ms / 35131 tokens (    0.02 ms per token, '
        '61300.00 tokens per second)"',
        'echo "common_perf_print:        eval time =      26.69 ms /    63 runs   (    0.86 ms per token, '
        '$tg tokens per second)"']), script=True)
    a = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--budget-ctxs", "131072", "--budgets-128k", "2000", "3000", "--curve-words", "50"])
    out = tmp_path / "out"
    out.mkdir()
    res = gate_g(a, tmp_path / "m.gguf", tmp_path, out)
    assert res["pass"]
    rows = list(csv.DictReader(open(out / "budget_curve.csv", newline="")))
    configs = {r["config"] for r in rows}
    assert configs == {"upstream f16", "upstream q8_0", "upstream q4_0", "upstream f16 -nkvo", "window f16",
                       "window f16 --no-kv-prefill-copy", "window q8_0", "window q4_0",
                       "upstream f16 ctx sized to the prompt",
                       "upstream q8_0 ctx sized to the prompt", "upstream q4_0 ctx sized to the prompt"}
    assert {(r["config"], r["budget_mib"]) for r in rows} == {(c, b) for c in configs for b in ("2000", "3000")}
    sized = next(r for r in rows if r["config"] == "upstream f16 ctx sized to the prompt")
    assert sized["kv_ctx"] == str((35131 + 64 + 1023) // 1024 * 1024)
    assert next(r for r in rows if r["config"] == "window q4_0")["resident_cells"] == "25600"
    # the setting reaches the run it names, and only that one
    decode = {r["config"]: r["decode_tps"] for r in rows if r["config"].startswith("window") and r["budget_mib"] == "2000"}
    assert decode == {"window f16": "600.0", "window f16 --no-kv-prefill-copy": "650.0", "window q8_0": "600.0",
                      "window q4_0": "700.0"}
    meta = json.loads((out / "budget_curve.json").read_text())
    assert meta["contexts"]["131072"]["prompt_tokens"] == 35131
    assert {g["budget_mib"] for g in res["goals"]} == {2000, 3000}
    # a second call measures another budget of the same context into the same folder: the curve keeps both calls'
    # points, and the goals are judged at every one of them
    a2 = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                     "--budget-ctxs", "131072", "--budgets-128k", "4000", "--curve-words", "50"])
    res2 = gate_g(a2, tmp_path / "m.gguf", tmp_path, out)
    rows2 = list(csv.DictReader(open(out / "budget_curve.csv", newline="")))
    assert {(r["config"], r["budget_mib"]) for r in rows2} == {(c, b) for c in configs for b in ("2000", "3000", "4000")}
    assert [r for r in rows2 if r["budget_mib"] != "4000"] == rows
    assert {g["budget_mib"] for g in res2["goals"]} == {2000, 3000, 4000}


def test_window_config_names_give_the_cache_type_and_the_settings():
    from gates.gpu import WINDOW_CONFIGS, window_config

    assert window_config("window q4_0") == ("q4_0", [])
    assert window_config("window f16 --no-kv-prefill-copy") == ("f16", ["--no-kv-prefill-copy"])
    assert [window_config(c)[0] for c in WINDOW_CONFIGS] == ["f16", "f16", "q8_0", "q4_0"]
    for bad in ("upstream f16", "window", "window f16 sized"):
        with pytest.raises(ValueError, match="not a window configuration"):
            window_config(bad)


def test_gpu_run_reads_the_cache_pass_two_built_when_it_is_fully_resident(tmp_path: Path):
    from gates.gpu import run

    tool = fake_tool(tmp_path / "llama-completion", "\n".join([
        "llama_kv_cache: position window = 256 / 131072 cells resident + host tail 130816 cells (562.00 MiB host) "
        "[CUDA0, measure pass, budget 0.00 MiB]",
        "llama_context: two-pass compute reserve: measured 443 MiB, pass 2 sizes the KV window with a 699 MiB reserve",
        "llama_kv_cache: position window = FULLY RESIDENT (131072 / 131072 cells on CUDA0, 576.00 MiB, auto, "
        "budget 2000.00 MiB)"]))
    r = run("t", [str(tool)], tmp_path)
    assert r.get("window") is None and r["fully_resident"]


def test_gate_c_compares_each_quantized_cache_with_resident_of_the_same_type(tmp_path: Path):
    from gates.gpu import gate_c, parse_args

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # a stand-in llama-perplexity: records its cache type and base file, logs a window when one is forced
    fake_tool(bin_dir / "llama-perplexity", "\n".join([
        f'echo "$*" >> {tmp_path}/calls.txt',
        'if [ -n "$LLAMA_ARG_KV_WINDOW_CELLS" ]; then echo "llama_kv_cache: position window = $LLAMA_ARG_KV_WINDOW_CELLS'
        ' / 16384 cells resident + host tail 1 cells (1.00 MiB host) [CUDA0, forced, budget 0.00 MiB]"; fi',
        'echo "Maximum KLD:   0.000034"', 'echo "Same top p: 100.000 ± 0.000 %"']), script=True)
    a = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--windows", "256", "--windows-4k", "512", "--windows-16k", "8192", "--c-sized-ub1-8k",
                    "--c-cpu-reference"])
    res = gate_c(a, tmp_path / "m.gguf", tmp_path)
    assert res["pass"]
    got = [(w["cache"], w["window"], w["ubatch"], w["ctx"]) for w in res["windows"]]
    # f16 at 3,072 and 1,024 cells: tensors that are not whole 2 MiB granules
    assert got == [("f16", 256, 512, 2048), ("f16", 256, 1, 2048), ("f16", 3072, 1, 4096), ("f16", 512, 512, 4096),
                   ("f16", 2560, 512, 3072), ("f16", 1024, 512, 3072), ("f16", 512, 128, 1024),
                   ("q8_0", 8192, 512, 16384), ("q8_0", 6144, 1, 8192), ("q8_0", 7680, 1, 8192),
                   ("q4_0", 8192, 512, 16384), ("q4_0", 6144, 1, 8192), ("q4_0", 7680, 1, 8192)]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    # each quantized window reads the base its own type's resident run wrote
    q4 = [c for c in calls if "-ctk q4_0 -ctv q4_0" in c]
    assert len(q4) == 5 and all("resident-ub512-c16384-q4_0.kld" in c or "resident-ub1-c8192-q4_0.kld" in c for c in q4)
    # the decode rows alone (every token a decode), an emptied list leaves its rows out
    (tmp_path / "calls.txt").unlink()
    a = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--c-decode-only", "--windows", "1024", "--windows-ub1-4k", "--c-sized-ub1-8k",
                    "--c-cpu-reference"])
    got = [(w["cache"], w["window"], w["ubatch"], w["ctx"]) for w in gate_c(a, tmp_path / "m.gguf", tmp_path)["windows"]]
    assert got == [("f16", 1024, 1, 2048), ("q8_0", 6144, 1, 8192), ("q8_0", 7680, 1, 8192),
                   ("q4_0", 6144, 1, 8192), ("q4_0", 7680, 1, 8192)]
    assert all(" -ub 1 " in c for c in (tmp_path / "calls.txt").read_text().splitlines())
    # a KLD over the bound fails the gate
    fake_tool(bin_dir / "llama-perplexity", 'echo "position window = 1 / 2 cells resident + host tail 1 cells (1.00 MiB '
              'host)"; echo "Maximum KLD:   0.043567"; echo "Same top p: 92.479 ± 0.1 %"', script=True)
    assert not gate_c(a, tmp_path / "m.gguf", tmp_path)["pass"]


def _flag_perplexity(bin_dir: Path, flag: str, lines: str) -> None:
    """A stand-in llama-perplexity for gate c's window runs: a forced window's log line, and `lines` (shell) run
    only where OPENCOTI_KV_DEBUG names `flag`; every run within the bound."""
    fake_tool(bin_dir / "llama-perplexity", "\n".join([
        'if [ -n "$LLAMA_ARG_KV_WINDOW_CELLS" ]; then echo "llama_kv_cache: position window ='
        ' $LLAMA_ARG_KV_WINDOW_CELLS / 2048 cells resident + host tail 1 cells (1.00 MiB host) [CUDA0, forced,'
        f' budget 0.00 MiB]"; case ",$OPENCOTI_KV_DEBUG," in *,{flag},*) ' + lines + ' ;; esac; fi',
        'echo "Maximum KLD:   0.000034"', 'echo "Same top p: 100.000 ± 0.000 %"']), script=True)


def _gate_c_decode_args(bin_dir: Path, *extra: str):
    from gates.gpu import parse_args

    return parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                       "--c-decode-only", "--windows", "1024", "256", "--windows-ub1-4k", "--quant-caches", *extra])


def test_gate_c_with_the_carry_trial_asked_for_needs_a_run_whose_trial_ended(tmp_path: Path):
    from gates.gpu import gate_c

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    perplexity = functools.partial(_flag_perplexity, bin_dir, "ring-carry-trial")
    args = functools.partial(_gate_c_decode_args, bin_dir)

    perplexity('echo "opencoti_ring_trial_tick: tail ring: ring-carry dropped: a token took 0.900 ms carrying, '
               '0.800 ms not (medians of 8)"')
    res = gate_c(args("--window-debug", "tail-ring,ring-carry-trial"), tmp_path / "m.gguf", tmp_path)
    assert res["pass"] and "verdict" not in res
    assert all(w["flags_ran"] == ["ring-carry-trial"] for w in res["windows"])
    assert res["windows"][0]["carry_trials"] == [{"kept": False, "carrying_ms": 0.9, "not_carrying_ms": 0.8}]
    # asked for, and no run's trial came to its end (too few decodes, or tails the ring never planned): not checked
    perplexity("true")
    res = gate_c(args("--window-debug", "tail-ring,ring-carry-trial"), tmp_path / "m.gguf", tmp_path)
    assert not res["pass"] and res["verdict"] == "not checked"
    assert "no carry trial ran to its end" in res["why_not_checked"] and all(w["pass"] for w in res["windows"])


def test_gate_c_with_the_carry_asked_for_needs_a_run_that_read_carried_chunks(tmp_path: Path):
    from gates.gpu import gate_c

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    perplexity = functools.partial(_flag_perplexity, bin_dir, "ring-carry")  # a window run, the flag's lines
    args = functools.partial(_gate_c_decode_args, bin_dir)

    read = ('echo "opencoti_fattn_ring_begin: tail ring: 3 carried chunk(s) read by graph 7 (the first time in this'
            ' context)"; echo "opencoti_fattn_ring_begin: tail ring: carried chunks dropped: a write into a mapped'
            ' buffer came before graph 40 (the first time in this context)"')
    perplexity(read)
    res = gate_c(args("--window-debug", "tail-ring,ring-carry"), tmp_path / "m.gguf", tmp_path)
    assert res["pass"] and res["carry"] == {"rows_read": 2, "rows_dropped_on_write": 2}
    assert all(w["carry_read"] and w["carry_dropped_on_write"] for w in res["windows"])
    # asked for, and no run read a carried chunk: not checked, though every row is within the bound
    perplexity("true")
    res = gate_c(args("--window-debug", "ring-carry"), tmp_path / "m.gguf", tmp_path)
    assert not res["pass"] and res["verdict"] == "not checked" and "the carry did not run" in res["why_not_checked"]
    assert res["carry"] == {"rows_read": 0, "rows_dropped_on_write": 0} and all(w["pass"] for w in res["windows"])
    # not asked for: the rows judge alone, and the count says the carry did not run
    res = gate_c(args(), tmp_path / "m.gguf", tmp_path)
    assert res["pass"] and "verdict" not in res and res["carry"]["rows_read"] == 0


def fake_perplexity_kld(bin_dir: Path, tmp_path: Path) -> None:
    """A stand-in llama-perplexity for gate c's decode rows: a forced window (LLAMA_ARG_KV_WINDOW_CELLS) or a window
    sized from --vram-target T (T - 300) * 100 cells (at least 256), 3 of 8 layers given a granule more; its KLD (max, mean) read
    from the files w-res, w-cpu and r-cpu (a window against resident, a window against the CPU, resident against the
    CPU)."""
    fake_tool(bin_dir / "llama-perplexity", "\n".join([
        f'd={tmp_path}; echo "$*" >> $d/calls.txt',
        'case "$*" in *cpu-*.kld*--kl-divergence*) cpu=1 ;; *) cpu= ;; esac',
        't=$(echo "$*" | sed -n "s/.*--vram-target \\([0-9]*\\).*/\\1/p")',
        'w=$LLAMA_ARG_KV_WINDOW_CELLS; how=forced',
        'if [ -n "$t" ]; then w=$(( (t - 300) * 100 )); [ $w -lt 256 ] && w=256; how=auto; fi',
        'if [ -n "$w" ] && [ "$w" -ge 8192 ]; then echo "llama_kv_cache: position window = FULLY RESIDENT (8192 / 8192'
        ' cells on CUDA0, 36.00 MiB, auto, budget 1.00 MiB)"; w=; win=; elif [ -n "$w" ]; then win=1;'
        ' echo "llama_kv_cache: position window = $w / 8192 cells resident + host tail $((8192 - w)) cells'
        ' ($(printf %d.%02d $(( (8192 - w) / 100 )) $(( (8192 - w) % 100 ))) MiB host) [CUDA0, $how, budget 1.00 MiB]";'
        ' [ $how = auto ] && echo "llama_kv_cache: the mapping granularity\'s remainders: 3 of 8 layers hold one'
        ' granule more of K and of V in device memory"; else win=; fi',
        'case "$*" in *ppl-short.txt*) exit 1 ;; esac',
        'f=r-cpu; [ -n "$win" ] && f=w-res && [ -n "$cpu" ] && f=w-cpu; [ -z "$win" ] && [ -z "$cpu" ] && f=none',
        'if [ $f = none ]; then echo "kld base written"; else read mx mn < $d/$f; echo "Mean    KLD:   $mn ± 0.1";'
        ' echo "Maximum KLD:   $mx"; fi',
        'echo "Same top p: 99.829 ± 0.000 %"']), script=True)


def kld_files(tmp_path: Path, w_res: str, w_cpu: str, r_cpu: str) -> None:
    for name, v in (("w-res", w_res), ("w-cpu", w_cpu), ("r-cpu", r_cpu)):
        (tmp_path / name).write_text(v + "\n")


def test_gate_c_passes_a_decode_merge_within_the_kernels_own_spread_and_no_other(tmp_path: Path):
    from gates.gpu import gate_c, parse_args

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_perplexity_kld(bin_dir, tmp_path)
    a = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--c-decode-only", "--windows-ub1-4k", "--quant-caches", "q4_0",
                    "--windows-ub1-8k", "7680", "--c-sized-ub1-8k"])  # --c-cpu-reference: q4_0 by default
    a.windows = []  # the quantized decode rows alone
    # the H200's q4_0 row: the window misses 2e-4 against resident, and is as near the CPU as resident is
    kld_files(tmp_path, "0.000747 0.000038", "0.033200 0.007087", "0.037736 0.007100")
    res = gate_c(a, tmp_path / "m.gguf", tmp_path)
    row = next(w for w in res["windows"] if w["cache"] == "q4_0")
    assert res["pass"] and not row["within_bound"] and row["within_spread"] and row["pass"]
    assert res["cpu_reference"] == [{"rows": "ub1-c8192-q4_0", "cpu_rc": 0,
                                     "resident": {"mean_kld": 0.0071, "max_kld": 0.037736, "same_top_pct": 99.829},
                                     "window 7680": {"mean_kld": 0.007087, "max_kld": 0.0332, "same_top_pct": 99.829}}]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    cpu = [c for c in calls if " -ngl 0 " in c]
    assert len(cpu) == 1 and "--kl-divergence-base" in cpu[0] and "cpu-ub1-c8192-q4_0.kld" in cpu[0]
    assert "-ctk q4_0 -ctv q4_0" in cpu[0] and "--kl-divergence " not in cpu[0] + " "
    assert " -ub 1 " in cpu[0]  # the row's own shape: every token a decode, on the CPU too
    assert sum("cpu-ub1-c8192-q4_0.kld --kl-divergence" in c and " -ngl 99 " in c for c in calls) == 2
    # a window farther from the CPU than resident is, or a difference not small against the spread, fails
    for w_res, w_cpu in (("0.000747 0.000038", "0.045000 0.007087"), ("0.000747 0.000038", "0.033200 0.009000"),
                         ("0.004000 0.000038", "0.033200 0.007087")):
        kld_files(tmp_path, w_res, w_cpu, "0.037736 0.007100")
        res = gate_c(a, tmp_path / "m.gguf", tmp_path)
        row = next(w for w in res["windows"] if w["cache"] == "q4_0")
        assert not res["pass"] and not row["within_spread"], (w_res, w_cpu)
    # without the CPU reference the bound alone judges
    kld_files(tmp_path, "0.000747 0.000038", "0.033200 0.007087", "0.037736 0.007100")
    a.c_cpu_reference = []
    assert not gate_c(a, tmp_path / "m.gguf", tmp_path)["pass"]


def test_gate_c_sized_rows_find_their_target_and_need_the_hand_back(tmp_path: Path):
    from gates.gpu import gate_c, parse_args

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_perplexity_kld(bin_dir, tmp_path)
    kld_files(tmp_path, "0.000050 0.000001", "0.000500 0.000100", "0.000500 0.000100")
    a = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--c-decode-only", "--windows-ub1-4k", "--quant-caches", "q8_0",
                    "--windows-ub1-8k", "--c-sized-ub1-8k", "6000", "--c-cpu-reference"])
    a.windows = []  # the sized row alone
    res = gate_c(a, tmp_path / "m.gguf", tmp_path)
    sized = [w for w in res["windows"] if "sized_for" in w]
    assert res["pass"] and len(sized) == 1
    row = sized[0]
    # (T - 300) * 100 cells, at least 256: the probes went 512 (fully resident), 256 (256 cells), 384 (8,400: fully
    # resident), 320 (2,000), 352 (5,200), 368 (6,800), 360 (6,000)
    assert (row["vram_target_mib"], row["window"], row["granule_layers"]) == (360, 6000, [[3, 8]])
    assert row["hand_back"] and row["cache"] == "q8_0" and row["ubatch"] == 1
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    probes = [c.split("--vram-target ")[1].split()[0] for c in calls if "ppl-short.txt" in c]
    assert probes == ["512", "256", "384", "320", "352", "368", "360"]
    kld_run = [c for c in calls if "--vram-target 360" in c and "--kl-divergence " in c + " "]
    assert len(kld_run) == 1 and "-fit off" in kld_run[0] and "resident-ub1-c8192-q8_0.kld" in kld_run[0]
    # a sized row whose run gave no layer a granule more did not check the hand-back: it fails
    text = (bin_dir / "llama-perplexity").read_text().replace("3 of 8 layers", "0 of 8 layers")
    (bin_dir / "llama-perplexity").write_text(text)
    res = gate_c(a, tmp_path / "m.gguf", tmp_path)
    assert not res["pass"] and not res["windows"][-1]["hand_back"]


def test_cpu_gate_d_wants_the_fallback_line_no_window_and_head_modes_bytes(tmp_path: Path):
    from gates.cpu import Ctx, gate_d, parse_args

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def tool(warn: bool, window_bytes: str) -> None:
        # a stand-in llama-perplexity: writes its --kl-divergence-base file; in window mode it may warn
        fake_tool(bin_dir / "llama-perplexity", "\n".join([
            'out=""; mode=head; prev=""',
            'for x in "$@"; do [ "$prev" = --kl-divergence-base ] && out=$x; [ "$x" = window ] && mode=window; prev=$x; done',
            'if [ "$mode" = window ]; then printf %s "' + window_bytes + '" > "$out"; else printf same > "$out"; fi',
            ('[ "$mode" = window ] && echo "create_memory: kv-residency-mode window not possible, falling back to head '
             'mode: the recurrent memory (llama_memory_recurrent) keeps one state per sequence"') if warn else "true",
            "exit 0"]), script=True)

    a = parse_args(["--patched-bin", str(bin_dir), "--upstream-bin", str(bin_dir)])
    assert a.required == {"a", "b", "c", "d"}
    assert a.fallback_archs == ["mamba", "minimax-m3", "deepseek32", "glm-dsa", "hy_v4", "hy_v4-idx", "dots3note",
                                "glm5-next", "deepseek4", "qwen4exp"]
    assert a.mtp_archs == ["deepseek32", "glm-dsa", "deepseek4"]
    c = Ctx(a, tmp_path)
    text = tmp_path / "t.txt"
    text.write_text("x")
    tool(warn=True, window_bytes="same")
    d = gate_d(c, "mamba", tmp_path / "m.gguf", text)
    assert d["ok"] and d["bytes_identical_to_head"] and "llama_memory_recurrent" in d["fallback_line"]
    tool(warn=False, window_bytes="same")  # silent fallback: fails
    assert not gate_d(c, "mamba", tmp_path / "m.gguf", text)["ok"]
    tool(warn=True, window_bytes="other")  # other logits: fails
    assert not gate_d(c, "mamba", tmp_path / "m.gguf", text)["ok"]


def test_repeat_points_are_missed_goals_same_type_pairs_and_prompt_sized_misses(tmp_path: Path):
    from gates.gpu import budget_rows, read_budget_csv, repeat_points, write_budget_csv

    def r(prefill: float, decode: float, peak: int, window: dict | None = None, resident: bool = False) -> dict:
        return {"rc": 0, "prefill_tps": prefill, "decode_tps": decode, "device_mib_peak": peak, "prompt_tokens": 100,
                "window": window, "fully_resident": resident}

    rows = budget_rows(4096, [1000, 2000, 3000], "upstream q4_0", r(100.0, 50.0, 900), 4096)
    rows += budget_rows(4096, [1000], "window f16", r(90.0, 60.0, 990, {"resident": 512}), 4096, target=800)
    rows += budget_rows(4096, [2000], "window f16", r(99.0, 47.0, 1900, resident=True), 4096, target=1800)
    rows += budget_rows(4096, [3000], "window f16", r(99.0, 60.0, 2900, resident=True), 4096, target=2800)
    rows += budget_rows(4096, [3000], "window q4_0", r(99.0, 49.0, 2900, resident=True), 4096, target=2800)
    # a quantized window with part of the prompt in the tail is not item 1's comparison
    rows += budget_rows(4096, [3000], "upstream q8_0", r(100.0, 50.0, 1000), 4096)
    rows += budget_rows(4096, [3000], "window q8_0", r(99.0, 40.0, 2900, {"resident": 64}), 4096, target=2800)
    # at 1M: upstream f16 sized to the prompt fits at both budgets; the best window decodes 0.8 of it at the first
    sized = r(100.0, 100.0, 1500)
    rows += budget_rows(1048576, [2000, 3000], "upstream f16 ctx sized to the prompt", sized, 1024)
    rows += budget_rows(1048576, [2000], "window f16", r(90.0, 80.0, 1900, resident=True), 1048576, target=1800)
    rows += budget_rows(1048576, [2000], "window q4_0", r(90.0, 70.0, 1900, resident=True), 1048576, target=1800)
    rows += budget_rows(1048576, [3000], "window f16", r(90.0, 95.0, 2900, resident=True), 1048576, target=2800)
    path = tmp_path / "budget_curve.csv"
    write_budget_csv(path, rows, [4096, 1048576])
    # misses only (near 0): 1000 MiB: prefill 0.90 (missed); 2000 MiB: decode 0.94 (missed); 3000 MiB: met (prefill
    # 0.99), not repeated as a goal; at 1M the window decodes 0.8 of the sized reference at 2000 and 0.95 at 3000
    points = repeat_points(read_budget_csv(path), near=0)
    assert [(p["kind"], p["budget_mib"], p["window"]) for p in points] == [
        ("goal", 1000, "window f16"), ("goal", 2000, "window f16"), ("same type", 3000, "window q4_0"),
        ("prompt-sized", 2000, "window f16")]
    # by default a single run that met its bound by less than 0.1 is repeated too, and says it met
    near = repeat_points(read_budget_csv(path))
    assert [(p["kind"], p["budget_mib"], p.get("curve_met")) for p in near] == [
        ("goal", 1000, False), ("goal", 2000, False), ("goal", 3000, True), ("same type", 3000, None),
        ("prompt-sized", 2000, False), ("prompt-sized", 3000, True)]
    assert points[0] | {} == {"kind": "goal", "ctx": 4096, "budget_mib": 1000, "reference": "upstream q4_0",
                              "reference_ctx": 4096, "window": "window f16", "vram_target_mib": 800, "bound": 0.95,
                              "metrics": ["prefill_tps", "decode_tps"], "curve_prefill_ratio": 0.9,
                              "curve_decode_ratio": 1.2, "curve_met": False,
                              "windows": [{"config": "window f16", "vram_target_mib": 800}]}
    assert points[2]["reference"] == "upstream q4_0" and points[2]["curve_decode_ratio"] == 0.98
    assert points[3]["reference_ctx"] == 1024 and points[3]["curve_decode_ratio"] == 0.8 and points[3]["bound"] == 0.9
    # a best window is judged among every window that fit the point; item 1's pairs are one window each
    assert points[3]["windows"] == [{"config": "window f16", "vram_target_mib": 1800},
                                    {"config": "window q4_0", "vram_target_mib": 1800}]
    assert "windows" not in points[2]


def fake_completion_rates(tmp_path: Path, rates: str) -> tuple[Path, Path]:
    """A stand-in llama-completion in tmp_path/bin that records its arguments in tmp_path/calls.txt and prints the
    prefill and decode rates the sh line `rates` sets ($pp, $tg) from them: (bin dir, calls file)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    fake_tool(bin_dir / "llama-completion", "\n".join([
        f'echo "$*" >> {calls}', rates,
        'echo "common_perf_print: prompt eval time =     573.10 ms / 35131 tokens (    0.02 ms per token, '
        '$pp tokens per second)"',
        'echo "common_perf_print:        eval time =      26.69 ms /    63 runs   (    0.86 ms per token, '
        '$tg tokens per second)"']), script=True)
    return bin_dir, calls


def test_gate_h_repeats_each_missed_point_with_every_configuration(tmp_path: Path):
    from gates.gpu import budget_rows, gate_h, parse_args, write_budget_csv

    # window runs prefill slower than head mode, and log their window and the carry trial's decision
    bin_dir, calls = fake_completion_rates(tmp_path, 'case "$*" in *window*) pp=45000.00; echo "llama_kv_cache: '
                                                     'position window = 90112 / 131072 cells resident + host tail '
                                                     '40960 cells (640.00 MiB host)"; echo "tail ring: ring-carry '
                                                     'dropped: a token took 2.5 ms carrying, 1.5 ms not (medians of '
                                                     '8)";; *) pp=60000.00;; esac; tg=700.00')
    rows = budget_rows(131072, [2800], "upstream q4_0", {"rc": 0, "prefill_tps": 60000.0, "decode_tps": 700.0,
                                                          "device_mib_peak": 2600}, 131072)
    rows += budget_rows(131072, [2800], "window q8_0", {"rc": 0, "prefill_tps": 50000.0, "decode_tps": 720.0,
                                                         "device_mib_peak": 2700, "window": {"resident": 90112},
                                                         "prompt_tokens": 35131}, 131072, target=2336)
    # upstream q8_0 resident beside it: the fully resident q8_0 window is also repeated against it (item 1)
    rows += budget_rows(131072, [2800], "upstream q8_0", {"rc": 0, "prefill_tps": 61000.0, "decode_tps": 690.0,
                                                          "device_mib_peak": 2650}, 131072)
    csv_path = tmp_path / "curve.csv"
    write_budget_csv(csv_path, rows, [131072])
    a = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--repeat-csv", str(csv_path), "--repeat-reps", "3", "--curve-words", "50"])
    res = gate_h(a, tmp_path / "m.gguf", tmp_path)
    assert res["pass"] and [p["kind"] for p in res["points"]] == ["goal", "same type"]
    pt, same = res["points"]
    assert pt["ratios_to_reference"]["window q8_0"]["prefill_tps"] == 0.75 and pt["best_window"] == "window q8_0"
    assert pt["ratios_to_reference"]["head"]["prefill_tps"] == 1.0
    assert not pt["prefill_goal_met"] and pt["decode_goal_met"] and not pt["met"]
    # the same-type point is judged on decode only (700 against 700: met)
    assert same["decode_goal_met"] and same["prefill_goal_met"] is None and same["met"]
    assert set(same["medians"]) == {"reference", "window q8_0"}
    # each run's facts are kept beside its rates: the window's cells and tail, the trial, none for the reference
    facts = pt["runs"]["window q8_0"]
    assert len(facts) == 3 and all(f["window_cells"] == 90112 and f["tail_cells"] == 40960 for f in facts)
    assert facts[0]["carry_trials"] == [{"kept": False, "carrying_ms": 2.5, "not_carrying_ms": 1.5}]
    assert all(f["window_cells"] is None and f["carry_trials"] == [] for f in pt["runs"]["reference"])
    assert set(pt["runs"]) == set(pt["medians"])
    lines = calls.read_text().splitlines()
    assert len(lines) == 1 + 4 * 3 + 2 * 3  # a warm-up, 4 configurations x 3 rounds, then 2 x 3
    assert all("-n 128 " in ln for ln in lines)  # --repeat-n's default
    window_runs = [ln for ln in lines if "window" in ln]
    assert len(window_runs) == 6 and all("--vram-target 2336" in ln and "-ctk q8_0" in ln for ln in window_runs)
    assert sum("-ctk q4_0" in ln and "head" in ln and "-fit off" in ln for ln in lines) == 3
    assert sum("-ctk q8_0" in ln and "window" not in ln for ln in lines) == 3  # upstream q8_0, the reference


def test_gate_h_keeps_each_finished_point_when_it_is_cut_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import gates.gpu as gpu

    bin_dir, _ = fake_completion_rates(tmp_path, "pp=60000.00; tg=700.00")
    rows = []
    for b in (2800, 3300):  # two missed goals: two points, each 4 configurations x 2 rounds
        rows += gpu.budget_rows(131072, [b], "upstream q4_0", {"rc": 0, "prefill_tps": 60000.0, "decode_tps": 700.0,
                                                               "device_mib_peak": 2600}, 131072)
        rows += gpu.budget_rows(131072, [b], "window q4_0", {"rc": 0, "prefill_tps": 50000.0, "decode_tps": 500.0,
                                                             "device_mib_peak": 2700, "prompt_tokens": 35131},
                                131072, target=2336)
    csv_path = tmp_path / "curve.csv"
    gpu.write_budget_csv(csv_path, rows, [131072])
    a = gpu.parse_args(["--full-bin", str(bin_dir), "--upstream-bin", str(bin_dir), "--only", "h",
                        "--repeat-csv", str(csv_path), "--repeat-reps", "2", "--curve-words", "50"])
    out = tmp_path / "out"
    out.mkdir()
    real_run, calls = gpu.run, []

    def cut_after_the_first_point(tag: str, *args, **kw):
        calls.append(tag)
        if len(calls) > 1 + 4 * 2:  # the warm-up and the first point's 4 configurations x 2 rounds
            raise KeyboardInterrupt  # a call's time limit
        return real_run(tag, *args, **kw)

    monkeypatch.setattr(gpu, "run", cut_after_the_first_point)
    with pytest.raises(KeyboardInterrupt):
        gpu.gate_h(a, tmp_path / "m.gguf", tmp_path, out)
    kept = json.loads((out / "h_repeats.json").read_text())
    assert not kept["complete"] and (kept["points_done"], kept["points_total"]) == (1, 2)
    assert [p["budget_mib"] for p in kept["points"]] == [2800] and kept["points"][0]["medians"]["reference"]
    monkeypatch.setattr(gpu, "run", real_run)
    res = gpu.gate_h(a, tmp_path / "m.gguf", tmp_path, out)
    whole = json.loads((out / "h_repeats.json").read_text())
    assert whole["complete"] and whole["points"] == json.loads(json.dumps(res["points"]))


def test_model_bench_runs_resident_and_each_window_and_wants_a_tail(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    doc = [{"n_prompt": 4096, "n_gen": 0, "n_depth": 12288, "samples_ts": [50000.0, 52000.0]},
           {"n_prompt": 0, "n_gen": 128, "n_depth": 12288, "samples_ts": [800.0, 810.0]}]
    # a stand-in llama-bench: the window its --kv-window-cells asks for shows in its log, as with -v
    fake_tool(bin_dir / "llama-bench", "\n".join([
        'w=""; prev=""; for x in "$@"; do [ "$prev" = "--kv-window-cells" ] && w=$x; prev=$x; done',
        'if [ -n "$w" ]; then echo "llama_kv_cache: position window = $w '
        '/ 16384 cells resident + host tail 100 cells (1.00 MiB host) [CUDA0, forced]" >&2; fi',
        # the ring's carry trial, as fattn.cu logs it: the 4,096-cell window keeps the carry, the 8,192 drops it
        'if [ "$w" = 4096 ]; then echo "opencoti_ring_trial_tick: tail ring: ring-carry kept: a token took 1.100 ms '
        'carrying, 1.250 ms not (medians of 8)" >&2; fi',
        'if [ "$w" = 8192 ]; then echo "opencoti_ring_trial_tick: tail ring: ring-carry dropped: a token took 2.204 '
        'ms carrying, 1.279 ms not (medians of 8)" >&2; fi',
        f"cat <<'EOF'\n{json.dumps(doc)}\nEOF"]), script=True)
    r = run_module("gates.model_bench", "--bin", str(bin_dir), "--model", str(tmp_path / "m.gguf"),
                   "--rounds", "2", "--work", str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [row["config"] for row in res["rows"]] == ["resident", "window 4096", "window 8192"]
    assert isinstance(res["device"], list)  # the cards nvidia-smi named (none here)
    assert res["rows"][1]["tail_engaged"] and res["rows"][1]["prefill_median"] == 51000.0
    assert res["rows"][2]["position_windows"][0]["window"] == 8192
    # each round's context logged its trial: both rounds' decisions are kept, with what they measured
    assert res["rows"][0]["carry_trials"] == []
    assert res["rows"][1]["carry_trials"] == [{"kept": True, "carrying_ms": 1.1, "not_carrying_ms": 1.25}] * 2
    assert [t["kept"] for t in res["rows"][2]["carry_trials"]] == [False, False]
    assert "carry kept in 2 of 2 trial(s)" in r.stderr and "carry kept in 0 of 2 trial(s)" in r.stderr
    # a window that never reached the host tail proves nothing: the gate fails
    fake_tool(bin_dir / "llama-bench", json.dumps(doc))
    assert run_module("gates.model_bench", "--bin", str(bin_dir), "--model", str(tmp_path / "m.gguf"),
                      "--rounds", "1", "--work", str(tmp_path / "w")).returncode == 1


def test_make_model_jamba_alternates_mamba_and_attention_layers(tmp_path: Path):
    gguf = pytest.importorskip("gguf")
    from gates import make_model

    out = tmp_path / "j.gguf"
    assert make_model.main(["-o", str(out), "--arch", "jamba", "--layers", "4"]) == 0
    rd = gguf.GGUFReader(str(out))
    kv = rd.fields["jamba.attention.head_count_kv"]
    assert [int(kv.parts[i][0]) for i in kv.data] == [0, 2, 0, 2]
    names = {t.name for t in rd.tensors}
    assert {"blk.0.ssm_in.weight", "blk.0.ssm_dt_norm.weight", "blk.1.attn_k.weight", "blk.1.ffn_up.weight",
            "blk.0.ffn_up.weight"} <= names
    assert "blk.1.ssm_in.weight" not in names and "blk.0.attn_k.weight" not in names


# The keys each architecture's load_hparams / load_arch_hparams reads without a default (src/models/<arch>.cpp of the
# pinned tree), beyond the ones every model has (context/embedding length, block count, vocabulary).
MLA_KEYS = ["attention.layer_norm_rms_epsilon", "attention.q_lora_rank", "attention.kv_lora_rank",
            "expert_feed_forward_length", "expert_shared_count", "attention.indexer.head_count",
            "attention.indexer.key_length", "attention.indexer.top_k"]
REQUIRED_KEYS = {
    "minimax-m3": ["attention.layer_norm_rms_epsilon", "expert_feed_forward_length", "expert_shared_count",
                   "expert_gating_func", "attention.indexer.head_count", "attention.indexer.key_length",
                   "attention.indexer.top_k", "attention.indexer.block_size", "attention.indexer.local_blocks"],
    "deepseek32": [*MLA_KEYS, "expert_gating_func"],
    "glm-dsa": MLA_KEYS,
    "hy_v4": ["attention.layer_norm_rms_epsilon", "attention.q_lora_rank", "attention.kv_lora_rank",
              "attention.key_length_mla", "attention.value_length_mla", "expert_feed_forward_length",
              "expert_shared_count", "hyper_connection.count", "hyper_connection.epsilon",
              "hyper_connection.magnitude"],
    "dots3note": [*MLA_KEYS, "expert_gating_func", "leading_dense_block_count", "attention.key_length_mla",
                  "attention.value_length_mla", "attention.kv_lora_rank_swa", "attention.key_length_mla_swa",
                  "attention.value_length_mla_swa", "attention.sliding_window", "rope.freq_base_swa",
                  "attention.sliding_window_pattern", "attention.indexer.types"],
}
REQUIRED_KEYS["glm5-next"] = ["attention.layer_norm_rms_epsilon", "attention.key_length_mla", "attention.value_length_mla",
                              "attention.q_lora_rank", "attention.kv_lora_rank", "ssm.conv_kernel", "kda.head_dim",
                              "expert_feed_forward_length", "expert_shared_count", "attention.indexer.head_count",
                              "attention.indexer.key_length", "attention.indexer.top_k", "attention.indexer.kpool",
                              "hyper_connection.count", "hyper_connection.sinkhorn_iterations",
                              "hyper_connection.epsilon"]
REQUIRED_KEYS["deepseek4"] = ["attention.layer_norm_rms_epsilon", "attention.q_lora_rank", "attention.sliding_window",
                              "expert_feed_forward_length", "expert_shared_count", "expert_weights_scale",
                              "expert_weights_norm", "swiglu_clamp_exp", "attention.indexer.head_count",
                              "attention.indexer.key_length", "attention.indexer.top_k",
                              "attention.output_group_count", "attention.output_lora_rank",
                              "attention.compress_rope_freq_base", "hyper_connection.count",
                              "hyper_connection.sinkhorn_iterations", "hyper_connection.epsilon", "hash_layer_count",
                              "attention.compress_ratios", "expert_gating_func"]
REQUIRED_KEYS["qwen4exp"] = ["attention.layer_norm_rms_epsilon", "rope.dimension_sections", "ssm.conv_kernel",
                             "ssm.inner_size", "ssm.state_size", "ssm.time_step_rank", "ssm.group_count",
                             "hyper_connection.count", "hyper_connection.low_rank", "attention.indexer.head_count",
                             "attention.indexer.key_length", "attention.indexer.top_k"]
REQUIRED_KEYS["hy_v4-idx"] = [*REQUIRED_KEYS["hy_v4"], "attention.indexer.head_count", "attention.indexer.key_length",
                              "attention.indexer.top_k", "attention.indexer.types"]


def field_values(rd, key: str) -> list:
    f = rd.fields[key]
    return [f.parts[i][0].item() for i in f.data]


@pytest.mark.parametrize("name", sorted(REQUIRED_KEYS))
def test_make_model_writes_each_fallback_arch_with_the_keys_and_tensors_its_loader_requires(tmp_path: Path, name: str):
    gguf = pytest.importorskip("gguf")
    from gates import make_model
    from gates.fallback_archs import ARCHS

    fb = ARCHS[name]
    out = tmp_path / f"{name}.gguf"
    assert make_model.main(["-o", str(out), "--arch", name, "--layers", "2"]) == 0
    rd = gguf.GGUFReader(str(out))
    arch = bytes(rd.fields["general.architecture"].parts[-1]).decode()
    assert arch == fb.gguf_arch
    missing = [k for k in REQUIRED_KEYS[name] if f"{arch}.{k}" not in rd.fields]
    assert not missing, missing
    assert field_values(rd, f"{arch}.block_count") == [2]
    tensors = {t.name: [int(x) for x in t.shape] for t in rd.tensors}  # shape as ggml's ne, ne0 first
    plan = {n: list(reversed(shape)) for n, shape, _s, _m in make_model.tensor_plan(make_model.parse_args(
        ["-o", str(out), "--arch", name, "--layers", "2"]))}
    assert tensors == plan
    if name in ("deepseek4", "qwen4exp"):  # their loaders know no dense layers: every layer routed
        assert {"blk.0.ffn_up_exps.weight", "blk.1.ffn_up_exps.weight"} <= tensors.keys()
        if name == "deepseek4":
            assert field_values(rd, "deepseek4.expert_gating_func") == [4]  # sqrt-softplus, the only one it takes
    else:  # one dense layer, then a MoE layer: the second layer's experts and not the first's
        assert "blk.0.ffn_up.weight" in tensors and "blk.1.ffn_up_exps.weight" in tensors
        assert "blk.0.ffn_up_exps.weight" not in tensors and "blk.1.ffn_up.weight" not in tensors
        assert field_values(rd, f"{arch}.leading_dense_block_count") == [1]
    assert tensors["blk.1.ffn_up_exps.weight"][2] == field_values(rd, f"{arch}.expert_count")[0]
    # the same arguments write the same bytes
    again = tmp_path / "again.gguf"
    make_model.main(["-o", str(again), "--arch", name, "--layers", "2"])
    assert again.read_bytes() == out.read_bytes()


def test_fallback_archs_carry_their_cache_s_own_layers(tmp_path: Path):
    gguf = pytest.importorskip("gguf")
    from gates import make_model

    def model(name: str) -> tuple:
        out = tmp_path / f"{name}.gguf"
        make_model.main(["-o", str(out), "--arch", name, "--layers", "2"])
        rd = gguf.GGUFReader(str(out))
        return rd, {t.name for t in rd.tensors}

    # minimax-m3: the MSA indexer sits on the sparse (MoE) layer only
    _, t = model("minimax-m3")
    assert "blk.1.indexer.k_proj.weight" in t and "blk.0.indexer.k_proj.weight" not in t
    # hy_v4: the plain checkpoint has no indexer; with one, layer 0 owns it and layer 1 shares its top-k
    rd, t = model("hy_v4")
    assert not any(".indexer." in n for n in t) and "hy_v4.attention.indexer.top_k" not in rd.fields
    rd, t = model("hy_v4-idx")
    assert "blk.0.indexer.attn_k.weight" in t and "blk.1.indexer.attn_k.weight" not in t
    assert field_values(rd, "hy_v4.attention.indexer.types") == [1, 0]
    assert field_values(rd, "hy_v4.attention.indexer.top_k")[0] > 0
    # dots3note: layer 0 slides, layer 1 is full attention with the indexer
    rd, t = model("dots3note")
    assert field_values(rd, "dots3note.attention.sliding_window_pattern") == [True, False]
    assert "blk.1.indexer.attn_k.weight" in t and "blk.0.indexer.attn_k.weight" not in t
    # glm5-next: a KDA (recurrent, no KV heads) layer, then an MLA layer with the k-pooled indexer
    rd, t = model("glm5-next")
    assert field_values(rd, "glm5-next.attention.head_count_kv") == [0, 1]
    assert "blk.0.ssm_f_a.weight" in t and "blk.0.attn_kv_a_mqa.weight" not in t
    assert {"blk.1.attn_kv_a_mqa.weight", "blk.1.indexer_compressor_ape.weight"} <= t and "blk.1.ssm_f_a.weight" not in t
    ape = next(x for x in rd.tensors if x.name == "blk.1.indexer_compressor_ape.weight")
    assert ape.tensor_type == gguf.GGMLQuantizationType.F32  # added to f32 keys: the cpu add takes no f16 operand
    # deepseek4: a CSA layer (ratio 4, its compressor and the indexer's), then an HCA layer (ratio 128, no indexer)
    rd, t = model("deepseek4")
    assert field_values(rd, "deepseek4.attention.compress_ratios") == [4, 128]
    assert {"blk.0.attn_compressor_kv.weight", "blk.0.indexer_compressor_kv.weight", "blk.1.attn_compressor_kv.weight",
            "blk.0.attn_sinks.weight", "output_hc_fn.weight"} <= t
    assert "blk.1.indexer_compressor_kv.weight" not in t
    # qwen4exp: a gated-delta-net layer (no q/k/v of its own), then gated full attention with the QSA indexer
    rd, t = model("qwen4exp")
    assert field_values(rd, "qwen4exp.full_attention_interval") == [2]
    assert {"blk.0.ssm_alpha.weight", "blk.1.attn_q.weight", "blk.1.indexer.q_proj.weight"} <= t
    assert "blk.0.attn_q.weight" not in t and "blk.1.ssm_alpha.weight" not in t
    q = next(x for x in rd.tensors if x.name == "blk.1.attn_q.weight")
    assert int(q.shape[1]) == 2 * field_values(rd, "qwen4exp.attention.head_count")[0] * 64  # [q | gate] per head
    # gemma4-assistant: no K/V of its own (it reads the target's last SWA and full layers), the target's width out
    out = tmp_path / "g4a.gguf"
    make_model.main(["-o", str(out), "--arch", "gemma4-assistant", "--layers", "2", "--n-embd", "128"])
    rd = gguf.GGUFReader(str(out))
    t = {x.name for x in rd.tensors}
    assert field_values(rd, "gemma4-assistant.embedding_length_out") == [256]
    assert field_values(rd, "gemma4-assistant.nextn_predict_layers") == field_values(rd, "gemma4-assistant.block_count")
    assert {"nextn.pre_projection.weight", "blk.1.attn_q.weight", "rope_freqs.weight"} <= t
    assert not any(".attn_k." in n or ".attn_v." in n for n in t)
    rd, t = model("gemma4")
    assert field_values(rd, "gemma4.attention.sliding_window_pattern") == [True, False]
    assert "blk.1.attn_k.weight" in t
    # deepseek32: an indexer on every layer; the indexer key width is a multiple of the 64-wide rotation
    rd, t = model("deepseek32")
    assert {"blk.0.indexer.attn_k.weight", "blk.1.indexer.attn_k.weight"} <= t
    assert field_values(rd, "deepseek32.attention.indexer.key_length")[0] % 64 == 0


@pytest.mark.parametrize("name", ["deepseek32", "glm-dsa", "deepseek4"])
def test_make_model_nextn_adds_one_mtp_block_after_the_trunk(tmp_path: Path, name: str):
    gguf = pytest.importorskip("gguf")
    from gates import make_model

    out = tmp_path / f"{name}.gguf"
    assert make_model.main(["-o", str(out), "--arch", name, "--layers", "2", "--nextn", "1"]) == 0
    rd = gguf.GGUFReader(str(out))
    assert field_values(rd, f"{name}.block_count") == [3] and field_values(rd, f"{name}.nextn_predict_layers") == [1]
    t = {x.name for x in rd.tensors}
    # the NextN block is a whole decoder block (attention, routed experts) plus its own wiring
    assert {"blk.2.nextn.eh_proj.weight", "blk.2.nextn.enorm.weight", "blk.2.nextn.hnorm.weight",
            "blk.2.attn_norm.weight", "blk.2.ffn_gate_exps.weight"} <= t
    assert not any(n.startswith(("blk.0.nextn", "blk.1.nextn")) for n in t)
    if name == "deepseek4":  # the block attends over the sliding window only
        assert field_values(rd, "deepseek4.attention.compress_ratios") == [4, 128, 0]
    plain = tmp_path / "plain.gguf"
    make_model.main(["-o", str(plain), "--arch", name, "--layers", "2"])
    assert "blk.2.attn_norm.weight" not in {x.name for x in gguf.GGUFReader(str(plain)).tensors}


def test_make_model_refuses_nextn_where_it_has_no_mtp_block(tmp_path: Path, capsys: pytest.CaptureFixture):
    from gates import make_model

    with pytest.raises(SystemExit):
        make_model.main(["-o", str(tmp_path / "x.gguf"), "--arch", "minimax-m3", "--nextn", "1"])
    assert "minimax-m3 has no MTP block here" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def test_cpu_gate_d_wants_the_memory_type_and_architecture_of_each_branch(tmp_path: Path):
    from gates.cpu import Ctx, gate_d, parse_args

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def tool(line: str) -> None:
        fake_tool(bin_dir / "llama-perplexity", "\n".join([
            'out=""; mode=head; prev=""',
            'for x in "$@"; do [ "$prev" = --kl-divergence-base ] && out=$x; [ "$x" = window ] && mode=window; prev=$x; done',
            'printf same > "$out"',
            'echo "load: loading the model"',
            '[ "$mode" = window ] && echo "create_memory: kv-residency-mode window not possible, falling back to head '
            f'mode: {line}"',
            "exit 0"]), script=True)

    a = parse_args(["--patched-bin", str(bin_dir), "--upstream-bin", str(bin_dir)])
    c = Ctx(a, tmp_path)
    text = tmp_path / "t.txt"
    text.write_text("x")
    m = tmp_path / "m.gguf"
    tool("the llama_kv_cache of a hy_v4 model gets no window storage")
    d = gate_d(c, "hy_v4", m, text)
    assert d["ok"] and d["expected_memory"] == "llama_kv_cache" and d["expected_arch"] == "hy_v4"
    # llama_kv_cache is not named by a line about llama_kv_cache_dsa
    tool("the memory of a hy_v4 model is a llama_kv_cache_dsa, not one of the caches with window storage")
    d = gate_d(c, "hy_v4", m, text)
    assert not d["ok"] and not d["names_memory"] and d["names_arch"]
    assert "falling back to head mode" in d["log_tail"] and "loading the model" in d["log_tail"]
    assert gate_d(c, "hy_v4-idx", m, text)["ok"]
    # the right type for another architecture: fails
    tool("the memory of a deepseek32 model is a llama_kv_cache_dsa, not one of the caches with window storage")
    d = gate_d(c, "glm-dsa", m, text)
    assert not d["ok"] and d["names_memory"] and not d["names_arch"]
    assert gate_d(c, "deepseek32", m, text)["ok"]
    # a model that does not load is an error carrying the log's tail, not a pass or a skip
    fake_tool(bin_dir / "llama-perplexity", 'echo "llama_model_load: error loading model: missing tensor"; exit 1',
              script=True)
    with pytest.raises(Exception, match="missing tensor"):
        gate_d(c, "dots3note", m, text)


FAKE_SERVER = """#!{python}
import json, sys, http.server
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
mode = argv[argv.index("--kv-residency-mode") + 1]
cfg = {cfg!r}
print("load: loading the model", flush=True)
if mode == "window":
    for line in cfg["lines"]:
        print("create_memory: kv-residency-mode window not possible, falling back to head mode: " + line, flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({{"status": "ok"}})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply({{"content": cfg["content"][mode], "timings": {{"draft_n": cfg["draft_n"]}}}})
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_cpu_gate_d_mtp_wants_the_draft_context_s_line_drafts_and_head_mode_s_completion(tmp_path: Path):
    from gates.cpu import Ctx, gate_d_mtp, parse_args

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    main = "the memory of a deepseek32 model is a llama_kv_cache_dsa, not one of the caches with window storage"
    mtp = "the llama_kv_cache of a deepseek32 model (MTP draft context) gets no window storage"

    def server(lines: list[str], window_content: str = "abc", draft_n: int = 5) -> None:
        cfg = {"lines": lines, "content": {"head": "abc", "window": window_content}, "draft_n": draft_n}
        tool = bin_dir / "llama-server"  # a stand-in on loopback: logs its lines, answers /health and /completion
        tool.write_text(FAKE_SERVER.format(python=sys.executable, cfg=cfg))
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)

    a = parse_args(["--patched-bin", str(bin_dir), "--upstream-bin", str(bin_dir), "--timeout", "30"])
    c = Ctx(a, tmp_path)
    text = tmp_path / "t.txt"
    text.write_text("the pass key is " * 50)
    m = tmp_path / "m.gguf"
    server([main, mtp])
    d = gate_d_mtp(c, "deepseek32", m, text)
    assert d["ok"] and d["names_memory"] and d["names_arch"] and d["main_context_line_names"], d
    assert d["drafted_tokens"] == {"head": 5, "window": 5} and d["completion_identical_to_head"]
    assert [r["tag"] for r in c.runs] == ["deepseek32.d.mtp-head", "deepseek32.d.mtp-window"]
    server([main])  # the draft context silent: fails
    assert not gate_d_mtp(c, "deepseek32", m, text)["ok"]
    server([main, mtp.replace("llama_kv_cache of", "llama_kv_cache_iswa of")])  # another memory: fails
    assert not gate_d_mtp(c, "deepseek32", m, text)["names_memory"]
    server([main, mtp], window_content="abd")  # another completion: fails
    d = gate_d_mtp(c, "deepseek32", m, text)
    assert not d["ok"] and not d["completion_identical_to_head"]
    server([main, mtp], draft_n=0)  # the draft context never drafted: fails
    d = gate_d_mtp(c, "deepseek32", m, text)
    assert not d["ok"] and "log_tail" in d and "loading the model" in d["log_tail"]


def test_cpu_gate_d_assistant_wants_the_target_windowed_and_the_assistant_s_line(tmp_path: Path):
    from gates.cpu import Ctx, gate_d_mtp, parse_args

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    window = "llama_kv_cache: position window = 32 / 512 cells resident + host tail 480 cells (0.23 MiB host)"
    assistant = ("create_memory: kv-residency-mode window not possible, falling back to head mode: the "
                 "llama_kv_cache_iswa of a gemma4-assistant model (MTP draft context) gets no window storage")

    def server(lines: list[str]) -> None:
        cfg = {"lines": [], "content": {"head": "abc", "window": "abc"}, "draft_n": 5}
        text = FAKE_SERVER.format(python=sys.executable, cfg=cfg)
        # these lines are printed whole (the target's window line is no fallback line)
        text = text.replace('if mode == "window":', f'if mode == "window":\n    print("\\n".join({lines!r}), flush=True)')
        tool = bin_dir / "llama-server"
        tool.write_text(text)
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)

    a = parse_args(["--patched-bin", str(bin_dir), "--upstream-bin", str(bin_dir), "--timeout", "30",
                    "--assistant-pairs", "gemma4"])
    assert a.assistant_pairs == ["gemma4"]
    c = Ctx(a, tmp_path)
    text = tmp_path / "t.txt"
    text.write_text("the pass key is " * 50)
    tgt, dft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    server([window, assistant])
    d = gate_d_mtp(c, "gemma4-assistant", tgt, text, draft=dft)
    assert d["ok"] and d["expected_memory"] == "llama_kv_cache_iswa" and d["position_window_logged"], d
    assert "-md" in c.runs[-1]["argv"] and str(dft) in c.runs[-1]["argv"]
    server([assistant])  # the target took no window: fails
    assert not gate_d_mtp(c, "gemma4-assistant", tgt, text, draft=dft)["ok"]
    server([window])  # the assistant's context silent: fails
    assert not gate_d_mtp(c, "gemma4-assistant", tgt, text, draft=dft)["ok"]
    # a server that aborts while loading fails the gate, naming the assertion
    tool = bin_dir / "llama-server"
    tool.write_text("#!/bin/sh\necho 'ggml.c:1797: GGML_ASSERT(view_src == NULL) failed'\nexit 134\n")
    with pytest.raises(Exception, match="GGML_ASSERT"):
        gate_d_mtp(c, "gemma4-assistant", tgt, text, draft=dft)
    # kv-split-storage's copying path refuses the assistant at load (an error, not an abort), naming its memory and
    # the architecture, while head mode serves and drafts: passes
    fake = bin_dir / "fake-server"
    fake.write_text(FAKE_SERVER.format(python=sys.executable, cfg={"lines": [], "content": {"head": "abc"},
                                                                   "draft_n": 5}))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)

    def refusing(lines: str) -> None:  # window mode prints these lines and exits 1; head mode serves
        (bin_dir / "refusal.txt").write_text(lines + "\nsrv  llama_server: exiting due to model loading error\n")
        tool.write_text(f"#!/bin/sh\ncase \"$*\" in *'--kv-residency-mode window'*)\n"
                        f"  cat {bin_dir / 'refusal.txt'}\n  exit 1;;\nesac\nexec {fake} \"$@\"\n")

    refusal = ("0.00.022 E llama_init_from_model: failed to initialize the context: kv-residency-mode window: the "
               "llama_kv_cache of this gemma4-assistant model shares layer 3 of another context's cache, which "
               "window mode split into a 32-cell device window and a host tail (kv-split-storage)")
    refusing(refusal)
    d = gate_d_mtp(c, "gemma4-assistant", tgt, text, draft=dft)
    assert d["ok"] and "shares layer 3" in d["refused_at_load"] and d["drafted_tokens"] == {"head": 5}, d
    refusing(refusal.replace("gemma4-assistant", "gemma4"))  # the refusal must name the draft's architecture
    assert not gate_d_mtp(c, "gemma4-assistant", tgt, text, draft=dft)["ok"]
    refusing(refusal + "\nggml.c:1797: GGML_ASSERT(view_src == NULL) failed")  # an abort is never a refusal
    with pytest.raises(Exception, match="GGML_ASSERT"):
        gate_d_mtp(c, "gemma4-assistant", tgt, text, draft=dft)
    with pytest.raises(SystemExit):
        parse_args(["--patched-bin", "b", "--upstream-bin", "b", "--assistant-pairs", "gemma3"])


def test_cpu_gate_refuses_a_fallback_arch_it_has_no_model_for(tmp_path: Path, capsys: pytest.CaptureFixture):
    from gates.cpu import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--patched-bin", "b", "--upstream-bin", "b", "--fallback-archs", "mamba,gemma4-assistant"])
    assert e.value.code == 2
    assert "no synthetic model for gemma4-assistant" in capsys.readouterr().err
    assert parse_args(["--patched-bin", "b", "--upstream-bin", "b", "--fallback-archs", "", "--gates", "a"]
                      ).fallback_archs == []
    # no model left for a gate that was asked for: refused, never a pass over nothing
    for argv, msg in ((["--fallback-archs", "", "--mtp-archs", "", "--assistant-pairs", ""], "leave gate d no model"),
                      (["--mtp-archs", "minimax-m3"], "no synthetic MTP model for minimax-m3"),
                      (["--archs", "", "--gates", "a,d"], "leaves gate(s) a no model")):
        with pytest.raises(SystemExit):
            parse_args(["--patched-bin", "b", "--upstream-bin", "b", *argv])
        assert msg in capsys.readouterr().err
    assert parse_args(["--patched-bin", "b", "--upstream-bin", "b", "--archs", "", "--gates", "d"]).required == {"d"}


@pytest.mark.slow
def test_cpu_gate_d_loads_every_fallback_arch_in_a_real_build(tmp_path: Path):
    """Each synthetic model loads and runs in the patched cpu build (FORKTOOL_CPU_BIN, else build/cpu/bin here:
    `forktool build --profile cpu`), logging its fallback line and giving head mode's bytes."""
    bin_dir = Path(os.environ.get("FORKTOOL_CPU_BIN", ROOT / "build" / "cpu" / "bin"))
    if not (bin_dir / "llama-perplexity").exists():
        pytest.skip(f"no llama-perplexity in {bin_dir}: build the cpu profile or set FORKTOOL_CPU_BIN")
    r = run_module("gates.cpu", "--patched-bin", str(bin_dir), "--upstream-bin", str(bin_dir), "--archs", "",
                   "--gates", "d", "--work-dir", str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    from gates.fallback_archs import ARCHS

    mtp = [f"{n}+mtp" for n, f in ARCHS.items() if f.mtp_memory]
    assert sorted(result["fallback"]) == sorted(["mamba", *ARCHS, *mtp, "gemma4-assistant"])
    # --assistant-pairs gemma4 (the default): window mode refuses the assistant at load, naming it; head mode drafts
    pair = result["fallback"].pop("gemma4-assistant")
    assert pair["ok"] and pair["names_memory"] and pair["names_arch"] and "gemma4-assistant" in pair["refused_at_load"]
    assert pair["drafted_tokens"]["head"] > 0
    for name, d in result["fallback"].items():
        assert d["ok"] and d["names_memory"] and not d["position_window_logged"], name
        if name in mtp:
            assert d["drafted_tokens"]["window"] > 0 and d["completion_identical_to_head"], name
        else:
            assert d["bytes_identical_to_head"], name


def test_needle_divergence_names_the_first_differing_token_and_each_side_s_margin():
    from gates.needle import divergence

    def step(i: int, tok: str, top: list) -> dict:
        return {"id": i, "token": tok, "logprob": top[0][1], "top": top}

    res = {"steps": [step(1, "4", [("4", -0.1), ("5", -3.0)]), step(8, "8", [("8", -1.95), ("9", -1.99)])]}
    win = {"steps": [step(1, "4", [("4", -0.1), ("5", -3.0)]), step(9, "9", [("9", -2.012), ("8", -2.014)])]}
    d = divergence(res, win)
    assert d["step"] == 1 and d["resident"]["token"] == "8" and d["window"]["token"] == "9"
    assert d["resident"]["margin"] == 0.04 and d["window"]["margin"] == 0.002
    assert divergence(res, res) is None


def test_gpu_gates_say_when_the_upstream_rows_ran_the_full_build(tmp_path: Path):
    import gates.gpu as gpu

    full, upstream = tmp_path / "full", tmp_path / "upstream"
    full.mkdir()
    upstream.mkdir()
    same = gpu.parse_args(["--full-bin", str(full), "--pre-bin", str(full), "--upstream-bin", str(tmp_path / "." / "full")])
    apart = gpu.parse_args(["--full-bin", str(full), "--pre-bin", str(full), "--upstream-bin", str(upstream)])
    assert "head mode, not an upstream build" in (gpu.upstream_note(same) or "")
    assert gpu.upstream_note(apart) is None


@pytest.mark.slow
def test_the_window_flags_env_vars_reach_the_tools_and_libllama_reads_none(tmp_path: Path):
    """In the patched cpu build (FORKTOOL_CPU_BIN, else build/cpu/bin): the common flags' LLAMA_ARG_* variables
    fill in a flag that is not given, a flag given wins, and the names libllama used to read change nothing;
    llama-bench has the same flags for every test of a run, refuses a bad value and reads no environment for them."""
    bin_dir = Path(os.environ.get("FORKTOOL_CPU_BIN", ROOT / "build" / "cpu" / "bin"))
    if not (bin_dir / "llama-bench").exists():
        pytest.skip(f"no llama-bench in {bin_dir}: build the cpu profile or set FORKTOOL_CPU_BIN")
    model = tmp_path / "m.gguf"
    r = run_module("gates.make_model", "-o", str(model), "--layers", "2", "--ctx", "512")
    assert r.returncode == 0, r.stderr[-2000:]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "OPENCOTI_"))}
    window = re.compile(r"position window = (\d+) / (\d+) cells resident")

    def completion(env: dict, *flags: str) -> str:
        p = subprocess.run([str(bin_dir / "llama-completion"), "-m", str(model), "-p", "one two three four", "-n", "1",
                            "-c", "512", "-fa", "on", "-no-cnv", "--temp", "0", "-t", "2", "-lv", "4", *flags],
                           env=base | env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stderr + p.stdout

    def cells(text: str) -> int | None:
        m = window.search(text)
        return int(m.group(1)) if m else None

    assert cells(completion({"LLAMA_ARG_KV_WINDOW_CELLS": "32"}, "--kv-residency-mode", "window")) == 32
    assert cells(completion({"LLAMA_ARG_KV_WINDOW_CELLS": "32"}, "--kv-residency-mode", "window",
                            "--kv-window-cells", "64")) == 64
    assert cells(completion({"LLAMA_ARG_KV_RESIDENCY_MODE": "window", "LLAMA_ARG_KV_WINDOW_CELLS": "128"})) == 128
    assert cells(completion({"LLAMA_ARG_KV_RESIDENCY_MODE": "window", "LLAMA_ARG_KV_WINDOW_CELLS": "128"},
                            "--kv-residency-mode", "head")) is None
    assert cells(completion({"OPENCOTI_KV_RESIDENCY_MODE": "window", "OPENCOTI_KV_WINDOW_CELLS": "32"})) is None

    def bench(env: dict, *flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_dir / "llama-bench"), "-m", str(model), "-p", "16", "-n", "2", "-r", "1",
                               "-fa", "1", "-t", "2", "-v", *flags], env=base | env, capture_output=True, text=True,
                              timeout=120)

    # llama-bench has the flags of the same names, for every test of a run; it reads no environment for them
    b = bench({}, "--kv-residency-mode", "window", "--kv-window-cells", "64")
    assert b.returncode == 0, b.stderr[-2000:]
    assert cells(b.stderr) == 64
    b = bench({"LLAMA_ARG_KV_RESIDENCY_MODE": "window", "LLAMA_ARG_KV_WINDOW_CELLS": "64"})
    assert b.returncode == 0 and cells(b.stderr) is None
    b = bench({}, "--kv-residency-mode", "window", "--kv-window-cells", "64", "--kv-residency-mode", "head")
    assert b.returncode == 0 and cells(b.stderr) is None  # the last one given wins
    assert "--kv-residency-mode <head|window>" in bench({}, "--help").stdout
    for flags in (("--kv-residency-mode", "tail"), ("--kv-window-cells", "12x"), ("--vram-target", "-1"),
                  ("--kv-window-cells", "4294967296"), ("--kv-window-cells", "99999999999999999999999"),
                  ("--vram-target",)):
        b = bench({}, *flags)
        assert b.returncode == 1 and f"error: invalid parameter for argument: {flags[0]}" in b.stderr, (flags, b.stderr)


@pytest.mark.integration
def test_bundle_archives_each_position_without_moving_the_tree(tmp_path: Path, session_cache: Path):
    """gates.bundle computes upstream, pre0089 and full in memory: the archives hold what `apply` would write at each
    position, the tree (left at an intermediate position) is not touched, and a held project lock refuses it."""
    from forktool import tree as ft_tree
    from forktool.package import archive_tree_digest
    from tests.helpers.project import copy_real_project

    root = copy_real_project(tmp_path / "proj")
    env = {k: v for k, v in os.environ.items() if k not in ("FORKTOOL_ROOT", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(FORKTOOL_CACHE=str(session_cache), PYTHONPATH=str(ROOT))  # gates from this checkout, run in the copy

    def ft(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "forktool", *args], cwd=root, env=env, check=True, capture_output=True)

    def llama_digest() -> str:
        return ft_tree.digest(ft_tree.scan(root / "vendor" / "llamafile" / "llama.cpp"))

    ft("vendor", "fetch")
    want = {}
    for name, move in (("upstream", ["unapply"]), ("pre0089", ["apply", "--upto", "0073"]), ("full", ["apply"])):
        ft(*move)
        want[name] = llama_digest()
    ft("apply", "--upto", "0071")
    before = ft_tree.digest(ft_tree.scan(root / "vendor" / "llamafile"))
    out = tmp_path / "bundle"
    r = subprocess.run([sys.executable, "-m", "gates.bundle", "--out", str(out)], cwd=root, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert ft_tree.digest(ft_tree.scan(root / "vendor" / "llamafile")) == before  # the tree stayed at 0071
    for name, digest in want.items():
        assert archive_tree_digest(out / f"{name}.tar.gz", "llama.cpp") == digest, name
    assert len(set(want.values())) == 3
    # what the archives were made from, which gates/device_build.sh checks against the carried checkout
    script = ROOT / "gates" / "series_inputs.sh"
    check = subprocess.run(["bash", str(script), "--check", str(out)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    (root / "patches" / "series").write_text((root / "patches" / "series").read_text() + "# an edit after\n")
    check = subprocess.run(["bash", str(script), "--check", str(out)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 2 and "made from other patches, another pin or other build flags" in check.stderr
    (root / "patches" / "series").write_text((root / "patches" / "series").read_text().replace("# an edit after\n", ""))
    assert subprocess.run(["bash", str(script), "--check", str(out)], cwd=root).returncode == 0
    build_yaml = root / "registry" / "build.yaml"  # the profiles' flags are an input of a build as much as a patch
    build_yaml.write_text(build_yaml.read_text() + "# an edit after\n")
    check = subprocess.run(["bash", str(script), "--check", str(out)], cwd=root, capture_output=True, text=True)
    assert check.returncode == 2 and "other build flags" in check.stderr
    # another forktool command holding the lock: refused, nothing written
    import fcntl

    fd = os.open(root / ".opencoti" / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = subprocess.run([sys.executable, "-m", "gates.bundle", "--out", str(tmp_path / "locked")], cwd=root,
                           env=env, capture_output=True, text=True)
    finally:
        os.close(fd)
    assert r.returncode == 1 and "another forktool command is running" in r.stderr
    assert not (tmp_path / "locked").exists()


def test_sanitizer_passes_only_on_a_finished_clean_summary(tmp_path: Path, capsys: pytest.CaptureFixture):
    from gates import sanitizer

    def fake(name: str, body: str) -> Path:
        p = tmp_path / name
        p.write_text("#!/bin/sh\n" + body)
        p.chmod(0o755)
        return p

    # each tool's own summary line: memcheck's ERROR SUMMARY, racecheck's RACECHECK SUMMARY
    def summary(errors: int, warnings: int = 0) -> str:
        return (f'if [ "$2" = racecheck ]; then echo "========= RACECHECK SUMMARY: {errors + warnings} hazards displayed '
                f'({errors} errors, {warnings} warnings)"; else echo "========= ERROR SUMMARY: {errors} errors"; fi\n')

    mapped = ('echo "========= COMPUTE-SANITIZER"; echo "position window = 1024 / 2048 cells resident + host tail 1024 '
              'cells (16.00 MiB host)"; echo "llama_kv_cache: host tail mapped into the device\'s address space: 16.00 '
              'MiB device"\n')
    clean = fake("clean", mapped + summary(0))
    warned = fake("warned", mapped + summary(0, 15))
    copying = fake("copying", 'echo "position window = 1024 / 2048 cells resident + host tail 1024 cells"\n' + summary(0))
    resident = fake("resident", 'echo "position window = FULLY RESIDENT"\n' + summary(0))
    dirty = fake("dirty", 'echo "========= Invalid __global__ read of size 4"\n' + summary(3) + 'exit 1\n')
    # the program aborts under the sanitizer, which finds no error of its own: a failed run, never a pass
    crash = fake("crash", mapped + 'echo "ggml-backend.cpp:71: GGML_ASSERT(size <= ggml_nbytes(tensor)) failed"\n'
                 + summary(0) + 'exit 6\n')
    no_summary = fake("no_summary", mapped)
    slow = fake("slow", 'echo "========= COMPUTE-SANITIZER"; sleep 30\n')
    base = ["--bin", str(tmp_path), "--model", str(tmp_path / "m.gguf"), "--work", str(tmp_path / "w")]
    want = {clean: ("pass", 0), warned: ("pass", 0), dirty: ("fail", 1), crash: ("fail", 1), slow: ("not checked", 1),
            resident: ("not checked", 1), copying: ("not checked", 1), no_summary: ("not checked", 1),
            tmp_path / "absent": ("not checked", 1)}
    for tool, (verdict, code) in want.items():
        out = tmp_path / f"{tool.name}.txt"
        assert sanitizer.main([*base, "--sanitizer", str(tool), "--limit", "2", "--out", str(out)]) == code, tool.name
        res = json.loads(capsys.readouterr().out)
        assert [r["verdict"] for r in res["tools"].values()] == [verdict, verdict], tool.name
        assert res["pass"] is (code == 0)
        text = out.read_text()
        assert f"memcheck: {verdict}" in text and f"racecheck: {verdict}" in text
        # the card the run was on, or that none was named
        assert text.splitlines()[1].startswith("# device: ") and isinstance(res["device"], list)
    assert "3 error(s)" in (tmp_path / "dirty.txt").read_text()
    assert "racecheck: pass (15 racecheck warning(s))" in (tmp_path / "warned.txt").read_text()
    crashed = (tmp_path / "crash.txt").read_text()
    assert "exit status 6" in crashed and "GGML_ASSERT" in crashed  # the program's own failure is kept
    assert "stopped by the time limit" in (tmp_path / "slow.txt").read_text()
    assert "position window = 1024 / 2048" in (tmp_path / "clean.txt").read_text()
    assert "no host tail logged" in (tmp_path / "resident.txt").read_text()
    assert "was not mapped" in (tmp_path / "copying.txt").read_text()


def test_sanitizer_output_that_is_not_utf8_and_the_debug_flags_of_its_run(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch):
    from gates import sanitizer

    # the tool prints bytes that are not UTF-8 (a kernel name, a hazard report) and the run's OPENCOTI_KV_DEBUG
    tool = tmp_path / "bytes"
    tool.write_text('#!/bin/sh\nprintf "========= COMPUTE-SANITIZER \\377\\376\\n"; echo "========= flags=[$OPENCOTI_KV_DEBUG]"; '
                    'echo "position window = 1024 / 2048 cells resident + host tail 1024 cells"; '
                    'echo "host tail mapped into the device\'s address space: 2.00 MiB device"; '
                    'echo "========= ERROR SUMMARY: 0 errors"\n')
    tool.chmod(0o755)
    base = ["--bin", str(tmp_path), "--model", str(tmp_path / "m.gguf"), "--work", str(tmp_path / "w"),
            "--sanitizer", str(tool), "--tools", "memcheck", "--limit", "5"]
    monkeypatch.setenv("OPENCOTI_KV_DEBUG", "copy-tail")  # an inherited flag never reaches the checked run
    out = tmp_path / "plain.txt"
    assert sanitizer.main([*base, "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["tools"]["memcheck"]["verdict"] == "pass"
    assert "COMPUTE-SANITIZER \ufffd\ufffd" in out.read_text() and "flags=[]" in out.read_text()
    out = tmp_path / "ring.txt"
    assert sanitizer.main([*base, "--debug", "tail-ring", "--out", str(out)]) == 0
    capsys.readouterr()
    text = out.read_text()
    assert "OPENCOTI_KV_DEBUG=tail-ring" in text.splitlines()[0] and "## memcheck: OPENCOTI_KV_DEBUG=tail-ring " in text
    assert "flags=[tail-ring]" in text


def _sanitizer_stand_in(p: Path, lines: str) -> Path:
    """A stand-in compute-sanitizer at p: a clean run over a mapped tail that also runs the shell `lines`."""
    p.write_text('#!/bin/sh\necho "position window = 512 / 1024 cells resident + host tail 512 cells"; '
                 'echo "host tail mapped into the device\'s address space: 2.00 MiB device"; '
                 f'{lines}echo "========= ERROR SUMMARY: 0 errors"\n')
    p.chmod(0o755)
    return p


def _sanitizer_in(tmp_path: Path, name: str, lines: str) -> Path:
    return _sanitizer_stand_in(tmp_path / name, lines)


def _sanitizer_args(tmp_path: Path, debug: str) -> list[str]:
    """gates.sanitizer's arguments for one memcheck run with OPENCOTI_KV_DEBUG=debug (the stand-in given apart)."""
    return ["--bin", str(tmp_path), "--model", str(tmp_path / "m.gguf"), "--work", str(tmp_path / "w"),
            "--tools", "memcheck", "--limit", "5", "--debug", debug]


def test_sanitizer_asked_to_carry_passes_only_where_the_run_read_carried_chunks(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture):
    from gates import sanitizer

    tool = functools.partial(_sanitizer_in, tmp_path)
    base = _sanitizer_args(tmp_path, "tail-ring,ring-carry")
    read = tool("read", 'echo "I tail ring: 3 carried chunk(s) read by graph 2"; ')
    out = tmp_path / "read.txt"
    assert sanitizer.main([*base, "--sanitizer", str(read), "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)["tools"]["memcheck"]
    assert res["verdict"] == "pass" and res["carry_read"] is True and res["carry_dropped_on_write"] is False
    assert "tail ring: 3 carried chunk(s) read by graph 2" in out.read_text()  # the line is kept in the file
    # the same clean run that never read a carried chunk: the carry was not under the tool
    silent = tool("silent", "")
    assert sanitizer.main([*base, "--sanitizer", str(silent), "--out", str(tmp_path / "silent.txt")]) == 1
    res = json.loads(capsys.readouterr().out)["tools"]["memcheck"]
    assert res["verdict"] == "not checked" and "the carry did not run" in res["why"] and res["carry_read"] is False
    assert "memcheck: not checked" in (tmp_path / "silent.txt").read_text()
    # without ring-carry asked, the same run passes (it records that no carried chunk was read)
    plain = [x if x != "tail-ring,ring-carry" else "tail-ring" for x in base]
    assert sanitizer.main([*plain, "--sanitizer", str(silent), "--out", str(tmp_path / "plain.txt")]) == 0
    assert json.loads(capsys.readouterr().out)["tools"]["memcheck"]["carry_read"] is False


def test_sanitizer_asked_for_the_carry_trial_generates_enough_tokens_and_needs_its_line(tmp_path: Path,
                                                                                        capsys: pytest.CaptureFixture):
    from gates import sanitizer

    tool = functools.partial(_sanitizer_in, tmp_path)
    base = _sanitizer_args(tmp_path, "tail-ring,ring-carry-trial")
    # the stand-in prints the -n it was given, and the trial's line only where the run made 22 decode tokens
    ended = tool("ended", 'n=$(echo "$@" | sed "s/.* -n \\([0-9]*\\) .*/\\1/"); echo "generated $n"; '
                          '[ "$n" -ge 23 ] && echo "I tail ring: ring-carry dropped: a token took 2.0 ms carrying, '
                          '1.0 ms not (medians of 8)"; ')
    out = tmp_path / "trial.txt"
    assert sanitizer.main([*base, "--sanitizer", str(ended), "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)["tools"]["memcheck"]
    assert res["verdict"] == "pass" and "ring-carry-trial" in res["flags_ran"]
    assert "32 tokens generated" in out.read_text().splitlines()[0] and " -n 32 " in out.read_text()
    # the default 8 tokens without the flag; given too few with it, the trial does not end: not checked, exit 1
    assert sanitizer.main([*_sanitizer_args(tmp_path, "tail-ring"), "--sanitizer", str(ended),
                           "--out", str(tmp_path / "plain.txt")]) == 0
    capsys.readouterr()
    assert " -n 8 " in (tmp_path / "plain.txt").read_text()
    assert sanitizer.main([*base, "--n-predict", "8", "--sanitizer", str(ended), "--out", str(out)]) == 1
    res = json.loads(capsys.readouterr().out)["tools"]["memcheck"]
    assert res["verdict"] == "not checked" and "no carry trial ran to its end" in res["why"]
    with pytest.raises(SystemExit):
        sanitizer.main([*base, "--n-predict", "0", "--sanitizer", str(ended), "--out", str(out)])
    assert "--n-predict 0" in capsys.readouterr().err


def test_sanitizer_wide_passes_only_where_the_window_kept_cells_in_device_memory(tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture):
    from gates import sanitizer

    def tool(name: str, cells: int) -> Path:
        p = tmp_path / name
        p.write_text('#!/bin/sh\necho "position window = 512 / 1024 cells resident + host tail 512 cells"; '
                     f'echo "host tail mapped into the device\'s address space: 2.00 MiB device, {cells} cells in '
                     'device memory (x)"; echo "model=$(echo "$@" | grep -o "synthetic-[^ ]*")"; '
                     'echo "========= ERROR SUMMARY: 0 errors"\n')
        p.chmod(0o755)
        return p

    work = tmp_path / "w"
    work.mkdir()
    (work / "synthetic-2l-wide.gguf").write_bytes(b"GGUF")  # present: ensure_model keeps it
    base = ["--bin", str(tmp_path), "--work", str(work), "--tools", "memcheck", "--limit", "5"]
    out = tmp_path / "part.txt"
    assert sanitizer.main([*base, "--wide", "--sanitizer", str(tool("part", 512)), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["tools"]["memcheck"]["verdict"] == "pass"
    text = out.read_text()
    assert "4 KiB K/V rows" in text.splitlines()[0] and "synthetic-2l-wide.gguf" in text
    # the same clean run with no device part is no pass under --wide, and is one without it
    out = tmp_path / "none.txt"
    assert sanitizer.main([*base, "--wide", "--sanitizer", str(tool("none", 0)), "--out", str(out)]) == 1
    res = json.loads(capsys.readouterr().out)["tools"]["memcheck"]
    assert res["verdict"] == "not checked" and "no cells in device memory" in res["why"]
    assert sanitizer.main([*base, "--model", str(work / "synthetic-2l-wide.gguf"), "--sanitizer", str(tool("n2", 0)),
                           "--out", str(out)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        sanitizer.main([*base, "--wide", "--model", str(work / "x.gguf"), "--out", str(out)])
    capsys.readouterr()


def test_kernel_profile_reads_ncu_csv_and_counts_the_decodes_kernels_per_token():
    from gates import kernel_profile as kp

    # ncu's --csv log: the program's own lines first, then one row per kernel and metric (ids in launch order)
    head = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",' \
           '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n'

    def row(i: int, name: str, ns: str, metric: str = "gpu__time_duration.sum") -> str:
        return f'"{i}","1","llama-completion","h","{name}","1","7","(128, 1, 1)","(1, 2, 4)","0","9.0",' \
               f'"Command line profiler metrics","{metric}","ns","{ns}"\n'

    text = "==PROF== Connected to process\nsome program output\n" + head + "".join([
        row(0, "void flash_attn_ext_f16<128, 128, 8, 8>(const char *, int)", "50,000"),  # a prompt ubatch: not decode
        row(1, "void flash_attn_ext_vec<128, 1, (ggml_type)1>(const char *)", "20000"),
        row(2, "void flash_attn_combine_results<128>(const float *)", "2000"),
        row(3, "opencoti_fattn_merge_segments(const float *, float *)", "3000"),
        row(3, "opencoti_fattn_merge_segments(const float *, float *)", "99", metric="sm__cycles_elapsed.avg"),
        row(4, "void flash_attn_ext_vec<128, 1, (ggml_type)1>(const char *)", "22000"),
        row(5, "void flash_attn_combine_results<128>(const float *)", "2000"),
        row(6, "opencoti_fattn_merge_segments(const float *, float *)", "5000"),
    ])
    rows = kp.parse_ncu_csv(text)
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]  # the other metric's row is not a launch
    assert rows[0] == {"id": 0, "name": "flash_attn_ext_f16", "ns": 50000.0}
    dec = kp.decode_kernels(rows)
    assert [r["id"] for r in dec] == [1, 2, 3, 4, 5, 6]
    pt = kp.per_token(dec, 2)
    assert pt["us_per_token"] == 27.0  # (20 + 2 + 3 + 22 + 2 + 5) us over 2 tokens
    assert pt["kernels"]["opencoti_fattn_merge_segments"] == {"launches_per_token": 1.0, "us_per_token": 4.0,
                                                              "median_us": 4.0}
    assert kp.parse_ncu_csv("no profile here") == []
    assert kp.decode_kernels(rows[:1]) == []  # no vector launch: no decode was profiled


def test_gate_h_judges_a_goal_on_the_best_window_by_medians_not_on_the_curves_pick(tmp_path: Path):
    from gates.gpu import budget_rows, gate_h, parse_args, write_budget_csv

    # upstream f16 decodes 1,000 tok/s; the q4_0 window 700 (the curve's single run picked it: its f16 run was slow),
    # the f16 window, repeated, 990
    bin_dir, calls = fake_completion_rates(tmp_path, 'pp=60000.00; '
                                                     'case "$*" in *q4_0*window*) tg=700.00;; *window*) tg=990.00;; '
                                                     '*) tg=1000.00;; esac')
    rows = budget_rows(131072, [3900], "upstream f16", {"rc": 0, "prefill_tps": 60000.0, "decode_tps": 1000.0,
                                                         "device_mib_peak": 3864}, 131072)
    rows += budget_rows(131072, [3900], "window f16", {"rc": 0, "prefill_tps": 40000.0, "decode_tps": 850.0,
                                                        "device_mib_peak": 3850, "window": {"resident": 125696},
                                                        "prompt_tokens": 35131}, 131072, target=3426)
    rows += budget_rows(131072, [3900], "window q4_0", {"rc": 0, "prefill_tps": 55000.0, "decode_tps": 700.0,
                                                         "device_mib_peak": 2604, "fully_resident": True,
                                                         "prompt_tokens": 35131}, 131072, target=3426)
    # a window over the budget is not a candidate
    rows += budget_rows(131072, [3900], "window q8_0", {"rc": 0, "prefill_tps": 70000.0, "decode_tps": 990.0,
                                                         "device_mib_peak": 4000, "fully_resident": True,
                                                         "prompt_tokens": 35131}, 131072, target=3426)
    csv_path = tmp_path / "curve.csv"
    write_budget_csv(csv_path, rows, [131072])
    a = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--repeat-csv", str(csv_path), "--repeat-reps", "3", "--curve-words", "50"])
    res = gate_h(a, tmp_path / "m.gguf", tmp_path)
    goal = next(p for p in res["points"] if p["kind"] == "goal")
    assert goal["window"] == "window q4_0"  # the curve's pick
    assert [w["config"] for w in goal["windows"]] == ["window f16", "window q4_0"]
    assert goal["best_window"] == "window f16" and goal["met"]
    assert goal["ratios_to_reference"]["window f16"]["decode_tps"] == 0.99
    assert goal["ratios_to_reference"]["window q4_0"]["decode_tps"] == 0.7
    lines = calls.read_text().splitlines()
    assert sum("window" in ln and "-ctk f16" in ln and "--vram-target 3426" in ln for ln in lines) == 3
    assert not any("window" in ln and "-ctk q8_0" in ln for ln in lines)


def test_kernel_profile_sets_each_window_against_resident_with_or_without_the_profile():
    from gates import kernel_profile as kp

    configs = {
        "resident": {"timed_median_ms": 1.0, "us_per_token": 300.0},
        "window 34816": {"timed_median_ms": 1.25, "us_per_token": 380.0},  # profiled: kernels and waiting
        "window 34816 no-tail-combine": {"timed_median_ms": 1.125},          # --no-ncu: the timed cost only
        "window 512": {"timed_median_ms": None},                             # every timed run failed: left out
    }
    lines = kp.over_resident(configs)
    assert configs["window 34816"]["over_resident"] == {"timed_us_per_token": 250.0, "decode_ratio": 0.8,
                                                        "kernel_us_per_token": 80.0, "waiting_us_per_token": 170.0}
    assert configs["window 34816 no-tail-combine"]["over_resident"] == {"timed_us_per_token": 125.0,
                                                                        "decode_ratio": 0.889}
    assert "over_resident" not in configs["window 512"] and "over_resident" not in configs["resident"]
    assert lines["window 34816"] == "250.0 us a token (decode 0.8), of it 80.0 us kernels, 170.0 us waiting"
    assert sorted(lines) == ["window 34816", "window 34816 no-tail-combine"]
    # with each repetition's times, the paired ratios (against the resident run of the same repetition), a failed
    # run of either side left out
    configs = {"resident": {"timed_median_ms": 1.0, "timed_by_rep": [1.0, 1.2, None, 0.9]},
               "window 256": {"timed_median_ms": 1.2, "timed_by_rep": [1.25, 1.2, 1.1, None]}}
    lines = kp.over_resident(configs)
    assert configs["window 256"]["over_resident"]["decode_ratio_runs"] == [0.8, 1.0]
    assert configs["window 256"]["over_resident"]["decode_ratio_paired_median"] == 0.9
    assert lines["window 256"].endswith("paired median 0.9 of 2; against 0.9: not decided: its 2 runs (0.8-1) fall "
                                       "on both sides of it")
    assert configs["window 256"]["over_resident"]["vs_small_tail_target"].startswith("not decided")
    # many runs decide item 3's small-tail target where the runs around the median lie on one side of 0.9, though
    # the smallest and largest do not
    runs = [0.82, 0.86] + [0.91 + 0.002 * i for i in range(17)] + [0.97]
    configs = {"resident": {"timed_median_ms": 1.0, "timed_by_rep": [1.0] * len(runs)},
               "window 34816": {"timed_median_ms": 1.1, "timed_by_rep": [1.0 / r for r in runs]}}
    kp.over_resident(configs)
    verdict = configs["window 34816"]["over_resident"]["vs_small_tail_target"]
    assert verdict.startswith("met in runs ") and verdict.endswith("of 20 by size" + verdict.split("of 20 by size")[1])
    assert "all 20: 0.82-0.97" in verdict
    configs["window 34816"]["timed_by_rep"] = [1.0 / (r - 0.025) for r in runs]  # the same runs 0.025 lower
    kp.over_resident(configs)
    assert configs["window 34816"]["over_resident"]["vs_small_tail_target"].startswith("not decided")
    configs["window 34816"]["timed_by_rep"] = [1.0 / (r - 0.05) for r in runs]
    kp.over_resident(configs)
    assert configs["window 34816"]["over_resident"]["vs_small_tail_target"].startswith("missed in runs ")


def test_timed_runs_rotate_which_configuration_leads_each_repetition():
    from gates.common import rotated

    cs = ["resident", "a", "b"]
    orders = [rotated(cs, rep) for rep in range(6)]
    assert orders[:3] == [["resident", "a", "b"], ["a", "b", "resident"], ["b", "resident", "a"]]
    assert orders[3:] == orders[:3]
    # over any whole number of turns each configuration takes each place equally often
    assert all(sorted(o.index(c) for o in orders) == [0, 0, 1, 1, 2, 2] for c in cs)
    assert rotated([], 3) == []


def test_kernel_profile_counts_the_timed_runs_whose_ring_read_carried_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    from gates import kernel_profile as kp

    bindir = tmp_path / "bin"
    bindir.mkdir()
    # a stand-in llama-completion: a 256-cell window's ring reads carried chunks only where ring-carry is asked for
    # (a 512-cell one never does)
    fake_tool(bindir / "llama-completion", "\n".join([
        'case ",$OPENCOTI_KV_DEBUG," in *,ring-carry,*) [ "$LLAMA_ARG_KV_WINDOW_CELLS" = 256 ] && echo "ggml_cuda:'
        ' tail ring: 3 carried chunk(s) read by graph 4 (the first time in this context)" ;; esac',
        # a comparison flag's own line, once a process
        '[ -n "$OPENCOTI_KV_DEBUG" ] && echo "0.1 I f: OPENCOTI_KV_DEBUG $OPENCOTI_KV_DEBUG: the way it ran"',
        # the build that ran, as llama logs it
        'echo "0.0 I cmn  common_param: common_params_print_info: build 5 (0c1e5709+0089.9b49f91e) with GNU 13.3.0'
        ' for Linux x86_64"',
        'echo "common_perf_print: prompt eval time =     700.00 ms / 35131 tokens (    0.02 ms per token, 50000.00'
        ' tokens per second)"',
        'echo "common_perf_print:        eval time =     100.00 ms /    63 runs   (    1.59 ms per token,   630.00'
        ' tokens per second)"',
        # llama's count of reused graphs: the stand-in's window builds every decode's graph again
        '[ -n "$LLAMA_ARG_KV_WINDOW_CELLS" ] && r=0 || r=61; echo "common_perf_print:    graphs reused = $r"']),
        script=True)
    monkeypatch.setattr(kp, "ensure_model", lambda path, args: path)  # the stand-in reads no model
    out = tmp_path / "kp.json"
    assert kp.main(["--bin", str(bindir), "--work", str(tmp_path / "w"), "--out", str(out), "--no-ncu", "--reps", "2",
                    "--windows", "256", "--debug", "", "ring-carry"]) == 0
    result = json.loads(out.read_text())
    assert result["builds"] == ["0c1e5709+0089.9b49f91e"]  # which build every timed run was
    configs = result["configs"]
    assert {k: v["carry_read_runs"] for k, v in configs.items()} == {
        "resident": 0, "window 256": 0, "window 256 ring-carry": 2}
    assert configs["window 256 ring-carry"]["timed_ms_per_token"] == [100.0 / 63, 100.0 / 63]
    # the second repetition turned the order by one place
    assert {k: v["places"] for k, v in configs.items()} == {
        "resident": [1, 3], "window 256": [2, 1], "window 256 ring-carry": [3, 2]}
    assert configs["window 256"]["timed_by_rep"] == [100.0 / 63, 100.0 / 63]
    assert configs["window 256"]["over_resident"]["decode_ratio_runs"] == [1.0, 1.0]
    assert configs["resident"]["graphs_reused_of_decodes"] == [[61, 63], [61, 63]]
    assert configs["window 256"]["graphs_reused_of_decodes"] == [[0, 63], [0, 63]]
    assert configs["window 256 ring-carry"]["debug_lines"] == ["OPENCOTI_KV_DEBUG ring-carry: the way it ran"]
    assert configs["window 256"]["debug_lines"] == []
    # the carry logged that it ran, where it was asked for
    assert {k: (v["flags_ran"], v["flags_not_run"]) for k, v in configs.items()} == {
        "resident": ([], []), "window 256": ([], []), "window 256 ring-carry": (["ring-carry"], [])}
    capsys.readouterr()
    # a flag asked for that never logs its line did not run: the configuration says so
    assert kp.main(["--bin", str(bindir), "--work", str(tmp_path / "w2"), "--out", str(out), "--no-ncu", "--reps", "1",
                    "--windows", "512", "--debug", "tail-ring,ring-carry"]) == 0
    silent = json.loads(out.read_text())["configs"]["window 512 tail-ring,ring-carry"]
    assert silent["flags_ran"] == [] and silent["flags_not_run"] == ["ring-carry"]
    capsys.readouterr()


def test_room_probe_runs_each_window_variant_its_way_and_reports_medians_against_the_reference(
        tmp_path: Path, capsys: pytest.CaptureFixture):
    from gates import room_probe

    # a stand-in llama-completion: the window's figures depend on how it was asked (a command-line setting, the
    # debug variable, or neither); the reference is the run without --kv-residency-mode
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "llama-completion"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *--no-kv-prefill-copy*--vram-target\\ 1880*) cells=36864; tps=990 ;;\n'
        '  *--no-kv-prefill-copy*) cells=34816; tps=870; [ "$OPENCOTI_KV_DEBUG" = tail-ring,ring-wide ] && tps=900 ;;\n'
        '  *--kv-residency-mode*) cells=28672; tps=420; [ "$OPENCOTI_KV_DEBUG" = no-tail-segments ] && tps=620 ;;\n'
        '  *) cells=; tps=1000 ;;\n'
        "esac\n"
        'if [ -n "$cells" ]; then\n'
        '  echo "llama_kv_cache: position window = 30464 / 1048576 cells resident + host tail 1018112 cells '
        '(15908.00 MiB host)"\n'
        "  echo \"llama_kv_cache: host tail mapped into the device's address space: 448.00 MiB device + 1.00 MiB "
        'pinned host, 16 K/V buffers, $cells cells in device memory (x)"\n'
        "fi\n"
        '[ "$cells" = 36864 ] && echo "llama_kv_cache: the mapping granularity\'s remainders: 4 of 8 layers hold one granule '
        'more of K and of V in device memory"\n'
        'echo "common_perf_print: prompt eval time =     700.00 ms / 35131 tokens (    0.02 ms per token, '
        '50000.00 tokens per second)"\n'
        'echo "common_perf_print:        eval time =     100.00 ms /   127 runs   (    1.00 ms per token, '
        '$tps.00 tokens per second)"\n')
    fake.chmod(0o755)
    out = tmp_path / "probe.json"
    variants = ["", "--no-kv-prefill-copy", "no-tail-segments", "tail-ring ring-wide --no-kv-prefill-copy",
                "--no-kv-prefill-copy --vram-target 1880"]
    code = room_probe.main(["--bin", str(bindir), "--model", str(tmp_path / "m.gguf"), "--work", str(tmp_path / "w"),
                            "--reps", "2", "--out", str(out), "--variants", *variants])
    assert code == 0
    summary = json.loads(out.read_text())["summary"]
    got = {k: (v["decode_tps_median"], v["device_cells"], v["decode_over_reference"]) for k, v in summary.items()}
    assert got == {
        "window f16 ctx 1048576": (420.0, [28672], 0.42),
        "window f16 ctx 1048576 --no-kv-prefill-copy": (870.0, [34816], 0.87),
        "window f16 ctx 1048576 no-tail-segments": (620.0, [28672], 0.62),
        # flags and arguments in one variant: the flags joined in the debug variable
        "window f16 ctx 1048576 tail-ring ring-wide --no-kv-prefill-copy": (900.0, [34816], 0.9),
        # a later --vram-target replaces the probe's
        "window f16 ctx 1048576 --no-kv-prefill-copy --vram-target 1880": (990.0, [36864], 0.99),
        "reference f16 ctx 35840 (head mode)": (1000.0, [], 1.0),  # 35,131 + 128 tokens, rounded up to 1,024 cells
    }
    assert all(v["ok"] == v["runs"] == 2 for v in summary.values())
    # the layers a sized window gave a granule more, where the cache logs them
    assert summary["window f16 ctx 1048576 --no-kv-prefill-copy --vram-target 1880"]["granule_layers"] == [[4, 8]]
    assert summary["window f16 ctx 1048576"]["granule_layers"] is None
    assert summary["window f16 ctx 1048576"]["decode_over_reference_paired"] == 0.42
    capsys.readouterr()


def test_room_probe_runs_head_mode_beside_an_upstream_reference_and_pairs_each_run_with_its_repetitions_reference(
        tmp_path: Path, capsys: pytest.CaptureFixture):
    """With --ref-bin the window build's head mode runs at the reference's context too; a reference that drifts
    between repetitions moves the paired ratio less than the ratio of medians."""
    from gates import room_probe

    def stand_in(d: Path, body: str, compiler: str = "GNU 13.3.0") -> None:
        d.mkdir()
        (d / "llama-completion").write_text(
            "#!/bin/sh\n" + f'[ "$1" = --version ] && {{ {version_line(compiler)}; exit 0; }}\n' + body +
            'echo "common_perf_print: prompt eval time =     700.00 ms / 35131 tokens (    0.02 ms per token, '
            '50000.00 tokens per second)"\n'
            'echo "common_perf_print:        eval time =     100.00 ms /   127 runs   (    1.00 ms per token, '
            '$tps.00 tokens per second)"\n')
        (d / "llama-completion").chmod(0o755)

    counter = tmp_path / "rep"
    # the window build: the window decodes 800, head mode 950; the upstream build decodes 1000, then 900 (drift)
    stand_in(tmp_path / "full", 'case "$*" in *"--kv-residency-mode head"*) tps=950 ;; *) tps=800 ;; esac\n')
    stand_in(tmp_path / "up", f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}\n'
                              'if [ "$n" = 0 ]; then tps=1000; else tps=900; fi\n', compiler="GNU 12.2.0")
    out = tmp_path / "probe.json"
    code = room_probe.main(["--bin", str(tmp_path / "full"), "--ref-bin", str(tmp_path / "up"), "--model",
                            str(tmp_path / "m.gguf"), "--work", str(tmp_path / "w"), "--reps", "2", "--out", str(out),
                            "--variants", ""])
    assert code == 0
    doc = json.loads(out.read_text())
    summary = doc["summary"]
    # builds of different compilers: the figures are reported, with the note that their ratio measures the compilers
    assert doc["compilers"] == {"window": "GNU 13.3.0 for Linux x86_64", "reference": "GNU 12.2.0 for Linux x86_64"}
    assert "a ratio between them measures the compilers too" in doc["compilers_differ"]
    assert list(summary) == ["window f16 ctx 1048576", "reference f16 ctx 35840", "head mode f16 ctx 35840"]
    assert summary["reference f16 ctx 35840"]["decode_tps_median"] == 950.0
    assert summary["window f16 ctx 1048576"]["decode_over_reference"] == round(800 / 950, 3)
    assert summary["window f16 ctx 1048576"]["decode_over_reference_paired"] == round((0.8 + 800 / 900) / 2, 3)
    assert summary["head mode f16 ctx 35840"]["decode_over_reference_paired"] == round((0.95 + 950 / 900) / 2, 3)
    capsys.readouterr()


def _second_run(tried: list[int], decode: float, peak: int, rc: int = 0) -> Callable[[int], dict]:
    """A stand-in for gate g's second window run at another target: records the target, peaks at `peak`."""
    def run_at(target: int) -> dict:
        tried.append(target)
        return {"rc": rc, "device_mib_peak": peak, "decode_tps": decode if rc == 0 else None}
    return run_at


def test_gate_g_refill_raises_the_target_by_what_the_peak_left_and_keeps_it_only_where_it_fits():
    from gates.gpu import refill

    first = {"rc": 0, "device_mib_peak": 2284, "decode_tps": 864.5, "window": {"resident": 34048, "tail": 1014528}}
    tried: list[int] = []
    again = functools.partial(_second_run, tried, 986.6)

    # 16 MiB left under 2,300, 8 kept back: the target rises by 8 and the second run fits
    t, r, note = refill(2300, 1824, first, 8, again(2296))
    assert (t, r["decode_tps"], tried) == (1832, 986.6, [1832])
    assert note == "refilled from --vram-target 1824 (peak 2284 MiB)"
    # a second run over the budget, or one that fails, is not kept: the first stays, and the row says so
    for peak, rc in ((2301, 0), (2296, 1)):
        t, r, note = refill(2300, 1824, first, 8, again(peak, rc))
        assert (t, r) == (1824, first) and note.startswith("refill to --vram-target 1832 not kept"), note
    # nothing is tried where the peak left no more than the kept MiB, where it was not measured, or when turned off
    tried.clear()
    # or where the window held the whole context (no tail: the thirty-fourth round raised q4_0 at 1M and 11,000 MiB,
    # fully resident at a 9,324 MiB peak, to a target of 12,424 for nothing)
    for budget, run, keep in ((2292, first, 8), (2300, {**first, "device_mib_peak": 0}, 8), (2300, first, None),
                              (2300, {**first, "rc": 1}, 8), (2300, {**first, "window": None, "fully_resident": True}, 8),
                              (2300, {**first, "window": {"resident": 1048576, "tail": 0}}, 8)):
        assert refill(budget, 1824, run, keep, again(2296)) == (1824, run, "")
    assert tried == []


def test_gate_c_sized_row_fails_with_a_reason_when_no_target_sizes_its_window(tmp_path: Path):
    from gates.gpu import gate_c, parse_args

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # a stand-in whose every sized run is fully resident: no target keeps fewer cells than the row wants
    fake_tool(bin_dir / "llama-perplexity", "\n".join([
        f'echo "$*" >> {tmp_path}/calls.txt',
        'case "$*" in *vram-target*) echo "llama_kv_cache: position window = FULLY RESIDENT (8192 / 8192 cells on CUDA0,'
        ' 36.00 MiB, auto, budget 1.00 MiB)";; esac',
        'echo "Maximum KLD:   0.000034"', 'echo "Same top p: 100.000 ± 0.000 %"']), script=True)
    a = parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                    "--c-decode-only", "--windows-ub1-4k", "--quant-caches", "q4_0", "--windows-ub1-8k",
                    "--c-sized-ub1-8k", "6000", "--c-cpu-reference"])
    a.windows = []
    res = gate_c(a, tmp_path / "m.gguf", tmp_path)
    assert not res["pass"]
    (row,) = res["windows"]
    assert row["sized_for"] == 6000 and row["vram_target_mib"] is None and not row["pass"]
    assert "no --vram-target sized a window of about 6000 cells" in row["error"]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    # the probes halved down to 1 MiB, and no measuring run followed them
    assert all("ppl-short.txt" in c for c in calls if "--vram-target" in c)


def two_builds(tmp_path: Path) -> tuple[Path, Path]:
    """Two real builds of one library: build `a` holds llama-which (RUNPATH $ORIGIN, as CMake writes it) and its
    libllama.so, which says "a"; build `b` holds a libllama.so that says "b"."""
    import shutil

    cc = shutil.which("cc") or shutil.which("g++")  # the CI installs g++; the sources are C and C++ alike
    assert cc, "no C or C++ compiler"
    extern = '#ifdef __cplusplus\nextern "C"\n#endif\n'
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        (d / "lib.c").write_text(f'{extern}const char *which(void) {{ return "{name}"; }}\n')
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libllama.so"), str(d / "lib.c")], check=True)
    (tmp_path / "main.c").write_text(f'#include <stdio.h>\n{extern}const char *which(void);\n'
                                     'int main(void) { puts(which()); return 0; }\n')
    exe = tmp_path / "a" / "llama-which"
    subprocess.run([cc, "-o", str(exe), str(tmp_path / "main.c"), "-L", str(tmp_path / "a"), "-lllama",
                    "-Wl,--enable-new-dtags,-rpath,$ORIGIN"], check=True)
    return exe, tmp_path / "b"


def test_a_build_runs_its_own_libraries_whatever_ld_library_path_names(tmp_path: Path, monkeypatch):
    """LD_LIBRARY_PATH naming another build's directory lends that build's libllama to this build's program (RUNPATH
    is searched after it); the gates' runs put the program's own directory first, and the check says which library
    came from where."""
    from gates.common import GateError, check_own_libraries, foreign_libraries, own_libraries_env
    from gates.gpu import run

    exe, other = two_builds(tmp_path)
    lent = dict(os.environ, LD_LIBRARY_PATH=str(other))
    assert subprocess.run([str(exe)], env=lent, capture_output=True, text=True).stdout == "b\n"
    assert foreign_libraries(exe, lent) == [f"libllama.so => {other / 'libllama.so'}"]

    own = own_libraries_env(["/usr/bin/env", str(exe)], lent)
    assert own["LD_LIBRARY_PATH"].split(":") == [str(exe.parent), str(other)]
    assert foreign_libraries(exe, own) == []
    assert subprocess.run([str(exe)], env=own, capture_output=True, text=True).stdout == "a\n"
    assert check_own_libraries({"upstream": exe}, lent) == {"upstream": str(exe.parent)}

    monkeypatch.setenv("LD_LIBRARY_PATH", str(other))
    r = run("which", [str(exe)], tmp_path)
    assert r["rc"] == 0 and (tmp_path / "which.log").read_text().endswith("\na\n")

    (exe.parent / "libllama.so").unlink()  # the build lacks its library: the other build's would be loaded
    with pytest.raises(GateError, match=r"the upstream build's llama-which would load libraries of another build"
                                        r".*libllama.so => .*/b/libllama.so.*copy its whole bin directory"):
        check_own_libraries({"upstream": exe}, lent)
    with pytest.raises(GateError, match=r"libllama.so => not found"):
        check_own_libraries({"upstream": exe}, dict(os.environ, LD_LIBRARY_PATH=""))


def test_gates_gpu_refuses_builds_that_would_borrow_libraries(tmp_path: Path):
    """gates.gpu checks every build before any gate runs: exit 2, the reason, no gate results."""
    exe, other = two_builds(tmp_path)
    (exe.parent / "llama-completion").symlink_to(exe.name)
    (exe.parent / "libllama.so").unlink()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["LD_LIBRARY_PATH"] = str(other)
    r = subprocess.run([sys.executable, "-m", "gates.gpu", "--full-bin", str(exe.parent), "--pre-bin", str(exe.parent),
                        "--upstream-bin", str(exe.parent), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
                        "--only", "e"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "would load libraries of another build or none: libllama.so => " in r.stderr
    assert not (tmp_path / "o" / "gpu_gates.json").exists()


def test_gate_g_asks_for_the_whole_prompt_where_a_window_kept_part_of_it_in_its_tail():
    from gates.gpu import MIB, refill_whole, whole_prompt_target

    # the thirty-third round's 2,300 MiB point at 1M: 34,048 cells of an f16 window (16 KiB a cell in the host tail,
    # 1 KiB of attention span), a 35,131-token prompt and 128 tokens decoded after it
    tail = 1048576 - 34048
    first = {"rc": 0, "device_mib_peak": 2300, "decode_tps": 723.0, "span_cell_bytes": 1024,
             "window": {"resident": 34048, "kv_size": 1048576, "tail": tail, "tail_mib": tail * 16384 / MIB}}
    need = 35131 + 128
    # the cells asked for: the need aligned up to the sizer's 256-cell step (35,328) and one step more
    assert whole_prompt_target(1814, first, need) == 1814 + -(-(35584 - 34048) * (16384 + 1024) // MIB) == 1840
    # no span bytes logged: the K and V bytes alone
    assert whole_prompt_target(1814, {**first, "span_cell_bytes": None}, need) == 1814 + 24
    # a need already on the step still gets the step more
    assert whole_prompt_target(1814, first, 35328) == whole_prompt_target(1814, first, 35073) == 1840
    # nothing to ask where the window held the prompt, logged no window, or did not boot
    for r in ({**first, "window": {**first["window"], "resident": need}}, {**first, "window": None},
              {**first, "rc": 1}):
        assert whole_prompt_target(1814, r, need) is None
    tried: list[int] = []
    again = functools.partial(_second_run, tried, 950.0)

    # a larger target whose peak is lower (no tail ring): kept, and the row says from where
    t, r, note = refill_whole(2300, 1814, first, need, again(2274))
    assert (t, r["decode_tps"], tried) == (1840, 950.0, [1840])
    assert note == "the whole prompt asked for: --vram-target 1840 kept (from 1814, peak 2274 MiB)"
    # over the budget, failed, or no peak measured: the first run stays, and the row says why
    for peak, rc in ((2301, 0), (2274, 1), (0, 0)):
        t, r, note = refill_whole(2300, 1814, first, need, again(peak, rc))
        assert (t, r) == (1814, first) and note.startswith("the whole prompt asked for: --vram-target 1840 not kept")
    # the first run's peak not measured: nothing runs (no fit could be judged beside it)
    tried.clear()
    assert refill_whole(2300, 1814, {**first, "device_mib_peak": 0}, need, again(2274))[2] == "" and tried == []


def test_gate_g_keeps_the_whole_prompt_run_in_its_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from gates import gpu

    # each run's peak follows its target, plus 50 MiB while the window reads a large tail (the ring's chunks)
    def fake_run(tag: str, argv: list[str], work: Path, env: dict | None = None, measure: bool = False,
                 timeout: int = 300) -> dict:
        r = {"tag": tag, "rc": 0, "prefill_tps": 50000.0, "decode_tps": 700.0, "prompt_tokens": 35131}
        if "--vram-target" not in argv:
            return r | {"device_mib_peak": 1500, "fully_resident": True}
        target = int(argv[argv.index("--vram-target") + 1])
        cells = 34048 + (target - 1814) * 60
        tail = 131072 - cells
        ring = 50 if cells < 35131 + 128 else 0
        return r | {"device_mib_peak": target + 436 + ring, "decode_tps": 700.0 if ring else 1000.0,
                    "span_cell_bytes": 1024,
                    "window": {"resident": cells, "kv_size": 131072, "tail": tail, "tail_mib": tail * 16384 / MIB}}

    MIB = gpu.MIB
    monkeypatch.setattr(gpu, "run", fake_run)
    a = gpu.parse_args(["--full-bin", str(tmp_path), "--pre-bin", str(tmp_path), "--upstream-bin", str(tmp_path),
                        "--budget-ctxs", "131072", "--budgets-128k", "2300", "--curve-words", "50"])
    out = tmp_path / "out"
    out.mkdir()
    gpu.gate_g(a, tmp_path / "m.gguf", tmp_path, out)
    rows = {r["config"]: r for r in csv.DictReader(open(out / "budget_curve.csv", newline=""))}
    row = rows["window f16"]
    # the calibration (a window with a tail: overhead 486) and the margin (48) put the first target at 1766; its
    # peak left 48 MiB, so the refill raised it to 1806, which filled the budget with part of the prompt still in the
    # tail; the whole prompt's target is larger and peaks lower (no ring), so the row is that run's
    assert row["decode_tps"] == "1000.0" and row["fits_budget"] == "True"
    assert row["note"] == ("refilled from --vram-target 1766 (peak 2252 MiB); the whole prompt asked for: "
                           "--vram-target 1840 kept (from 1806, peak 2276 MiB)")
    assert (row["vram_target_mib"], row["device_mib_peak"], row["resident_cells"]) == ("1840", "2276", "35608")


def test_gate_g_cut_short_keeps_the_rows_it_measured(tmp_path: Path, monkeypatch):
    """A call's time limit stops gate g mid-curve: the CSV holds every run measured so far and the metadata says
    the curve is not complete; a finished run says complete."""
    import gates.gpu as gpu

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tool(bin_dir / "llama-completion", "\n".join([
        'echo "common_perf_print: prompt eval time =     573.10 ms / 35131 tokens (    0.02 ms per token, '
        '61300.00 tokens per second)"',
        'echo "common_perf_print:        eval time =      26.69 ms /    63 runs   (    0.86 ms per token, '
        '600.00 tokens per second)"']), script=True)
    a = gpu.parse_args(["--full-bin", str(bin_dir), "--pre-bin", str(bin_dir), "--upstream-bin", str(bin_dir),
                        "--budget-ctxs", "131072", "--budgets-128k", "2000", "3000", "--curve-words", "50",
                        "--budget-refill", "-1"])
    out = tmp_path / "out"
    out.mkdir()
    real_run, calls = gpu.run, []

    def limited(tag, *args, **kw):
        calls.append(tag)
        # 4 upstream runs, two calibrations (the stand-in logs no window, so neither binds), 2 window runs, the limit
        if len(calls) == 9:
            raise TimeoutError("the call's limit")
        return real_run(tag, *args, **kw)

    monkeypatch.setattr(gpu, "run", limited)
    with pytest.raises(TimeoutError):
        gpu.gate_g(a, tmp_path / "m.gguf", tmp_path, out)
    rows = list(csv.DictReader(open(out / "budget_curve.csv", newline="")))
    assert {(r["config"], r["budget_mib"]) for r in rows} == (
        {(f"upstream {c}", b) for c in ("f16", "q8_0", "q4_0", "f16 -nkvo") for b in ("2000", "3000")}
        | {("window f16", "2000"), ("window f16 --no-kv-prefill-copy", "2000")})
    assert json.loads((out / "budget_curve.json").read_text())["complete"] is False

    monkeypatch.setattr(gpu, "run", real_run)
    gpu.gate_g(a, tmp_path / "m.gguf", tmp_path, out)
    assert json.loads((out / "budget_curve.json").read_text())["complete"] is True
    assert len(list(csv.DictReader(open(out / "budget_curve.csv", newline="")))) == 11 * 2


@pytest.mark.parametrize("mod", ["gates.room_probe", "gates.cpu"])
def test_other_gates_refuse_builds_that_would_borrow_libraries(tmp_path: Path, mod: str):
    """gates.room_probe and gates.cpu check every build they are given before any run: exit 2 and the reason."""
    exe, other = two_builds(tmp_path)
    for name in ("llama-completion", "llama-perplexity"):
        (exe.parent / name).symlink_to(exe.name)
    (exe.parent / "libllama.so").unlink()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["LD_LIBRARY_PATH"] = str(other)
    args = (["--bin", str(exe.parent), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o.json")]
            if mod == "gates.room_probe" else
            ["--patched-bin", str(exe.parent), "--upstream-bin", str(exe.parent), "--work-dir", str(tmp_path / "w")])
    r = subprocess.run([sys.executable, "-m", mod, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "would load libraries of another build or none: libllama.so => " in r.stderr
    assert not (tmp_path / "o.json").exists()


def test_gate_e_holds_the_window_buffer_to_upstreams_and_flat_across_contexts():
    from gates.gpu import buffer_checks

    # the H200's figures (eighteenth round): 180 MiB at every context, upstream 188 / 572 / 1,084
    rows = [{"ctx": c, "upstream_mib": u, "window_mib": 180.01} for c, u in
            ((131072, 188.01), (524288, 572.01), (1048576, 1084.01))]
    assert all(c["met"] for c in buffer_checks(rows))
    # a window buffer that grows with the declared context misses flatness, and where it passes upstream's, that too
    grown = [r | {"window_mib": w} for r, w in zip(rows, (180.01, 400.0, 1200.0), strict=True)]
    met = [c["met"] for c in buffer_checks(grown)]
    assert met == [True, True, False, False]
    # a buffer that was not measured meets nothing
    assert [c["met"] for c in buffer_checks([rows[0] | {"window_mib": None}])] == [False, False]


def test_gate_g_fails_a_budget_where_no_window_booted_within_it():
    from gates.gpu import budget_rows, windowless_points

    ok = {"rc": 0, "decode_tps": 600.0, "prefill_tps": 40000.0, "device_mib_peak": 1890}
    over = ok | {"device_mib_peak": 1950}
    failed = {"rc": 1}
    rows = (budget_rows(131072, [1900], "window f16", ok, 131072, target=1400)
            + budget_rows(131072, [1900], "window q8_0", over, 131072, target=1400)
            + budget_rows(131072, [2100], "window f16", failed, 131072, target=1600)
            + budget_rows(131072, [2100], "window q8_0", over | {"device_mib_peak": 2150}, 131072, target=1600)
            + budget_rows(131072, [1900, 2100], "upstream f16", ok | {"device_mib_peak": 3800}, 131072))
    assert windowless_points(rows) == [(131072, 2100)]


def test_host_build_packs_bin_so_its_symlinks_resolve_where_it_is_unpacked(tmp_path: Path):
    """The archive a build travels in keeps each library symlink pointing at its neighbour (an archive whose links
    named bin/... left the H200's build without its libraries); a link out of bin/ is refused, nothing written."""
    import tarfile

    from forktool.archive import extract_to_dir
    from gates.host_build import pack

    b = tmp_path / "bin"
    b.mkdir()
    (b / "libllama.so.0.5.0").write_bytes(b"\x7fELF lib")
    (b / "libllama.so.0").symlink_to("libllama.so.0.5.0")
    (b / "libllama.so").symlink_to("libllama.so.0")
    (b / "llama-completion").write_bytes(b"\x7fELF exe")
    (b / "llama-completion").chmod(0o755)
    dest = tmp_path / "out" / "bin.tar.xz"
    assert pack(b, dest) == dest.stat().st_size > 0
    unpacked = tmp_path / "there"
    with tarfile.open(dest) as tar:
        assert sorted(tar.getnames()) == ["bin/libllama.so", "bin/libllama.so.0", "bin/libllama.so.0.5.0",
                                          "bin/llama-completion"]
    extract_to_dir(dest, unpacked)  # forktool's checked extraction refuses a link that leaves the archive
    assert (unpacked / "bin" / "libllama.so").read_bytes() == b"\x7fELF lib"
    assert os.readlink(unpacked / "bin" / "libllama.so") == "libllama.so.0"
    assert os.access(unpacked / "bin" / "llama-completion", os.X_OK)
    (b / "libggml.so").symlink_to("/usr/lib/libggml.so")
    with pytest.raises(ValueError, match="points outside"):
        pack(b, tmp_path / "out" / "again.tar.xz")
    assert not (tmp_path / "out" / "again.tar.xz").exists()
    (b / "libggml.so").unlink()
    r = run_module("gates.host_build", "--bin", str(b), "--pack", str(tmp_path / "cli.tar.xz"))
    assert r.returncode == 0 and (tmp_path / "cli.tar.xz").is_file(), r.stderr
    r = run_module("gates.host_build", "--bin", str(b))
    assert r.returncode == 2 and "--bin DIR needs --pack FILE" in r.stderr


def test_host_build_refuses_a_position_the_series_does_not_have():
    r = run_module("gates.host_build", "--position", "pre9999")
    assert r.returncode == 2
    assert "no position 'pre9999': one of upstream, pre0089, full" in r.stderr
    r = run_module("gates.host_build", "--position", "upstream", "--profile", "nope")
    assert r.returncode == 2 and "no build profile 'nope'" in r.stderr
    assert not (ROOT / "build" / "host" / "upstream-nope").exists()  # refused before anything was written


def test_gates_gpu_names_each_gate_it_ran_and_its_verdict_for_forktool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture):
    """`forktool gates 0089` reads these lines: a gate b between builds of different compilers is reported as not
    checked, saying why, and an unknown gate as failed; the exit code is 1."""
    gpu, a = steady_gate_b(tmp_path, monkeypatch, full_compiler="GNU 12.2.0", upstream_compiler="GNU 13.3.0")
    monkeypatch.setattr(gpu, "check_own_libraries", lambda programs, env: {k: str(v.parent) for k, v in programs.items()})
    monkeypatch.setattr(gpu, "ensure_model", lambda path, args: path)
    monkeypatch.setattr(gpu, "device_cards", lambda: ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"])
    code = gpu.main(["--full-bin", str(a.full_bin), "--pre-bin", str(a.full_bin), "--upstream-bin", str(a.upstream_bin),
                     "--bench-rounds", "5", "--bench-cpus", "", "--work", str(tmp_path / "w"),
                     "--out", str(tmp_path / "o"), "--only", "b,z"])
    err = capsys.readouterr().err.splitlines()
    parts = [line for line in err if line.startswith("forktool-gate-part ")]
    assert code == 1 and len(parts) == 2
    # every gate's result names the card its figures came from
    results = json.loads((tmp_path / "o" / "gpu_gates.json").read_text())
    assert all(r["device"] == ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"] for r in results.values())
    assert "device: NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04" in err
    assert parts[0].startswith("forktool-gate-part b: not checked: the full build was made with GNU 12.2.0")
    assert parts[1] == "forktool-gate-part z: fail: unknown gate 'z'"
    from forktool.commands.gates_cmds import gate_parts, judge
    assert judge(code, gate_parts("\n".join(err))) == "fail"


def test_run_within_runs_each_gate_alone_skips_what_no_longer_fits_and_packs_everything(tmp_path: Path):
    """gates/run_within.sh on a stand-in forktool: one `gates 0089` per gate with GPU_GATES_ONLY and GPU_GATES_ARGS
    set, each gate's output kept apart, a gate whose estimate passes the budget skipped (exit 1: not all ran), and
    everything in one archive."""
    import subprocess
    import tarfile

    fake = tmp_path / "forktool"
    fake.write_text('#!/bin/sh\nmkdir -p build/gpu-gates/out build/gates\n'
                    'echo "{\\"$GPU_GATES_ONLY\\": \\"$GPU_GATES_ARGS\\"}" > build/gpu-gates/out/gpu_gates.json\n'
                    'echo "log of $GPU_GATES_ONLY" > build/gates/0089.log\necho "forktool $* $GPU_GATES_ONLY"\n'
                    '[ "$GPU_GATES_ONLY" = b ] && exit 1; exit 0\n')
    fake.chmod(0o755)
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "build" / "gpu-gates" / "out").mkdir(parents=True)
    (work / "build" / "gpu-gates" / "out" / "gpu_gates.json").write_text('{"earlier": true}')  # a run before
    script = Path(__file__).resolve().parent.parent / "gates" / "run_within.sh"
    r = subprocess.run(["bash", str(script), str(out), "100", "a:1", "b:2:--bench-rounds 15", "c:500", "d"],
                       cwd=work, env=dict(os.environ, FORKTOOL=str(fake)), capture_output=True, text=True)
    assert r.returncode == 1, r.stderr  # b exited 1 and c was skipped
    assert "skip c: " in r.stdout and "its estimate 500 s > 100 s" in r.stdout
    with tarfile.open(out / "gates.tgz") as t:
        names = set(t.getnames())
        doc = {n: t.extractfile(n).read().decode() for n in names if n.endswith(("gpu_gates.json", ".forktool.txt"))}
    assert not (out / "gates").exists()
    assert json.loads(doc["gates/2-b/gpu_gates.json"]) == {"b": "--bench-rounds 15"}
    assert json.loads(doc["gates/4-d/gpu_gates.json"]) == {"d": ""}
    assert doc["gates/1-a.forktool.txt"] == "forktool gates 0089 a\n"
    assert "gates/1-a/0089.log" in names and "gates/summary.txt" in names
    assert json.loads(doc["gates/0-earlier/build/gpu-gates/out/gpu_gates.json"]) == {"earlier": True}  # kept apart
    assert not any(n.startswith("gates/3-c") for n in names)
    bad = subprocess.run(["bash", str(script), str(out), "ten", "a"], cwd=work, capture_output=True, text=True)
    assert bad.returncode == 2 and "LIMIT_S must be whole seconds, not 'ten'" in bad.stderr
    # KIT: its bundle/ becomes GPU_GATES_BUNDLE; a kit without one is refused before anything runs
    kit = tmp_path / "kit"
    (kit / "bundle").mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "bundle=$GPU_GATES_BUNDLE"\n')
    r = subprocess.run(["bash", str(script), str(out / "k"), "100", "e"], cwd=work, capture_output=True, text=True,
                       env=dict(os.environ, FORKTOOL=str(fake), KIT=str(kit)))
    assert r.returncode == 0, r.stderr
    with tarfile.open(out / "k" / "gates.tgz") as t:
        assert t.extractfile("gates/1-e.forktool.txt").read().decode() == f"bundle={kit}/bundle\n"
    (kit / "bundle").rmdir()
    r = subprocess.run(["bash", str(script), str(out / "k2"), "100", "e"], cwd=work, capture_output=True, text=True,
                       env=dict(os.environ, FORKTOOL=str(fake), KIT=str(kit)))
    assert r.returncode == 2 and "has no bundle/ (make device-kit writes one)" in r.stderr


def test_run_within_says_a_gate_its_time_limit_stopped_was_not_checked(tmp_path: Path):
    import tarfile

    fake = tmp_path / "forktool"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    script = Path(__file__).resolve().parent.parent / "gates" / "run_within.sh"
    r = subprocess.run(["bash", str(script), str(out), "2", "a:1"], cwd=work, env=dict(os.environ, FORKTOOL=str(fake)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert re.search(r"  a: stopped by the time limit at \d+ s \(exit 124\): not checked", r.stdout), r.stdout
    with tarfile.open(out / "gates.tgz") as t:
        assert "not checked" in t.extractfile("gates/summary.txt").read().decode()


def test_gates_cpu_reports_each_required_check_per_model_as_a_part():
    """gates.cpu's parts for `forktool gates`: the required checks only (a check that ran but was not asked for does
    not count), a model stopped by an error fails each part it owed, and (d) per fallback model."""
    from gates.cpu import gate_parts

    result = {"archs": {"llama": {"a": {"ok": True}, "b": {"ok": False}, "c": {"ok": False}},
                        "gemma3": {"error": "llama-perplexity exit 1"}},
              "fallback": {"jamba": {"ok": True}, "mamba": {"ok": False, "error": "no refusal"}}}
    assert gate_parts(result, {"a", "b", "d"}) == [
        ("a.llama", "pass", ""), ("b.llama", "fail", ""),
        ("a.gemma3", "fail", "llama-perplexity exit 1"), ("b.gemma3", "fail", "llama-perplexity exit 1"),
        ("d.jamba", "pass", ""), ("d.mamba", "fail", "no refusal")]
    assert gate_parts(result, {"a"}) == [("a.llama", "pass", ""), ("a.gemma3", "fail", "llama-perplexity exit 1")]


def series_checkout(root: Path, *packed: Path) -> None:
    """root given a checkout's series inputs (patches/series, a patch, vendor/vendor.lock, registry/build.yaml), and
    each packed folder the inputs.sha256 gates/series_inputs.sh computes for them, as `make device-bin` and
    gates.bundle write it."""
    for d in ("patches", "vendor", "registry"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "registry" / "build.yaml").write_text("profiles: {}\n")
    (root / "patches" / "series").write_text("0001-a.patch\n")
    (root / "patches" / "0001-a.patch").write_text("the patch\n")
    (root / "vendor" / "vendor.lock").write_text("{}\n")
    script = Path(__file__).resolve().parent.parent / "gates" / "series_inputs.sh"
    digest = subprocess.run(["bash", str(script)], cwd=root, capture_output=True, text=True, check=True).stdout
    for d in packed:
        (d / "inputs.sha256").write_text(digest)


def test_device_build_reuses_a_position_only_while_its_files_are_the_ones_it_built(tmp_path: Path):
    """gates/device_build.sh with cmake and make stood in for: a second call with the same archive reuses the build;
    once a file of it changed, a file was added or its manifest is gone, the position is rebuilt, saying why."""
    import subprocess
    import tarfile

    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "cmake").write_text('#!/bin/sh\nwhile [ "$1" != -B ]; do shift; done\nmkdir -p "$2"\n'
                                 'touch "$2/CMakeCache.txt"\n')
    (tools / "make").write_text(f'#!/bin/sh\necho make >> {tmp_path}/makes\nd=$2\nmkdir -p "$d/bin"\n'
                                'for f in llama-completion libggml-cuda.so libggml-base.so libllama.so.0; do\n'
                                '  echo "$f built" > "$d/bin/$f"; done\nchmod +x "$d/bin/llama-completion"\n'
                                'ln -sf libllama.so.0 "$d/bin/libllama.so"\necho "Building CXX object x"\n')
    for t in tools.iterdir():
        t.chmod(0o755)
    src = tmp_path / "src" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(x)\n")
    bundle, work = tmp_path / "bundle", tmp_path / "work"
    bundle.mkdir()
    work.mkdir()
    with tarfile.open(bundle / "full.tar.gz", "w:gz") as t:
        t.add(src, arcname="llama.cpp")
    script = Path(__file__).resolve().parent.parent / "gates" / "device_build.sh"
    env = dict(os.environ, PATH=f"{tools}:{os.environ['PATH']}")
    series_checkout(work, bundle)

    def build() -> str:
        r = subprocess.run(["bash", str(script), str(bundle), "out", "2"], cwd=work, env=env, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def makes() -> int:
        return len((tmp_path / "makes").read_text().splitlines())

    assert "full: make" in build() and makes() == 1
    out = work / "out" / "full"
    assert "link ./libllama.so libllama.so.0" in (out / ".manifest").read_text()
    assert "reused" in build() and makes() == 1
    (out / "libllama.so.0").write_text("someone else's library\n")
    assert "is not what its last build wrote" in build() and makes() == 2
    assert (out / "libllama.so.0").read_text() == "libllama.so.0 built\n"
    (out / "extra.so").write_text("added\n")
    assert "is not what its last build wrote" in build() and makes() == 3 and not (out / "extra.so").exists()
    (out / ".manifest").unlink()
    assert "is not what its last build wrote" in build() and makes() == 4
    assert "reused" in build() and makes() == 4


def test_ensure_model_reuses_a_model_only_while_it_is_the_one_made_with_those_arguments(tmp_path: Path,
                                                                                        monkeypatch: pytest.MonkeyPatch):
    from gates import common, make_model

    calls: list[list[str]] = []
    real = make_model.main

    def counted(argv: list[str]) -> int:
        calls.append(argv)
        return real(argv)

    monkeypatch.setattr(make_model, "main", counted)
    path, args = tmp_path / "m.gguf", ["--layers", "2", "--n-embd", "128"]
    common.ensure_model(path, args)
    made = path.read_bytes()
    assert len(calls) == 1 and not list(tmp_path.glob("*.part*"))
    assert json.loads((tmp_path / "m.gguf.stamp").read_text())["args"] == args
    common.ensure_model(path, args)
    assert len(calls) == 1  # the same model: reused
    path.write_bytes(made[:-1] + bytes([made[-1] ^ 1]))  # one bit changed since
    common.ensure_model(path, args)
    assert len(calls) == 2 and path.read_bytes() == made
    common.ensure_model(path, ["--layers", "3", "--n-embd", "128"])  # other arguments: another model
    assert len(calls) == 3 and path.read_bytes() != made
    (tmp_path / "m.gguf.stamp").unlink()  # a model nobody vouches for
    common.ensure_model(path, args)
    assert len(calls) == 4 and path.read_bytes() == made


def test_the_registry_declares_the_parts_each_gate_program_reports():
    # `forktool gates` prints the registry's sentence of each part a program reports and names the declared parts
    # that did not run: a part the registry does not declare, or one no program can report, would make that wrong
    from forktool import registry as rg
    from gates import cpu, gpu

    reg = rg.load(ROOT / "registry" / "UPSTREAM_SYNC.yaml")
    seen = 0
    for patch in reg.patches:
        for g in patch.gates:
            cmd = list(g.command)
            if "gates/run_gpu_gates.sh" in cmd:
                assert [n for n, _ in g.parts] == list(gpu.GATES), g.name
            elif "gates.cpu" in cmd:
                required = cmd[cmd.index("--gates") + 1] if "--gates" in cmd else ",".join(cpu.CHECKS)
                assert [n for n, _ in g.parts] == required.split(","), g.name
            else:
                assert not g.parts, f"{g.name} declares parts its program does not report"
                continue
            seen += 1
    assert seen == 3  # cpu-logits, cpu-span, gpu-boot-resident-window-curve


def test_gate_programs_that_cannot_run_exit_2_saying_what_is_missing(tmp_path: Path):
    # exit 2 is `forktool gates`' "could not run: not checked", as distinct from a check that failed (exit 1)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "gates.needle", "--bin", str(tmp_path / "nowhere")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"{tmp_path / 'nowhere' / 'llama-server'} not found (make llama-server)" in r.stderr
    r = subprocess.run([sys.executable, "-m", "gates.cpu", "--patched-bin", str(tmp_path), "--upstream-bin",
                        str(tmp_path), "--work-dir", str(tmp_path / "w")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "llama-perplexity not found in" in r.stderr


def _device_out_reused(root: Path, bundle: Path) -> None:
    """A build/device-out/full that gates/device_build.sh takes as unchanged since its last build of bundle's
    full.tar.gz (same .archive sha256, same .manifest), so the script goes on without cmake."""
    import hashlib

    bundle.mkdir(parents=True)
    (bundle / "full.tar.gz").write_bytes(b"not built here")
    full = root / "build" / "device-out" / "full"
    full.mkdir(parents=True)
    for name in ("llama-completion", "libggml-cuda.so", "libggml-base.so", "libllama.so"):
        (full / name).write_text(name)
    (full / "llama-completion").chmod(0o755)
    lines = [f"file ./{p.name} {hashlib.sha256(p.read_bytes()).hexdigest()}" for p in sorted(full.iterdir())]
    (full / ".manifest").write_text("\n".join(lines) + "\n")
    (full / ".archive").write_text(hashlib.sha256(b"not built here").hexdigest() + "\n")
    series_checkout(root, bundle)


@pytest.mark.parametrize(("args", "before"), [
    ("", ["--before-copy"]),
    ("--only d --compare-debug ring-narrow", []),
    ("--before-bin /elsewhere/full", []),
    ("--before-copy", []),
])
def test_run_gpu_gates_lets_gpu_gates_args_name_the_before_build(tmp_path: Path, args: str, before: list[str]):
    """gates/run_gpu_gates.sh passes --before-copy only where GPU_GATES_ARGS names no 'before' of its own: with
    --compare-debug it used to pass both, and gates.gpu refused the pair, so `forktool gates 0089` could not compare
    two paths of one build."""
    import shutil

    root = tmp_path / "work"
    (root / "gates").mkdir(parents=True)
    for name in ("run_gpu_gates.sh", "device_build.sh", "series_inputs.sh"):
        shutil.copy(Path(__file__).resolve().parent.parent / "gates" / name, root / "gates" / name)
    _device_out_reused(root, tmp_path / "bundle")
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    fake.chmod(0o755)
    got = tmp_path / "args.txt"
    r = subprocess.run(["bash", "gates/run_gpu_gates.sh"], cwd=root, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHON=str(fake), GPU_GATES_BUNDLE=str(tmp_path / "bundle"),
                                GPU_GATES_ARGS=args, ARGS_OUT=str(got)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "full: unchanged since its last build" in r.stdout
    argv = got.read_text().split("\n")[:-1]
    assert argv[:2] == ["-m", "gates.gpu"]
    own = args.split()  # what GPU_GATES_ARGS gave comes last, word for word
    assert argv[len(argv) - len(own):] == own
    assert argv[:len(argv) - len(own)].count("--before-copy") == len(before)  # the script's own default, or none
    assert "--compare-debug" not in argv[:len(argv) - len(own)]


def test_device_bin_unpacks_once_and_runs_the_command_with_bin_set(tmp_path: Path):
    """gates/device_bin.sh: BIN is the unpacked build (its libraries first on LD_LIBRARY_PATH), the archive is unpacked
    again only when it changed, and a folder without the archive or without llama-completion is refused (exit 2)."""
    import tarfile

    script = Path(__file__).resolve().parent.parent / "gates" / "device_bin.sh"
    src, kit, home = tmp_path / "src", tmp_path / "kit", tmp_path / "home"
    src.mkdir()
    kit.mkdir()
    home.mkdir()
    tool = src / "llama-completion"
    tool.write_text("#!/bin/sh\necho first\n")
    tool.chmod(0o755)

    def pack() -> None:
        with tarfile.open(kit / "full-bin.tgz", "w:gz") as t:
            t.add(tool, arcname="llama-completion")

    pack()
    env = dict(os.environ, HOME=str(home))
    series_checkout(tmp_path, kit)
    cmd = ["bash", str(script), str(kit), 'echo "$BIN"; echo "$LD_LIBRARY_PATH"; "$BIN/llama-completion"']
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    bin_dir, ld, out = r.stdout.splitlines()
    assert bin_dir == str(home / ".forktool-device-bin") and ld.split(":")[0] == bin_dir and out == "first"
    assert "unpacked" in r.stderr
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "unpacked" not in again.stderr  # the same archive: not unpacked again
    tool.write_text("#!/bin/sh\necho second\n")
    pack()
    changed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert changed.stdout.splitlines()[-1] == "second" and "unpacked" in changed.stderr
    # the command's exit status comes back
    assert subprocess.run(["bash", str(script), str(kit), "exit 3"], cwd=tmp_path, env=env,
                          capture_output=True).returncode == 3
    missing = subprocess.run(["bash", str(script), str(tmp_path / "none"), "true"], env=env, capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "full-bin.tgz missing (make device-bin writes it)" in missing.stderr
    with tarfile.open(kit / "full-bin.tgz", "w:gz") as t:
        t.add(src, arcname="other")
    empty = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "holds no llama-completion" in empty.stderr


def test_device_bin_runs_only_the_build_of_the_checkouts_series(tmp_path: Path):
    """gates/device_bin.sh refuses (exit 2, before running anything) an archive built from other patches or another
    pin than the checkout's, or one that does not say what it was built from; DEVICE_OTHER_SERIES=1 runs it,
    saying that its results describe that build."""
    import tarfile

    script = Path(__file__).resolve().parent.parent / "gates" / "device_bin.sh"
    kit, home = tmp_path / "kit", tmp_path / "home"
    for d in (kit, home):
        d.mkdir()
    tool = tmp_path / "llama-completion"
    tool.write_text("#!/bin/sh\necho ran\n")
    tool.chmod(0o755)
    with tarfile.open(kit / "full-bin.tgz", "w:gz") as t:
        t.add(tool, arcname="llama-completion")
    series_checkout(tmp_path)
    patch = tmp_path / "patches" / "0001-a.patch"
    env = dict(os.environ, HOME=str(home))
    env.pop("DEVICE_OTHER_SERIES", None)
    cmd = ["bash", str(script), str(kit), '"$BIN/llama-completion"']

    def run(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, cwd=tmp_path, env=env | extra, capture_output=True, text=True, timeout=60)

    unsaid = run()
    assert unsaid.returncode == 2 and "holds no inputs.sha256" in unsaid.stderr and "ran" not in unsaid.stdout
    series_checkout(tmp_path, kit)
    built = (kit / "inputs.sha256").read_text()
    (kit / "build-stamp").write_text("0c1e5709+0001.abcdef12\n")
    same = run()
    assert same.returncode == 0 and same.stdout.strip() == "ran"
    assert "the cuda build of 0c1e5709+0001.abcdef12" in same.stderr
    patch.write_text("the patch, edited since the build\n")
    other = run()
    assert other.returncode == 2 and "ran" not in other.stdout
    assert f"made from {built[:12]}" in other.stderr and "make device-bin" in other.stderr
    (tmp_path / "vendor" / "vendor.lock").write_text('{"pin": "another"}\n')
    assert run().returncode == 2  # another pin, too
    anyway = run(DEVICE_OTHER_SERIES="1")
    assert anyway.returncode == 0 and anyway.stdout.strip() == "ran"
    assert "its results describe that build, not this tree" in anyway.stderr


def test_gate_g_refit_lowers_a_target_whose_peak_went_over_the_budget():
    from gates.gpu import refit

    # the thirty-fourth round at 1M and 11,000 MiB: f16 at --vram-target 10,756 peaked at 11,194
    first = {"rc": 0, "device_mib_peak": 11194, "decode_tps": None}
    tried: list[int] = []
    again = functools.partial(_second_run, tried, 905.0)
    t, r, note = refit(11000, 10756, first, 48, again(10990))
    assert (t, r["decode_tps"], tried) == (10756 - 194 - 48, 905.0, [10514])
    assert note == "lowered from --vram-target 10756 (peak 11194 MiB)"
    # the lowered run still over, failed or without a peak: the first stays, and the note says why
    for peak, rc in ((11001, 0), (10990, 1), (0, 0)):
        t, r, note = refit(11000, 10756, first, 48, again(peak, rc))
        assert (t, r) == (10756, first) and note.startswith("lowered to --vram-target 10514, not kept (")
    # within the budget, failed or not measured: nothing runs
    tried.clear()
    for r0 in ({**first, "device_mib_peak": 11000}, {**first, "rc": 1}, {**first, "device_mib_peak": None}):
        assert refit(11000, 10756, r0, 48, again(10990)) == (10756, r0, "")
    assert tried == []


def test_gate_g_calibrates_on_a_window_its_target_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A calibration run whose window held the whole context (no tail) says nothing of the overhead: gate g tries the
    smallest budget's target next, and every window row then fits its budget."""
    from gates import gpu

    calls: list[str] = []

    def fake_run(tag: str, argv: list[str], work: Path, env: dict | None = None, measure: bool = False,
                 timeout: int = 300) -> dict:
        calls.append(tag)
        r = {"tag": tag, "rc": 0, "prefill_tps": 50000.0, "decode_tps": 700.0, "prompt_tokens": 35131}
        if "--vram-target" not in argv:
            return r | {"device_mib_peak": 2282, "fully_resident": True}
        target = int(argv[argv.index("--vram-target") + 1])
        if target >= 18000:  # the whole context fits: the peak is the cache's, not the target's
            return r | {"device_mib_peak": 19096, "fully_resident": True}
        cells = target * 50
        return r | {"device_mib_peak": target + 440, "span_cell_bytes": 1024,
                    "window": {"resident": cells, "kv_size": 1048576, "tail": 1048576 - cells,
                               "tail_mib": (1048576 - cells) / 64}}

    monkeypatch.setattr(gpu, "run", fake_run)
    a = gpu.parse_args(["--full-bin", str(tmp_path), "--pre-bin", str(tmp_path), "--upstream-bin", str(tmp_path),
                        "--budget-ctxs", "1048576", "--budgets-1m", "11000", "19500", "--curve-words", "50"])
    out = tmp_path / "out"
    out.mkdir()
    res = gpu.gate_g(a, tmp_path / "m.gguf", tmp_path, out)
    assert [c for c in calls if c.startswith("g-calibrate")] == ["g-calibrate-1048576-18900",
                                                                  "g-calibrate-1048576-10400"]
    ref = res["contexts"][1048576]
    assert (ref["overhead_mib"], ref["calibration_target_mib"], ref["calibration_not_binding"]) == (440, 10400, [18900])
    # each point says which call measured it: the card, the compilers, what "upstream" ran, the calibration
    meta = json.loads((out / "budget_curve.json").read_text())
    assert set(meta["points"]) == {"1048576 11000", "1048576 19500"}
    point = meta["points"]["1048576 11000"]
    assert point["calibration"]["overhead_mib"] == 440 and point["device"] == [] and point["measured"].endswith("Z")
    assert point["upstream"].startswith("--upstream-bin is --full-bin") and "raw" not in point
    rows = [r for r in csv.DictReader(open(out / "budget_curve.csv", newline="")) if r["config"].startswith("window")
            and r["budget_mib"] == "11000"]
    assert len(rows) == 4 and all(r["fits_budget"] == "True" and int(r["device_mib_peak"]) <= 11000 for r in rows)
    assert not any("lowered" in r["note"] for r in rows)

    # --record-raw names where the call's result will be kept, for every point the call measured and no other
    a_raw = gpu.parse_args(["--full-bin", str(tmp_path), "--pre-bin", str(tmp_path), "--upstream-bin", str(tmp_path),
                            "--budget-ctxs", "1048576", "--budgets-1m", "11000", "--curve-words", "50",
                            "--record-raw", "docs/gpu/gpu_gates_round36_g.json"])
    shutil.copytree(out, tmp_path / "out-raw")
    gpu.gate_g(a_raw, tmp_path / "m.gguf", tmp_path, tmp_path / "out-raw")
    meta = json.loads((tmp_path / "out-raw" / "budget_curve.json").read_text())
    assert meta["points"]["1048576 11000"]["raw"] == "docs/gpu/gpu_gates_round36_g.json"
    assert "raw" not in meta["points"]["1048576 19500"]  # measured by the call before

    # the thirty-fourth round's way, the first calibration taken as it came (overhead 196): every window at 11,000
    # MiB goes over, and gate g lowers each to a target that fits
    monkeypatch.setattr(gpu, "calibration_binds", lambda r: True)
    calls.clear()
    res = gpu.gate_g(a, tmp_path / "m.gguf", tmp_path, out)
    assert res["contexts"][1048576]["overhead_mib"] == 196
    rows = [r for r in csv.DictReader(open(out / "budget_curve.csv", newline="")) if r["config"].startswith("window")
            and r["budget_mib"] == "11000"]
    assert all(r["fits_budget"] == "True" and int(r["device_mib_peak"]) <= 11000 for r in rows)
    assert all(r["note"].startswith("lowered from --vram-target 10756 (peak 11196 MiB)") for r in rows)


def test_gate_g_calibration_binds_only_where_the_window_kept_a_tail():
    from gates.gpu import calibration_binds

    run = {"rc": 0, "device_mib_peak": 2188, "window": {"resident": 27904, "tail": 1020672}}
    assert calibration_binds(run)
    for r in ({**run, "window": None, "fully_resident": True}, {**run, "window": {"resident": 1048576, "tail": 0}},
              {**run, "rc": 1}, {**run, "device_mib_peak": None}):
        assert not calibration_binds(r)


def test_gates_gpu_reads_the_cards_from_nvidia_smi(tmp_path: Path):
    from gates.gpu import device_cards

    fake_tool(tmp_path / "nvidia-smi", 'case "$*" in *--query-gpu=name,memory.total,driver_version*) '
              'echo "NVIDIA H200, 143771 MiB, 580.159.04"; echo "NVIDIA H200, 143771 MiB, 580.159.04";; '
              '*) exit 9;; esac', script=True)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    assert device_cards(env) == ["NVIDIA H200, 143771 MiB, 580.159.04"] * 2
    # a failing nvidia-smi, or none on the path: no card named
    fake_tool(tmp_path / "nvidia-smi", "exit 3", script=True)
    assert device_cards(env) == []
    (tmp_path / "nvidia-smi").unlink()
    assert device_cards(dict(os.environ, PATH=str(tmp_path))) == []


def test_the_shipped_budget_curve_names_the_call_card_and_raw_result_of_every_point():
    """docs/gpu/budget_curve.csv is assembled from several calls: each of its (ctx, budget) points must say, in the
    JSON beside it, which card measured it and where that call's raw result lies (a file in docs/gpu), so a figure
    quoted from the curve can be traced to its call."""
    root = Path(__file__).resolve().parents[1] / "docs" / "gpu"
    with open(root / "budget_curve.csv", newline="") as f:
        keys = {f"{r['ctx']} {r['budget_mib']}" for r in csv.DictReader(f)}
    points = json.loads((root / "budget_curve.json").read_text())["points"]
    assert keys and keys == set(points), sorted(keys ^ set(points))
    for key, p in points.items():
        assert p.get("device") and all(d.startswith("NVIDIA ") for d in p["device"]), key
        assert p.get("raw", "").startswith("docs/gpu/") and (root.parent.parent / p["raw"]).is_file(), key
        assert p.get("compilers") and p.get("upstream"), key
