"""gates.sass_diff: nvdisasm's output read per function and normalised, the comparison, the defines of a configured
build; end to end with nvcc and nvdisasm where this machine has them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gates import sass_diff

SASS = """
	.target	sm_90
//--------------------- .text._Z3addPf
	.section	.text._Z3addPf,"ax",@progbits
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDC.64 R2, c[0x4][0x{off}] ;
        /*0020*/              @!P0 BRA `(.L_x_{label}) ;
        /*0030*/                   EXIT ;
	.section	.text._Z3mulPf,"ax",@progbits
        /*0000*/                   FMUL   R0,  R0, R{reg} ;
        /*0010*/                   EXIT ;
"""


def test_functions_normalise_labels_and_constant_bank_4():
    a = sass_diff.functions(SASS.format(off="90", label="12", reg="1"))
    b = sass_diff.functions(SASS.format(off="a8", label="57", reg="1"))
    assert a == b
    assert a["_Z3addPf"] == ["LDC R1, c[0x0][0x28]", "LDC.64 R2, c[0x4][K]", "@!P0 BRA `(L)", "EXIT"]
    assert a["_Z3mulPf"] == ["FMUL R0, R0, R1", "EXIT"]  # whitespace folded


def test_functions_normalise_the_units_hashes_in_internal_names():
    text = ("\t.section\t.text._Z10cpy_scalarIXadL_ZN42_INTERNAL_e6f3940f_6_cpy_cu_{h}_{n}12cpy_1_scalarIfEEvPKcPc,"
            '"ax",@progbits\n        /*0000*/    CALL.REL `(_ZN42_INTERNAL_e6f3940f_6_cpy_cu_{h}_{n}4stepEv) ;\n')
    a = sass_diff.functions(text.format(h="c54f71df", n="13786"))
    b = sass_diff.functions(text.format(h="dcc84dfd", n="13798"))
    assert a == b and list(a) == ["_Z10cpy_scalarIXadL_ZNN_INTERNALcpy_1_scalarIfEEvPKcPc"]
    assert a[list(a)[0]] == ["CALL.REL `(_ZNN_INTERNALstepEv)"]


def test_compare_names_what_changed():
    a = sass_diff.functions(SASS.format(off="90", label="1", reg="1"))
    b = sass_diff.functions(SASS.format(off="90", label="1", reg="2"))
    b["_Z3newPf"] = ["EXIT"]
    del a["_Z3addPf"]
    a["_Z3oldPf"] = ["NOP", "EXIT"]
    r = sass_diff.compare(a, b)
    assert r["counts"] == {"differs": 1, "only in a": 1, "only in b": 2}
    assert r["functions"]["_Z3mulPf"] == {"state": "differs", "a": 2, "b": 2, "first_difference": 0}
    assert r["functions"]["_Z3oldPf"] == {"state": "only in a", "a": 2}
    assert r["functions"]["_Z3addPf"]["state"] == "only in b"
    # a function that only grew differs where the shorter one ends
    grown = sass_diff.compare({"f": ["A"]}, {"f": ["A", "B"]})["functions"]["f"]
    assert grown == {"state": "differs", "a": 1, "b": 2, "first_difference": 1}
    assert sass_diff.compare({"f": ["A"]}, {"f": ["A"]})["counts"] == {"identical": 1}


def flags_make(build: Path, line: str) -> None:
    d = build / "ggml" / "src" / "ggml-cuda" / "CMakeFiles" / "ggml-cuda.dir"
    d.mkdir(parents=True)
    (d / "flags.make").write_text(f"# CMAKE generated file\n{line}\n\nCUDA_FLAGS = -O3\n")


def test_defines_come_from_the_build_directory(tmp_path: Path):
    flags_make(tmp_path, 'CUDA_DEFINES = -DGGML_BACKEND_DL -DGGML_CUDA_FA_QUANTS=\\"q4_0-q4_0,f16-f16\\" -DX=1')
    assert sass_diff.defines(tmp_path) == ["-DGGML_BACKEND_DL", '-DGGML_CUDA_FA_QUANTS="q4_0-q4_0,f16-f16"', "-DX=1"]
    with pytest.raises(sass_diff.SassError, match="not found"):
        sass_diff.defines(tmp_path / "none")
    other = tmp_path / "other"
    flags_make(other, "CXX_DEFINES = -DX")
    with pytest.raises(sass_diff.SassError, match="no CUDA_DEFINES"):
        sass_diff.defines(other)


def tree(root: Path, body: str) -> Path:
    d = root / "ggml" / "src" / "ggml-cuda"
    d.mkdir(parents=True)
    (root / "ggml" / "include").mkdir()
    (d / "k.cu").write_text("__global__ void kept(float * x) { x[threadIdx.x] *= 2.0f; }\n"
                            f"__global__ void changed(float * x) {{ {body} }}\n")
    return root


def test_sass_diff_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture):
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    try:
        sass_diff.find_nvdisasm()
    except sass_diff.SassError:
        pytest.skip("no nvdisasm")
    a = tree(tmp_path / "a", "x[threadIdx.x] += 1.0f;")
    b = tree(tmp_path / "b", "x[threadIdx.x] += SCALE * x[0];")
    flags_make(tmp_path / "build", "CUDA_DEFINES = -DSCALE=3.0f")
    out = tmp_path / "diff.json"
    assert sass_diff.main(["--a", str(a), "--b", str(b), "--build", str(tmp_path / "build"), "--out", str(out),
                           "k.cu"]) == 0
    r = json.loads(out.read_text())["units"]["k.cu"]
    assert r["counts"] == {"identical": 1, "differs": 1}
    assert r["functions"]["_Z4keptPf"]["state"] == "identical"
    assert r["functions"]["_Z7changedPf"]["state"] == "differs"
    assert "differs: _Z7changedPf" in capsys.readouterr().out
    # a unit neither tree has: refused, exit 2
    assert sass_diff.main(["--a", str(a), "--b", str(b), "--build", str(tmp_path / "build"), "nope.cu"]) == 2
    assert "nope.cu not found" in capsys.readouterr().err


def test_sass_diff_without_nvcc_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sass_diff.main(["--a", "a", "--b", "b", "--build", "x", "k.cu"]) == 2
    assert "nvcc not found" in capsys.readouterr().err
