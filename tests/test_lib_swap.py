"""gates.lib_swap: mixed bin directories, the check of what each mix loads, and the verdict per group; end to end
with two builds of a compiled stand-in llama-bench whose speed comes from a linked library."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gates import lib_swap
from gates.common import GateError


def test_parse_group():
    assert lib_swap.parse_group("cuda=libggml-cuda.so") == ("cuda", ["libggml-cuda.so"])
    assert lib_swap.parse_group("ggml=libggml-base.so*, libggml.so*") == ("ggml", ["libggml-base.so*", "libggml.so*"])
    for bad in ("libggml-cuda.so", "=x", "a b=x", "cuda=", "cuda=lib/x.so"):
        with pytest.raises(GateError):
            lib_swap.parse_group(bad)


def bin_dir(root: Path, tag: str) -> Path:
    d = root / tag
    d.mkdir()
    (d / "llama-bench").write_text(f"program {tag}\n")
    (d / "libx.so.0.1").write_text(f"x {tag}\n")
    os.symlink("libx.so.0.1", d / "libx.so.0")
    os.symlink("libx.so.0", d / "libx.so")
    (d / "liby.so").write_text(f"y {tag}\n")
    return d


def test_make_mix_takes_the_donors_group_and_keeps_the_rest(tmp_path: Path):
    a, b = bin_dir(tmp_path, "a"), bin_dir(tmp_path, "b")
    (b / "libx.so.0.2").write_text("x b, a newer version\n")  # a file only the donor has comes too
    dest = tmp_path / "mix"
    took = lib_swap.make_mix(a, b, ["libx.so*"], dest)
    assert took == ["libx.so", "libx.so.0", "libx.so.0.1", "libx.so.0.2"]
    assert (dest / "llama-bench").read_text() == "program a\n" and (dest / "liby.so").read_text() == "y a\n"
    assert (dest / "libx.so.0.1").read_text() == "x b\n" and (dest / "libx.so.0.2").read_text() == "x b, a newer version\n"
    assert os.readlink(dest / "libx.so") == "libx.so.0" and (dest / "libx.so").read_text() == "x b\n"
    # the builds themselves are untouched
    assert (a / "libx.so.0.1").read_text() == "x a\n" and not (a / "libx.so.0.2").exists()


def test_make_mix_refuses_a_group_one_side_lacks_and_writes_nothing(tmp_path: Path):
    a, b = bin_dir(tmp_path, "a"), bin_dir(tmp_path, "b")
    (b / "libz.so").write_text("z\n")
    for base, donor in ((a, b), (b, a)):
        with pytest.raises(GateError, match="matches libz.so"):
            lib_swap.make_mix(base, donor, ["libz.so"], tmp_path / "mix")
        assert not (tmp_path / "mix").exists()


def test_loaded_check_names_files_loaded_from_another_directory(tmp_path: Path):
    mix = bin_dir(tmp_path, "mix")
    (mix / "libggml-cuda.so").write_text("cuda\n")
    other = tmp_path / "other"
    own = {"libx.so.0": str(mix / "libx.so.0"), "libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6"}
    good = lib_swap.loaded_check(mix, own, f"load_backend: loaded CUDA backend from {mix}/libggml-cuda.so\n",
                                 ["libggml-cuda.so"])
    assert good == {"foreign": [], "group_loaded": True}
    # a backend found elsewhere (the current directory, say), a linked library of the directory's taken from elsewhere
    bad = lib_swap.loaded_check(mix, {**own, "libx.so.0": str(other / "libx.so.0")},
                                f"load_backend: loaded CUDA backend from {other}/libggml-cuda.so\n", ["libggml-cuda.so"])
    assert bad["foreign"] == [f"CUDA backend => {other}/libggml-cuda.so", f"libx.so.0 => {other}/libx.so.0"]
    assert not bad["group_loaded"]
    # the group not loaded at all (no device for the backend): said, not guessed
    assert lib_swap.loaded_check(mix, own, "", ["libggml-cuda.so"]) == {"foreign": [], "group_loaded": False}
    # a group file reached through the soname's symlink counts as loaded
    assert lib_swap.loaded_check(mix, own, "", ["libx.so.0.1"])["group_loaded"]
    assert lib_swap.loaded_check(mix, {"libx.so.0": "not found"}, "", [])["foreign"] == ["libx.so.0 => not found"]


def verdicts(**kw: str) -> dict:
    return {k: {"verdict": v} for k, v in kw.items()}


def test_group_verdict_reads_both_mixes():
    differ = {"verdict": "fail", "interval": [1.08, 1.1]}
    carries = lib_swap.group_verdict(verdicts(**{"a+b": "fail", "b+a": "pass"}),
                                     verdicts(**{"a+b": "pass", "b+a": "fail"}), differ)
    assert carries.startswith("carries the difference")
    not_it = lib_swap.group_verdict(verdicts(**{"a+b": "pass", "b+a": "fail"}),
                                    verdicts(**{"a+b": "fail", "b+a": "pass"}), differ)
    assert not_it.startswith("does not carry it")
    # A's programs with B's group run as B, but B's with A's group are not told apart from A: no pattern
    half = lib_swap.group_verdict(verdicts(**{"a+b": "fail", "b+a": "not checked"}),
                                  verdicts(**{"a+b": "pass", "b+a": "not checked"}), differ)
    assert half.startswith("not told")
    # B 7 % faster than A and a mix within 5 % of both: it runs as either, which tells nothing
    both = lib_swap.group_verdict(verdicts(**{"a+b": "pass", "b+a": "pass"}),
                                  verdicts(**{"a+b": "pass", "b+a": "pass"}), differ)
    assert both.startswith("not told")
    same = lib_swap.group_verdict({}, {}, {"verdict": "pass", "interval": [0.99, 1.01]})
    assert same.startswith("no difference to place")
    noisy = lib_swap.group_verdict({}, {}, {"verdict": "not checked", "interval": [0.9, 1.2]})
    assert noisy.startswith("not told: whether B differs")


BENCH_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
double speed(void);
double other(void);
int main(void) {
    Dl_info info;
    dladdr((void *) speed, &info);
    fprintf(stderr, "load_backend: loaded SPEED backend from %s\n", info.dli_fname);
    double s = speed() + other();
    printf("[{\"n_prompt\": 2048, \"n_gen\": 0, \"samples_ts\": [%.1f, %.1f, %.1f]}]\n", s, s, s);
    return 0;
}
"""


