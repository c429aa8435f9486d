"""The README's commands work as written: its example session runs on a copy of this project and prints what the
README shows; every forktool command and option it names exists; every make target it names is in the Makefile."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import run_cli
from tests.helpers.project import REPO, copy_real_project

README = (REPO / "README.md").read_text()
MARKER = "<!-- example-session"
# what differs from run to run, or moves whenever a patch changes: a backup's time stamp and the digests
VOLATILE = [(re.compile(r"\b\d{8}-\d{6}\b"), "<time>"), (re.compile(r"\b[0-9a-f]{12,64}\b"), "<digest>")]


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced code block."""
    blocks, lang, lines = [], None, []
    for line in text.split("\n"):
        if lang is None and line.startswith("```"):
            lang, lines = line[3:].strip(), []
        elif lang is not None and line.startswith("```"):
            blocks.append((lang, lines))
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def example_session() -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of the console block right after the example-session marker."""
    after = README[README.index(MARKER):]
    lang, lines = fenced_blocks(after)[0]
    assert lang == "console"
    steps: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"output before the first command: {line!r}"
            steps[-1][1].append(line)
    return steps


def normal(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        for pattern, word in VOLATILE:
            line = pattern.sub(word, line)
        out.append(line.rstrip())
    return out


def test_the_readme_has_an_example_session_of_the_real_series():
    steps = example_session()
    commands = [c for c, _ in steps]
    assert commands[0] == "forktool status" and commands[-1] == "forktool verify"
    series = [ln for ln in (REPO / "patches" / "series").read_text().splitlines() if ln and not ln.startswith("#")]
    assert f"tree: clean; top: {series[-1][:4]}; {len(series)}/{len(series)} applied" in steps[0][1]
    hooks = len(yaml.safe_load((REPO / "registry" / "UPSTREAM_SYNC.yaml").read_text())["hooks"])
    assert f"registry: OK ({len(series)} patches, {hooks} hooks, all markers at their sites)" in steps[-1][1]


@pytest.mark.integration
def test_the_example_session_runs_as_written(tmp_path: Path, session_cache: Path):
    root = copy_real_project(tmp_path / "proj")
    env = {k: v for k, v in os.environ.items() if k not in ("FORKTOOL_ROOT", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(FORKTOOL_CACHE=str(session_cache), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
    # where the README's session starts: after `make main`, the series applied
    for setup in ("forktool vendor fetch", "forktool apply"):
        subprocess.run(setup, shell=True, cwd=root, env=env, check=True, capture_output=True)
    for command, expected in example_session():
        proc = subprocess.run(["bash", "-c", command], cwd=root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        got = proc.stdout.rstrip("\n").split("\n") if proc.stdout.strip() else []
        assert proc.returncode == 0, f"$ {command}\n{proc.stdout}"
        assert normal(got) == normal(expected), f"$ {command}\n{proc.stdout}"


def forktool_commands() -> list[list[str]]:
    """Every forktool command line in the README's code blocks, as words (comments and `$ ` prompts dropped)."""
    out = []
    for lang, lines in fenced_blocks(README):
        if lang not in ("sh", "console"):
            continue
        for line in lines:
            line = line[2:] if line.startswith("$ ") else line
            if not line.startswith("forktool "):
                continue
            out.append(shlex.split(line, comments=True))
    return out


SUBCOMMANDS = {"vendor", "backup", "registry", "package"}  # groups whose next word is a command


def test_every_forktool_command_and_option_in_the_readme_exists(tmp_path: Path):
    commands = forktool_commands()
    assert len(commands) >= 10
    for words in commands:
        path = [words[1]]
        if words[1] in SUBCOMMANDS and len(words) > 2 and not words[2].startswith("-"):
            code, out, err = run_cli(tmp_path, [words[1], "--help"])
            if re.search(rf"^\s+{re.escape(words[2])}\s", out + err, re.M):
                path.append(words[2])
        code, out, err = run_cli(tmp_path, [*path, "--help"])
        helptext = out + err
        for word in words[1 + len(path):]:
            if word.startswith("--"):
                assert word.split("=")[0] in helptext, f"forktool {' '.join(path)} has no option {word}"


def test_every_make_target_in_the_readme_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*)(?:\s+[a-z][a-z-]*)*\s*:", (REPO / "Makefile").read_text(), re.M))
    named = set()
    for _lang, lines in fenced_blocks(README):
        for line in lines:
            line = line[2:] if line.startswith("$ ") else line
            if line.startswith("make "):
                named.add(line.split()[1])
    assert named >= {"main", "test"} and named <= targets, named - targets


# manual pages written beside this one; a link to one of them may point at a file this checkout does not have yet
OTHER_PAGES: set[str] = set()  # pages linked before they exist (none now)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    out = set()
    fence = False
    for line in path.read_text().split("\n"):
        fence ^= line.startswith("```")
        if not fence and line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", ["README.md", "docs/manual.md", "docs/architecture.md", "docs/benchmarks.md"])
def test_links_between_the_pages_resolve(page: str):
    src = REPO / page
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", src.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (src.parent / file).resolve() if file else src
        rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
        if not dest.exists():
            if rel not in OTHER_PAGES:
                bad.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor")
    assert bad == []


@pytest.mark.parametrize("page", ["README.md", "docs/manual.md"])
def test_the_build_plan_shown_has_each_shipped_patch_as_the_plan_describes_it(page: str):
    from forktool import build as b
    from forktool.project import Project
    from forktool.series import parse_patch, read_series

    text = (REPO / page).read_text()
    [block] = [lines for _lang, lines in fenced_blocks(text) if lines and lines[0] == "$ forktool build --plan"]
    shown = [ln for ln in block if re.match(r"^\d{4}: ", ln)]
    project = Project(REPO)
    cfg = b.load_config(project)
    described = []
    for entry in read_series(project.series_file):
        p = parse_patch((project.patches_dir / entry.name).read_bytes(), entry.name)
        described.append(b.patch_impact(cfg, p.id, p.name, p.title, p.raw,
                                        p.trailers().get("Build-Impact", "")).describe())
    assert shown == described


@pytest.mark.parametrize("page", ["README.md", "docs/manual.md"])
def test_the_build_stamps_shown_are_the_shipped_series_stamp(page: str):
    from forktool.project import Project
    from forktool.series import read_series, series_digest

    project = Project(REPO)
    names = [entry.name for entry in read_series(project.series_file)]
    digest = series_digest((n, hashlib.sha256((project.patches_dir / n).read_bytes()).hexdigest()) for n in names)
    commit = yaml.safe_load((REPO / "vendor" / "vendor.yaml").read_text())["components"][0]["upstream_commit"]
    stamp = f"{commit[:8]}+{names[-1][:4]}.{digest[:8]}"
    text = (REPO / page).read_text()
    shown = set(re.findall(r"\b[0-9a-f]{8}\+\d{4}\.[0-9a-f]{8}\b", text))
    assert shown == {stamp}
    # the series digest a release's `package verify` names is the same digest, 12 digits of it
    assert set(re.findall(r"\bseries ([0-9a-f]{12})\b", text)) <= {digest[:12]}
