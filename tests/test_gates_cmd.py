"""forktool gates: a gate that runs the patched build refuses binaries that are not the build of the tree as it is."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.helpers.project import Proj
from tests.helpers.registry import REG, write_reg


def with_bin_gate(p: Proj) -> None:
    reg = copy.deepcopy(REG)
    reg["patches"][0]["gates"] = [{"name": "smoke", "needs": ["cpu"], "command": ["true", "{bin}"],
                                   "proves": "it sees the build"}]
    write_reg(p, reg)
    p.run("apply")


def test_a_gate_needing_the_build_refuses_a_missing_build(rp: Proj):
    with_bin_gate(rp)
    before = rp.state_digest()
    code, _out, err = rp.run("gates", "0070", expect=1)
    assert "needs the cpu build of this tree: build/cpu does not exist" in err
    assert "forktool build --profile cpu" in err
    assert rp.state_digest() == before


def test_a_gate_refuses_binaries_forktool_did_not_build(rp: Proj):
    with_bin_gate(rp)
    (rp.root / "build" / "cpu" / "bin").mkdir(parents=True)
    (rp.root / "build" / "cpu" / "bin" / "tool").write_bytes(b"someone else's binary")
    code, out, err = rp.run("gates", "0070", "--json", expect=1)
    assert "build/cpu has no build record (never built by forktool)" in err
    assert json.loads(out or "{}").get("gates", []) == []  # nothing ran


def test_a_gate_refuses_a_build_of_another_series(rp: Proj, tmp_path: Path):
    with_bin_gate(rp)
    bdir = rp.root / "build" / "cpu"
    (bdir / "bin").mkdir(parents=True)
    from forktool import build as fbuild
    from forktool.project import Project
    project = Project(rp.root)
    cfg = fbuild.load_config(project)
    plan = fbuild.make_plan(project, cfg, cfg.profile("cpu"), [], [])  # the build of the bare upstream: no patch
    record = {"applied": [], "cache": {}, "dirty": [], "flags": plan.flags, "make_seconds": 0.0, "objects": 0,
              "outputs": {}, "profile": "cpu", "seconds": 0.0, "stamp": plan.stamp, "targets": plan.targets}
    (bdir / fbuild.plan.RECORD).write_text(json.dumps(record))
    code, _out, err = rp.run("gates", "0070", expect=1)
    assert f"build/cpu was built for {plan.stamp}, the tree is" in err
    assert "+0070." in err  # the stamp of the series as applied now names its top