def compiled_build(root: Path, tag: str, speed: float, cc: str) -> Path:
    """A bin directory as CMake leaves one: a llama-bench linked with RUNPATH $ORIGIN against libspeed.so (its
    figures: speed) and libother.so (adds nothing)."""
    d = root / tag
    d.mkdir()
    (d / "speed.c").write_text(f"double speed(void) {{ return {speed}; }}\n")
    (d / "other.c").write_text("double other(void) { return 0.0; }\n")
    (d / "bench.c").write_text(BENCH_C)
    for lib in ("speed", "other"):
        subprocess.run([cc, "-shared", "-fPIC", "-o", d / f"lib{lib}.so", d / f"{lib}.c"], check=True)
    subprocess.run([cc, "-o", d / "llama-bench", d / "bench.c", f"-L{d}", "-lspeed", "-lother", "-ldl",
                    "-Wl,-rpath,$ORIGIN"], check=True)
    for src in ("speed.c", "other.c", "bench.c"):
        (d / src).unlink()
    return d


def test_lib_swap_places_a_difference_in_the_library_that_carries_it(tmp_path: Path, capsys: pytest.CaptureFixture):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    a = compiled_build(tmp_path, "a", 100.0, cc)
    b = compiled_build(tmp_path, "b", 110.0, cc)
    out = tmp_path / "swap.json"
    rc = lib_swap.main(["--a", str(a), "--b", str(b), "--group", "speed=libspeed.so", "--group", "other=libother.so",
                        "--rounds", "5", "--cpus", "", "--model", str(tmp_path / "m.gguf"), "--work",
                        str(tmp_path / "work"), "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["median_tps"]["pp"] == {"a": 100.0, "b": 110.0, "a+b.speed": 110.0, "b+a.speed": 100.0,
                                       "a+b.other": 100.0, "b+a.other": 110.0}
    groups = res["halves"]["pp"]["groups"]
    assert groups["speed"]["verdict"].startswith("carries the difference")
    assert groups["other"]["verdict"].startswith("does not carry it")
    assert all(c == {"foreign": [], "group_loaded": True} for c in res["checks"].values())
    # each mix really loaded its own directory's library, as its log says
    log = (tmp_path / "work" / "logs" / "a+b.speed-0.log").read_text()
    assert f"loaded SPEED backend from {tmp_path / 'work' / 'mix' / 'a+b.speed' / 'libspeed.so'}" in log
    assert "speed: carries the difference" in capsys.readouterr().out


def test_lib_swap_refuses_bad_arguments_before_running(tmp_path: Path, capsys: pytest.CaptureFixture):
    a, b = bin_dir(tmp_path, "a"), bin_dir(tmp_path, "b")
    for p in (a, b):
        (p / "llama-bench").chmod(0o755)
    base = ["--a", str(a), "--b", str(b), "--cpus", "", "--model", "m", "--work", str(tmp_path / "w")]
    for extra, says in ((["--group", "x=libx.so*", "--rounds", "3"], "at least 5"),
                        ([], "at least one --group"),
                        (["--group", "x=libx.so", "--group", "x=liby.so"], "one name"),
                        (["--group", "z=libz.so"], "matches libz.so")):
        assert lib_swap.main(base + extra) == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "w" / "logs").exists()
