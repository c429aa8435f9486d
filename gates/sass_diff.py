"""Whether two source trees give a CUDA translation unit the same machine code: each tree's unit compiled to a cubin
at one fixed path (so nothing derived from the path differs), disassembled by nvdisasm, and compared function by
function after what moves with unrelated code is normalised: branch labels (numbered across the file), offsets
into constant bank 4 (the module's own constants, laid out across the file) and the hashes of the unit's text that
names of internal linkage carry.

Gate b measures the resident path's speed; this says, without a GPU, which of the kernels it runs the series left as
upstream compiles them. The flags are the ones a configured build directory records (its ggml-cuda `flags.make`:
the defines), with -O3, -use_fast_math and -extended-lambda as ggml's CMake adds them.

    python -m gates.sass_diff --a build/host/upstream/src/llama.cpp --b vendor/llamafile/llama.cpp \\
        --build build/cuda template-instances/fattn-mma-f16-instance-ncols1_16-ncols2_4.cu [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections import defaultdict
from pathlib import Path

RE_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
RE_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
RE_LABEL = re.compile(r"`\(\.L_x_\d+\)")
RE_CBANK4 = re.compile(r"c\[0x4\]\[0x[0-9a-f]+\]")
# a name of internal linkage, mangled with hashes of the translation unit's text (a header that changed anywhere moves
# them): "42_INTERNAL_e6f3940f_6_cpy_cu_c54f71df_13786" and the digits that follow it (the next name's length)
RE_INTERNAL = re.compile(r"\d+_INTERNAL_[0-9a-f]{8}_\d+_\w+?_[0-9a-f]{8}_\d+")


class SassError(Exception):
    pass


def functions(sass: str) -> dict[str, list[str]]:
    """{mangled name: its instructions, normalised} from nvdisasm's output: whitespace folded, branch labels,
    constant bank 4 offsets and the unit's hashes in names of internal linkage replaced by placeholders."""
    out: dict[str, list[str]] = defaultdict(list)
    name = None
    for line in sass.splitlines():
        m = RE_SECTION.match(line)
        if m:
            name = RE_INTERNAL.sub("N_INTERNAL", m.group(1))
            continue
        m = RE_INSN.match(line)
        if m and name is not None:
            insn = RE_CBANK4.sub("c[0x4][K]", RE_LABEL.sub("`(L)", " ".join(m.group(1).split())))
            insn = RE_INTERNAL.sub("N_INTERNAL", insn)
            out[name].append(insn)
    return dict(out)


def compare(a: dict[str, list[str]], b: dict[str, list[str]]) -> dict:
    """Per function: identical, differs (with both instruction counts), or only on one side."""
    rows = {}
    for name in sorted(set(a) | set(b)):
        if name not in b:
            rows[name] = {"state": "only in a", "a": len(a[name])}
        elif name not in a:
            rows[name] = {"state": "only in b", "b": len(b[name])}
        else:
            same = a[name] == b[name]
            rows[name] = {"state": "identical" if same else "differs", "a": len(a[name]), "b": len(b[name])}
            if not same:  # the first instruction that differs (or where the shorter one ends)
                pairs = zip(a[name], b[name], strict=False)
                rows[name]["first_difference"] = next((i for i, (x, y) in enumerate(pairs) if x != y),
                                                      min(len(a[name]), len(b[name])))
    counts: dict[str, int] = defaultdict(int)
    for r in rows.values():
        counts[r["state"]] += 1
    return {"counts": dict(counts), "functions": rows}


def defines(build: Path) -> list[str]:
    """The CUDA defines a configured build compiles ggml-cuda with (its flags.make's CUDA_DEFINES)."""
    flags = build / "ggml" / "src" / "ggml-cuda" / "CMakeFiles" / "ggml-cuda.dir" / "flags.make"
    if not flags.is_file():
        raise SassError(f"{flags} not found: --build names a build directory configured with CUDA "
                        f"(`forktool build --profile cuda` makes build/cuda)")
    for line in flags.read_text().splitlines():
        if line.startswith("CUDA_DEFINES = "):
            return shlex.split(line.removeprefix("CUDA_DEFINES = "))
    raise SassError(f"{flags} has no CUDA_DEFINES line")


