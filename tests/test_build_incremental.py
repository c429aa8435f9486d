"""Real builds of a small CMake tree: the progress read from make's own lines counts what make compiles, output
sums come from a stat index, the CMake inputs digest from the tree manifest."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forktool import build as b
from forktool import cache, proc
from forktool.errors import ConfigError, ForktoolError
from forktool.index import _load as index_load
from forktool.index import hash_indexed, scan_indexed
from forktool.project import Project
from forktool.tree import sha256_bytes
from tests.helpers.build import CMAKE as CACHE_CMAKE
from tests.helpers.build import tiny_project

pytestmark = pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("make") and shutil.which("cc")),
                                reason="needs cmake, make and a C compiler")

# test_build_cache's tree, plus a target demo-cli does not need (`other`); "sp ace.h" puts an escaped space in
# the depfiles
CMAKE = CACHE_CMAKE + "target_include_directories(demo-cli PRIVATE src)\nadd_executable(other tools/other.c)\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    return tiny_project(tmp_path, CMAKE, {
        "src/common.h": "#define ONE 1\n", "src/sp ace.h": "#define TWO 2\n",
        "src/a.c": '#include "common.h"\nint a(void) { return ONE; }\n',
        "src/b.c": '#include "sp ace.h"\nint b(void) { return TWO; }\n',
        "tools/main.c": '#include <stdio.h>\n#include "common.h"\nint a(void);\nint b(void);\n'
                        'int main(void) { printf("%s %d\\n", STAMP, a() + b() + ONE); }\n',
        "tools/other.c": "int main(void) { return 0; }\n"})


def build(project: Project, events: list[b.BuildEvent] | None = None) -> b.BuildResult:
    cfg = b.load_config(project)
    plan = b.make_plan(project, cfg, cfg.profile("tiny"), [], [])
    return b.run_build(project, cfg, plan, 2, events.append if events is not None else None)


def later(path: Path, text: str) -> None:
    """Write text with an mtime after everything built so far, as an editor would."""
    newest = max(p.stat().st_mtime_ns for p in path.parents[3].rglob("*.o")) if list(path.parents[3].rglob("*.o")) else 0
    path.write_text(text)
    if path.stat().st_mtime_ns <= newest:  # a coarse file-system clock
        os.utime(path, ns=(newest + 1_000_000, newest + 1_000_000))


A, B, MAIN, OTHER = ("CMakeFiles/demo.dir/src/a.c.o", "CMakeFiles/demo.dir/src/b.c.o",
                     "CMakeFiles/demo-cli.dir/tools/main.c.o", "CMakeFiles/other.dir/tools/other.c.o")


def objects_on_disk(bdir: Path) -> dict[str, int]:
    return {str(p.relative_to(bdir)): p.stat().st_mtime_ns for p in bdir.rglob("*.o")}


def built_and_counted(project: Project, bdir: Path) -> set[str]:
    """Build; the objects the progress counted are exactly those whose files make wrote, one event each, and
    make's position ends at 100 %."""
    before = objects_on_disk(bdir)
    events: list[b.BuildEvent] = []
    res = build(project, events)
    after = objects_on_disk(bdir)
    written = {o for o, t in after.items() if before.get(o) != t}
    assert set(res.objects) == written and len(res.objects) == len(written)
    objs = [e for e in events if e.kind == "object"]
    assert [e.done for e in objs] == list(range(1, len(written) + 1)) and all(e.total is None for e in objs)
    made = [e.percent for e in events if e.kind != "configure"]
    assert made[0] == 0 and made == sorted(made)  # make's position never goes back
    if written:
        assert made[-1] == 100  # the last link is make's last step
    return written


