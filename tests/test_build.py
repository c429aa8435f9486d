"""Build impact, profiles and plans on synthetic patches (no compiler needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forktool import build as b
from forktool.errors import ConfigError
from forktool.impact import impact_label
from forktool.project import Project
from forktool.series import Patch, parse_patch
from tests.helpers.patches import make_patch
from tests.helpers.project import bare_project


def build_patch(pid: str, slug: str, changes: dict[str, tuple[bytes | None, bytes | None]],
                impact: str = "") -> Patch:
    """A parsed patch (tests.helpers.patches writes its bytes) with an optional Build-Impact trailer."""
    name = f"{pid}-{slug}.patch"
    text = make_patch(name, changes, slug, impact=impact, date="Thu, 01 Jan 1970 00:00:00 +0000")
    return parse_patch(text.encode(), name)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(bare_project(tmp_path, build_yaml=True))


KV = "llama.cpp/src/llama-kv-cache.cpp"
CU = "llama.cpp/ggml/src/ggml-cuda/fattn.cu"


def test_touched_paths_reads_new_changed_and_deleted_files() -> None:
    p = build_patch("0001", "three", {KV: (b"a\n", b"b\n"), "llama.cpp/src/new.h": (None, b"x\n"),
                                     "llama.cpp/common/old.cpp": (b"gone\n", None)})
    assert b.touched_paths(p.raw) == ["llama.cpp/common/old.cpp", KV, "llama.cpp/src/new.h"]


def test_host_only_patch_leaves_the_cuda_dso_alone(project: Project) -> None:
    cfg = b.load_config(project)
    p = build_patch("0089", "two-pass", {KV: (b"a\n", b"b\n"), "llama.cpp/src/llama-context.cpp": (b"a\n", b"c\n")},
                   impact="host")
    imp = b.patch_impact(cfg, p.id, p.name, p.title, p.raw, "host")
    assert imp.impacts == ["host"] and list(imp.artifacts) == ["libllama"]
    assert imp.describe() == "0089: host-only, 2 files -> libllama; CUDA DSO untouched, no restamp"
    assert not imp.declared_mismatch


@pytest.mark.parametrize("path,kind,arts,tail", [
    (CU, "CUDA DSO only", "ggml-cuda", "CUDA DSO rebuild"),
    ("llama.cpp/ggml/src/ggml.c", "host + CUDA DSO", "ggml-base", "CUDA DSO rebuild"),
    ("llama.cpp/ggml/src/ggml-cpu/ops.cpp", "host-only", "ggml-cpu", "CUDA DSO untouched, no restamp"),
    ("llama.cpp/tools/server/server.cpp", "host-only", "tools", "CUDA DSO untouched, no restamp"),
])
def test_impact_by_path(project: Project, path: str, kind: str, arts: str, tail: str) -> None:
    cfg = b.load_config(project)
    p = build_patch("0002", "x", {path: (b"a\n", b"b\n")})
    assert b.patch_impact(cfg, p.id, p.name, p.title, p.raw).describe() == f"0002: {kind}, 1 file -> {arts}; {tail}"


def test_declared_impact_disagreeing_is_flagged_and_unmatched_paths_are_named(project: Project) -> None:
    cfg = b.load_config(project)
    p = build_patch("0003", "x", {CU: (b"a\n", b"b\n"), "README.txt": (None, b"r\n")})
    imp = b.patch_impact(cfg, p.id, p.name, p.title, p.raw, "host")
    assert imp.declared_mismatch and imp.unmatched == ["README.txt"]
    assert "1 file(s) match no artifact rule" in imp.describe() and "declares Build-Impact: host" in imp.describe()


def test_build_yaml_keeps_impact_py_working(project: Project) -> None:
    assert b.load_config(project).feeding([KV, CU])[0] == {"libllama": [KV], "ggml-cuda": [CU]}
    assert impact_label(project, [KV]) == "host"


def test_profiles_inherit_and_unknown_keys_are_refused(project: Project) -> None:
    cfg = b.load_config(project)
    cpu, cuda = cfg.profile("cpu"), cfg.profile("cuda")
    assert cuda.flags[:len(cpu.flags)] == cpu.flags and "-DGGML_CUDA=ON" in cuda.flags
    assert cuda.targets == cpu.targets and cuda.has_cuda and not cpu.has_cuda
    assert "ggml-cuda" not in [a.name for a in cfg.artifacts_in(cpu)]
    path = project.registry_dir / "build.yaml"
    path.write_text(path.read_text().replace("    targets: [ggml-cpu]", "    targets: [ggml-cpu]\n    colour: red"))
    with pytest.raises(ConfigError, match="unknown key"):
        b.load_config(project)


def test_cuda_architectures_are_configurable(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = b.load_config(project)
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in b.configure_flags(cfg.profile("cuda"))
    monkeypatch.setenv("FORKTOOL_CUDA_ARCHITECTURES", "80;90")
    assert "-DCMAKE_CUDA_ARCHITECTURES=80;90" in b.configure_flags(cfg.profile("cuda"))


def test_stamp_names_upstream_top_and_digest() -> None:
    up = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert b.stamp(up, [], False) == ("0c1e5709+pristine", 0)
    commit, n = b.stamp(up, [("0001", "0001-a.patch", "a" * 64), ("0089", "0089-b.patch", "b" * 64)], False)
    assert n == 2 and commit.startswith("0c1e5709+0089.") and len(commit) == len("0c1e5709+0089.") + 8
    one = [("0001", "0001-a.patch", "a" * 64)]
    assert b.stamp(up, [("0001", "0001-a.patch", "c" * 64)], False)[0] != b.stamp(up, one, False)[0]
    assert b.stamp(up, [], True)[0].endswith(".dirty")


def test_may_change_follows_links(project: Project) -> None:
    cfg = b.load_config(project)
    assert cfg.may_change({"libllama"}) == {"libllama", "common", "tools"}
    assert cfg.may_change({"ggml-base"}) == {a.name for a in cfg.artifacts}


def _pretend_built(project: Project, plan: b.Plan) -> None:
    """Write what a finished build leaves behind: outputs, the configure record and the build record."""
    for a in b.load_config(project).artifacts_in(plan.profile):
        for o in a.outputs:
            (plan.build_dir / o).parent.mkdir(parents=True, exist_ok=True)
            (plan.build_dir / o).write_bytes(o.encode())
    (plan.build_dir / "CMakeCache.txt").write_text("")
    src = project.tree / "llama.cpp"
    (plan.build_dir / b.CONFIGURE_RECORD).write_text(json.dumps({
        "flags_key": b._flags_key(plan.profile, plan.flags), "inputs_key": b.cmake_inputs_digest(src),
        "stamp": plan.stamp}))
    (plan.build_dir / b.RECORD).write_text(json.dumps({
        "profile": plan.profile.name, "stamp": plan.stamp, "dirty": plan.dirty,
        "applied": [{"id": p.id, "name": p.name, "sha256": p.sha256, "files": p.files} for p in plan.patches],
        "outputs": {}}))


def test_plan_after_editing_a_host_patch(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    cfg = b.load_config(project)
    cpu = cfg.profile("cpu")
    cuda_p = build_patch("0010", "cuda", {CU: (b"a\n", b"b\n")})
    host_v1 = build_patch("0089", "two-pass", {KV: (b"a\n", b"b\n")})
    first = b.make_plan(project, cfg, cpu, [cuda_p, host_v1], [])
    assert first.first and first.keep == [] and "llama-cli" in first.targets and "ggml-cpu" in first.targets
    _pretend_built(project, first)

    same = b.make_plan(project, cfg, cpu, [cuda_p, host_v1], [])
    assert not same.first and same.changed == [] and same.configure_reason == ""
    assert same.keep == ["ggml-cpu", "ggml-base", "libllama", "common", "tools"]
    assert same.targets == list(cpu.targets)

    host_v2 = build_patch("0089", "two-pass", {KV: (b"a\n", b"c\n")})
    edit = b.make_plan(project, cfg, cpu, [cuda_p, host_v2], [])
    assert edit.changed == ["0089"] and edit.changed_paths == [KV] and edit.artifacts == ["libllama"]
    assert edit.configure_reason == "restamp"
    assert edit.may_change == ["libllama", "common", "tools"] and edit.keep == ["ggml-cpu", "ggml-base"]
    assert edit.targets[:len(cpu.targets)] == list(cpu.targets) and "llama" in edit.targets
    assert "ggml-cpu" not in edit.targets
    text = "\n".join(b.plan_lines(edit))
    assert "0089: host-only, 1 file -> libllama; CUDA DSO untouched, no restamp" in text
    assert "must keep their bytes: ggml-cpu, ggml-base" in text


def test_plan_sees_profile_flag_changes(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    cfg = b.load_config(project)
    p = b.make_plan(project, cfg, cfg.profile("cpu"), [], [])
    _pretend_built(project, p)
    path = project.registry_dir / "build.yaml"
    path.write_text(path.read_text().replace("-DGGML_NATIVE=OFF", "-DGGML_NATIVE=ON"))
    cfg = b.load_config(project)
    again = b.make_plan(project, cfg, cfg.profile("cpu"), [], [])
    assert again.first and again.configure_reason == "profile flags changed"