def find_nvdisasm() -> str:
    """nvdisasm on PATH, beside nvcc, or from the nvidia-cuda-nvdisasm wheel in this Python's site-packages."""
    found = shutil.which("nvdisasm")
    nvcc = shutil.which("nvcc")
    if not found and nvcc:
        beside = Path(nvcc).resolve().parent / "nvdisasm"
        found = str(beside) if beside.is_file() else None
    if not found:
        for p in sorted(Path(sysconfig.get_paths()["purelib"]).glob("nvidia/cu*/bin/nvdisasm")):
            found = str(p)
    if not found:
        raise SassError("nvdisasm not found: install the CUDA toolkit's, or `pip install nvidia-cuda-nvdisasm`")
    return found


def cuda_includes() -> list[str]:
    """The toolkit's include directories: beside nvcc, and cuBLAS's from the nvidia wheels forktool's cuda extra
    installs (ggml-cuda's headers include cublas_v2.h)."""
    out = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        out.append(f"-isystem={Path(nvcc).resolve().parent.parent / 'include'}")
    out += [f"-isystem={p}" for p in sorted(Path(sysconfig.get_paths()["purelib"]).glob("nvidia/cu*/include"))]
    return out


def disassemble(tree: Path, unit: str, defs: list[str], arch: str, nvdisasm: str, fixed: Path) -> str:
    """tree's ggml/src/ggml-cuda/UNIT compiled at `fixed` (tree's ggml/ copied there) to a cubin, disassembled."""
    src = tree / "ggml"
    if not (src / "src" / "ggml-cuda" / unit).is_file():
        raise SassError(f"{src / 'src' / 'ggml-cuda' / unit} not found: --a and --b name llama.cpp source trees "
                        f"and units are paths under ggml/src/ggml-cuda")
    shutil.rmtree(fixed, ignore_errors=True)
    shutil.copytree(src, fixed / "ggml")
    cubin = fixed / "unit.cubin"
    argv = ["nvcc", *defs, f"-I{fixed / 'ggml' / 'src'}", f"-I{fixed / 'ggml' / 'include'}", *cuda_includes(),
            "-O3", "-DNDEBUG", f"-arch={arch}", "-use_fast_math", "-extended-lambda", "-std=c++17", "-cubin",
            "-o", str(cubin), str(fixed / "ggml" / "src" / "ggml-cuda" / unit)]
    for step in (argv, [nvdisasm, "-c", str(cubin)]):
        p = subprocess.run(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            raise SassError(f"{Path(step[0]).name} failed (exit {p.returncode}) on {unit} of {tree}: "
                            f"{p.stdout.strip()[-600:]}")
    return p.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gates.sass_diff", description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="llama.cpp source tree A (e.g. upstream's)")
    ap.add_argument("--b", type=Path, required=True, help="llama.cpp source tree B (e.g. the patched vendor tree)")
    ap.add_argument("--build", type=Path, required=True, help="a build directory configured for CUDA: its defines")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--out", type=Path, help="write the comparison here as JSON")
    ap.add_argument("units", nargs="+", help="translation units under ggml/src/ggml-cuda")
    a = ap.parse_args(argv)
    if shutil.which("nvcc") is None:
        print("gates.sass_diff: nvcc not found (a CUDA toolkit is needed to compile the units)", file=sys.stderr)
        return 2
    res: dict = {"a": str(a.a), "b": str(a.b), "arch": a.arch, "units": {}}
    try:
        defs, nvdisasm = defines(a.build), find_nvdisasm()
        with tempfile.TemporaryDirectory(prefix="sass-diff-") as tmp:
            fixed = Path(tmp) / "src"
            for unit in a.units:
                sides = {side: functions(disassemble(tree, unit, defs, a.arch, nvdisasm, fixed))
                         for side, tree in (("a", a.a), ("b", a.b))}
                res["units"][unit] = compare(sides["a"], sides["b"])
    except (SassError, OSError) as e:
        print(f"gates.sass_diff: {e}", file=sys.stderr)
        return 2
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    for unit, r in res["units"].items():
        print(f"{unit}: " + ", ".join(f"{n} {state}" for state, n in sorted(r["counts"].items())))
        for name, row in r["functions"].items():
            if row["state"] != "identical":
                sizes = " / ".join(str(row[k]) for k in ("a", "b") if k in row)
                print(f"  {row['state']}: {name} ({sizes} instructions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
