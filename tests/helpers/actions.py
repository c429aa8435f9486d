"""A GitHub Actions job run here, step by step, as the runner runs it: each `run:` step in order under
`bash -eo pipefail`, with the runner's files (GITHUB_OUTPUT, GITHUB_ENV, GITHUB_PATH, GITHUB_STEP_SUMMARY), and
`if:`, `env:` and `${{ }}` evaluated for the expressions the workflows use. A `uses:` step is not run: what it
would do (check out, install, restore a cache) is the test's to set up."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)(?![\w.])|(?P<op>==|!=|&&|\|\||!|\(|\)|,)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*))")
_STATUS = ("success", "failure", "always", "cancelled")
_EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.S)


def to_python(expr: str) -> str:
    """The subset of GitHub's expression syntax the workflows use, as a Python expression over _get(name);
    anything else is refused, so a workflow that outgrows this runner fails its test rather than passing wrongly."""
    out, pos, expr = [], 0, expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read {expr[pos:]!r} in the expression {expr!r}")
        pos = m.end()
        if m["str"] is not None:
            out.append(repr(m["str"][1:-1].replace("''", "'")))
        elif m["num"] is not None:
            out.append(m["num"])
        elif m["op"] is not None:
            out.append({"&&": " and ", "||": " or ", "!": " not "}.get(m["op"], m["op"]))
        elif m["name"] in ("true", "false", "null"):
            out.append({"true": "True", "false": "False", "null": "None"}[m["name"]])
        elif m["name"] in _STATUS and expr[pos:].lstrip().startswith("("):
            out.append(f"_{m['name']}")
        else:
            out.append(f"_get({m['name']!r})")
    return "".join(out)


def render(value: Any) -> str:
    """A value as `${{ }}` writes it into text."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def parse_env_file(path: Path) -> dict[str, str]:
    """GITHUB_OUTPUT / GITHUB_ENV: NAME=value lines and NAME<<DELIMITER blocks."""
    out: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.is_file() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            end = lines.index(delim, i + 1)
            out[name] = "\n".join(lines[i + 1:end])
            i = end + 1
            continue
        if line.strip():
            name, _, value = line.partition("=")
            out[name] = value
        i += 1
    return out


@dataclass
class StepRun:
    name: str
    id: str
    outcome: str  # "success", "failure" or "skipped"
    why: str = ""  # why it was skipped: "uses", "the test", "if"
    stdout: str = ""
    stderr: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass
class Job:
    """One job of a workflow (the YAML as loaded, with `on` under "on"), run in workspace."""

    workflow: dict
    job: str
    workspace: Path
    temp: Path
    env: dict[str, str]  # the runner's environment (PATH, HOME, ...)
    inputs: dict[str, Any] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    github: dict[str, Any] = field(default_factory=dict)
    skip: frozenset[str] = frozenset()  # step names the test does not run (an install it made already)
    runs: list[StepRun] = field(default_factory=list)

    def _context(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "secrets": self.secrets,
                "github": {"workspace": str(self.workspace), **self.github},
                "runner": {"temp": str(self.temp), "os": "Linux"},
                "env": self._env_ctx,
                "steps": {r.id: {"outputs": r.outputs, "outcome": r.outcome,
                                 "conclusion": "success" if r.why == "continue-on-error" else r.outcome}
                          for r in self.runs if r.id}}

    def evaluate(self, expr: str) -> Any:
        ctx = self._context()
        failed = any(r.outcome == "failure" and not r.why for r in self.runs)

        def get(name: str) -> Any:
            cur: Any = ctx
            for part in name.split("."):
                if not isinstance(cur, dict) or part not in cur:
                    return None
                cur = cur[part]
            return cur

        names = {"_get": get, "_success": lambda: not failed, "_failure": lambda: failed,
                 "_always": lambda: True, "_cancelled": lambda: False}
        return eval(to_python(expr), {"__builtins__": {}}, names)  # noqa: S307 (the workflow's own text)

    def interpolate(self, text: str) -> str:
        return _EXPR.sub(lambda m: render(self.evaluate(m.group(1))), str(text))

    def _should_run(self, step: dict) -> bool:
        cond = step.get("if")
        if cond is None:
            return bool(self.evaluate("success()"))
        cond = str(cond).strip()
        whole = _EXPR.fullmatch(cond)
        expr = whole.group(1) if whole else cond
        if not any(re.search(rf"\b{f}\s*\(", expr) for f in _STATUS):
            expr = f"success() && ({expr})"
        return bool(self.evaluate(expr))

    def run(self) -> list[StepRun]:
        self.temp.mkdir(parents=True, exist_ok=True)
        env_file, path_file = self.temp / "github_env", self.temp / "github_path"
        summary = self.temp / "step_summary.md"
        for f in (env_file, path_file, summary):
            f.write_text("")
        self._env_ctx: dict[str, str] = {}
        self._env_ctx.update({k: self.interpolate(v) for k, v in (self.workflow.get("env") or {}).items()})
        job = self.workflow["jobs"][self.job]
        self._env_ctx.update({k: self.interpolate(v) for k, v in (job.get("env") or {}).items()})
        for n, step in enumerate(job["steps"]):
            name, sid = str(step.get("name") or step.get("uses") or step.get("run", "")[:40]), str(step.get("id", ""))
            if "uses" in step:
                self.runs.append(StepRun(name, sid, "skipped", "uses"))
                continue
            if name in self.skip:
                self.runs.append(StepRun(name, sid, "skipped", "the test"))
                continue
            if not self._should_run(step):
                self.runs.append(StepRun(name, sid, "skipped", "if"))
                continue
            step_env = {**self._env_ctx, **parse_env_file(env_file),
                        **{k: self.interpolate(v) for k, v in (step.get("env") or {}).items()}}
            out_file = self.temp / f"output-{n}"
            out_file.write_text("")
            extra_path = [p for p in path_file.read_text().splitlines() if p.strip()]
            full = {**self.env, **step_env, "GITHUB_OUTPUT": str(out_file), "GITHUB_ENV": str(env_file),
                    "GITHUB_PATH": str(path_file), "GITHUB_STEP_SUMMARY": str(summary),
                    "GITHUB_WORKSPACE": str(self.workspace), "RUNNER_TEMP": str(self.temp), "CI": "true"}
            full["PATH"] = os.pathsep.join([*reversed(extra_path), self.env.get("PATH", "")])
            script = self.temp / f"step-{n}.sh"
            script.write_text(self.interpolate(step["run"]))
            cwd = self.workspace / str(step.get("working-directory", "."))
            r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=cwd, env=full,
                               capture_output=True, text=True)
            outcome = "success" if r.returncode == 0 else "failure"
            # continue-on-error: the step failed, but the job goes on as if it had not
            why = "" if outcome == "success" or not step.get("continue-on-error") else "continue-on-error"
            self.runs.append(StepRun(name, sid, outcome, why, r.stdout, r.stderr, parse_env_file(out_file)))
        return self.runs

    def step(self, name: str) -> StepRun:
        return next(r for r in self.runs if r.name == name)

    @property
    def failed(self) -> list[StepRun]:
        """The steps that failed the job (a continue-on-error step does not)."""
        return [r for r in self.runs if r.outcome == "failure" and not r.why]