def test_the_progress_counts_what_make_compiles(project: Project) -> None:
    bdir = project.root / "build" / "tiny"
    src = project.tree / "llama.cpp"
    assert built_and_counted(project, bdir) == {A, B, MAIN}  # a first build: other is not a goal
    assert built_and_counted(project, bdir) == set()  # a no-op

    later(src / "src" / "common.h", "#define ONE 11\n")  # included by a.c and main.c
    assert built_and_counted(project, bdir) == {A, MAIN}

    later(src / "src" / "sp ace.h", "#define TWO 22\n")  # a depfile names it with an escaped space
    assert built_and_counted(project, bdir) == {B}

    (bdir / MAIN).unlink()  # a missing object
    assert built_and_counted(project, bdir) == {MAIN}

    flags = bdir / "CMakeFiles" / "demo.dir" / "flags.make"
    later(flags, flags.read_text())  # the target's flags
    assert built_and_counted(project, bdir) == {A, B}


def test_make_progress_over_several_goals(project: Project) -> None:
    # demo-cli first (it builds demo as a dependency), then demo (already made: its own run says so at once),
    # then other; make's lines count 0-100 % per goal, the whole run's position goes through them once
    bdir = project.root / "build" / "tiny"
    build(project)
    (bdir / MAIN).unlink()
    at = b.MakeProgress(["demo-cli", "demo", "other"])
    seen: list[tuple[str, int, int]] = []

    def feed(line: str) -> None:
        at.feed(line)
        seen.append((line, at.finished, at.overall))

    res = proc.stream(["make", "-j2", "demo-cli", "demo", "other"], cwd=bdir, on_line=feed, check=False)
    assert res.returncode == 0
    assert at.objects == [MAIN, OTHER] and at.finished == 3 and at.overall == 100 and at.goal == ""
    overall = [o for _, _, o in seen]
    assert overall == sorted(overall)
    inner = next(f for line, f, _ in seen if "Built target demo" in line and "demo-cli" not in line)
    assert inner == 0  # demo made inside demo-cli's run is not the goal demo finishing
    assert [f for line, f, _ in seen if "Built target demo-cli" in line] == [1]
    assert [f for line, f, _ in seen if "Built target other" in line] == [3]
    # a line that is not make's, and a goal that never says it was built: the position stays where it was
    at = b.MakeProgress(["all"])
    assert at.feed("[ 40%] Building C object x.o") == "x.o" and at.overall == 40 and at.goal == "all"
    assert at.feed("cc: warning: something") is None and at.overall == 40
    # with -j, a rule started at the same time as a later one may print its smaller position second
    assert at.feed("[ 30%] Building C object w.o") == "w.o" and at.overall == 40
    assert b.MakeProgress([]).overall == 0


def test_output_sums_come_from_the_stat_index(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    old = time.time() - 60
    for name, data in (("lib.so", b"lib v1"), ("tool", b"tool v1")):
        (tmp_path / "bin" / name).write_bytes(data)
        os.utime(tmp_path / "bin" / name, (old, old))
    os.symlink("lib.so", tmp_path / "bin" / "lib.so.0")
    index = tmp_path / "outputs.index"
    rels = ["bin/lib.so", "bin/lib.so.0", "bin/tool", "bin/missing"]
    sums, hashed = hash_indexed(tmp_path, rels, index)
    assert hashed == 3 and set(sums) == {"bin/lib.so", "bin/lib.so.0", "bin/tool"}
    assert sums["bin/lib.so"] == sums["bin/lib.so.0"] == sha256_bytes(b"lib v1")
    assert hash_indexed(tmp_path, rels, index) == (sums, 0)  # nothing changed: nothing hashed

    # same size, mtime put back: the inode change time still differs, so the new bytes are seen
    (tmp_path / "bin" / "tool").write_bytes(b"tool v2")
    os.utime(tmp_path / "bin" / "tool", (old, old))
    again, hashed = hash_indexed(tmp_path, rels, index)
    assert hashed == 1 and again["bin/tool"] == sha256_bytes(b"tool v2") and again["bin/lib.so"] == sums["bin/lib.so"]

    (tmp_path / "bin" / "lib.so").write_bytes(b"lib v2")  # written just now: racy, hashed until the index is older
    fresh, hashed = hash_indexed(tmp_path, rels, index)
    assert hashed == 2 and fresh["bin/lib.so"] == fresh["bin/lib.so.0"] == sha256_bytes(b"lib v2")

    index.write_text("{not json")  # a broken index is ignored, never trusted
    assert hash_indexed(tmp_path, rels, index) == (fresh, 3)
    assert set(index_load(index, tmp_path)[0]) == {"bin/lib.so", "bin/lib.so.0", "bin/tool"}


def test_a_build_hashes_only_the_outputs_that_changed(project: Project) -> None:
    bdir = project.root / "build" / "tiny"
    first = build(project)
    assert set(first.outputs) == {"bin/libdemo.so", "bin/demo-cli"}
    index = index_load(bdir / b.OUTPUTS_INDEX, bdir)[0]
    assert {k: v[4] for k, v in index.items()} == first.outputs
    old = time.time() - 60
    for o in first.outputs:  # as if built a minute ago
        os.utime(bdir / o, (old, old), follow_symlinks=True)
    _, hashed = hash_indexed(bdir, list(first.outputs), bdir / b.OUTPUTS_INDEX)
    assert hashed == 2  # the utime changed their stat: hashed once more, and then known
    assert hash_indexed(bdir, list(first.outputs), bdir / b.OUTPUTS_INDEX)[1] == 0

    later(project.tree / "llama.cpp" / "tools" / "main.c", (project.tree / "llama.cpp" / "tools" / "main.c")
          .read_text().replace("+ ONE", "+ ONE + 1"))
    res = build(project)
    assert res.objects == [MAIN] and res.changed_outputs == ["bin/demo-cli"]
    assert res.outputs["bin/libdemo.so"] == first.outputs["bin/libdemo.so"]
    assert b.read_record(bdir)["outputs"] == res.outputs


def test_cmake_inputs_digest_from_the_manifest_equals_reading_the_files(project: Project, tmp_path: Path) -> None:
    src = project.tree / "llama.cpp"
    (src / "cmake").mkdir()
    (src / "cmake" / "extra.cmake").write_text("set(X 1)\n")
    (src / "src-x").mkdir()  # sorts between src and src/ as a string: the digest orders by path parts
    (src / "src-x" / "CMakeLists.txt").write_text("# x\n")
    (src / "src" / "CMakeLists.txt").write_text("# s\n")
    manifest, _ = scan_indexed(project.tree, tmp_path / "index")
    walked = b.cmake_inputs_digest(src)
    assert b.cmake_inputs_digest(src, manifest) == walked
    (src / "cmake" / "extra.cmake").write_text("set(X 2)\n")
    manifest, _ = scan_indexed(project.tree, tmp_path / "index")
    assert b.cmake_inputs_digest(src, manifest) == b.cmake_inputs_digest(src) != walked


def test_ccache_counters_in_one_call_before_the_build(project: Project, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ccache = shutil.which("ccache")
    if not ccache:
        pytest.skip("ccache is not installed")
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
    before = b.cache_stats(ccache, where=False)
    after = b.cache_stats(ccache)
    assert before is not None and after is not None and before.location == ""
    assert after.location == f"local disk: {tmp_path / 'ccache'}"
    assert re.search(r"\d+ hit\(s\)", after.since(before).describe())


def test_the_record_is_checked_as_written_so_the_next_read_needs_no_jsonschema(
        project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_CACHE", str(tmp_path / "user-cache"))
    with cache.remembering(project.state_dir):  # as during a command
        build(project)
    bdir = project.root / "build" / "tiny"
    probe = ("import sys\nfrom pathlib import Path\nfrom forktool import build as b, cache\n"
             f"with cache.remembering(Path({str(project.state_dir)!r})):\n"
             f"    rec = b.read_record(Path({str(bdir)!r}))\nprint(rec['profile'], 'jsonschema' in sys.modules)\n")
    env = dict(os.environ, FORKTOOL_CACHE=str(tmp_path / "user-cache"))
    assert proc.run([sys.executable, "-c", probe], env=env).out.split() == ["tiny", "False"]

    record = json.loads((bdir / b.RECORD).read_text())
    record["objects"] = -1  # not what the build wrote: checked again, and refused
    (bdir / b.RECORD).write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="objects"):
        b.read_record(bdir)


def test_cmake_runs_beside_the_counters_and_finishes_before_an_error_is_raised(
        project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a launcher whose counters cannot be read: the build stops before make, but only once cmake (started on
    # the other thread) has finished, so nothing writes the build directory after forktool has returned
    tool = tmp_path / "bin" / "sccache"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho 'no server' >&2\nexit 1\n")
    tool.chmod(0o755)
    monkeypatch.setenv("FORKTOOL_LAUNCHER", str(tool))
    with pytest.raises(ForktoolError, match="sccache does not answer"):
        build(project)
    bdir = project.root / "build" / "tiny"
    assert (bdir / "CMakeCache.txt").is_file() and (bdir / "CMakeFiles" / "Makefile2").is_file()
    assert not (bdir / b.RECORD).exists()


def test_a_build_cut_short_holds_nothing_to_its_bytes_next_time(project: Project) -> None:
    # a build that stops after relinking an output (here: make fails on a later target; Ctrl-C or a kill leave the
    # same) leaves bytes its record does not describe: the next plan says so and checks no kept sum against them
    bdir = project.root / "build" / "tiny"
    first = build(project)
    src = project.tree / "llama.cpp"
    a, main = (src / "src" / "a.c").read_text(), (src / "tools" / "main.c").read_text()
    later(src / "src" / "a.c", a.replace("return ONE;", "return ONE + 41;"))
    later(src / "tools" / "main.c", main.replace("int main(void)", "int main(void) syntax error"))
    with pytest.raises(ForktoolError):
        build(project)
    assert (bdir / b.RUNNING).is_file()
    assert sha256_bytes((bdir / "bin/libdemo.so").read_bytes()) != first.outputs["bin/libdemo.so"]
    later(src / "src" / "a.c", a)
    later(src / "tools" / "main.c", main)
    cfg = b.load_config(project)
    plan = b.make_plan(project, cfg, cfg.profile("tiny"), [], [])
    assert plan.first and plan.keep == [] and plan.configure_reason == b.UNFINISHED
    assert any(line.startswith("the last build did not finish") for line in b.plan_lines(plan))
    res = b.run_build(project, cfg, plan, 2)
    assert res.unexpected == [] and res.outputs == first.outputs
    assert not (bdir / b.RUNNING).exists()
    again = b.make_plan(project, cfg, cfg.profile("tiny"), [], [])  # the record describes the outputs again
    assert not again.first and again.keep


def test_an_object_a_cut_short_run_left_newer_than_its_source_is_compiled_again(project: Project) -> None:
    # Ctrl-C does not reach a compile a compiler cache's server runs: it can finish after forktool stopped and
    # the source was edited again, leaving an object newer than the source it does not match. The next build
    # removes every object written since the cut-short run began, so make compiles it from the source as it is
    bdir = project.root / "build" / "tiny"
    build(project)
    a = project.tree / "llama.cpp" / "src" / "a.c"
    obj = bdir / A
    stale = obj.read_bytes()  # compiled from `return ONE;`
    (bdir / b.RUNNING).write_text("a run that was cut short\n")
    later(a, a.read_text().replace("return ONE;", "return ONE + 41;"))
    obj.write_bytes(stale)  # the orphan compile lands after the edit
    os.utime(obj, ns=(a.stat().st_mtime_ns + 10**9, a.stat().st_mtime_ns + 10**9))
    res = build(project)
    assert A in res.objects and not (bdir / b.RUNNING).exists()
    out = subprocess.run([str(bdir / "bin" / "demo-cli")], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "45"  # a() + b() + ONE = 42 + 2 + 1: the edited source, not the stale object
    # without a cut-short run, an object newer than its source is make's to trust, and forget_unfinished keeps it
    assert b.forget_unfinished(bdir) == []
