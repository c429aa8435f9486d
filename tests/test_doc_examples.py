"""The manual pages' examples and key lists hold: their console blocks run on a copy of this project and print
what they show (the README's example session is tests/test_readme.py's), and the JSON keys they list are the ones
the commands write."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.project import REPO, Proj, copy_real_project
from tests.helpers.sync import loop_series, new_upstream, resolve

# a backup's time stamp differs from run to run
TIME = re.compile(r"\b\d{8}-\d{6}\b")


def shown_session(page: str, first: str) -> list[tuple[str, list[str]]]:
    """(command, output lines) of the fenced block of PAGE whose first line is FIRST."""
    text = (REPO / page).read_text()
    start = text.index(f"\n{first}\n") + 1
    assert text[text.rindex("\n", 0, start - 1) + 1:].startswith("```"), f"{first!r} does not open a block"
    block = text[start:text.index("\n```", start)].split("\n")
    steps: list[tuple[str, list[str]]] = []
    for line in block:
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def run(root: Path, env: dict[str, str], command: str, extra: dict[str, str] | None = None):
    return subprocess.run(["bash", "-c", command], cwd=root, env={**env, **(extra or {})}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def real_copy(tmp_path: Path, session_cache: Path) -> tuple[Path, dict[str, str]]:
    """A copy of this project (TMP/p) and the environment the shown commands run in."""
    root = copy_real_project(tmp_path / "p")
    env = {k: v for k, v in os.environ.items() if k not in ("FORKTOOL_ROOT", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(FORKTOOL_CACHE=str(session_cache), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
               COLUMNS="1000")
    return root, env


@pytest.mark.integration
def test_safety_md_recover_example_runs_as_shown(tmp_path: Path, session_cache: Path):
    root, env = real_copy(tmp_path, session_cache)
    # the state the example starts from: an apply from 0071 to the top killed while replacing files, then one of
    # its staged files spoiled
    for setup in ("forktool vendor fetch", "forktool apply --upto 0071"):
        assert run(root, env, setup).returncode == 0, setup
    assert run(root, env, "forktool apply", {"FORKTOOL_FAULT": "replacing"}).returncode != 0
    with open(root / ".opencoti" / "txn" / "new" / "1", "ab") as f:
        f.write(b"spoiled\n")
    steps = shown_session("docs/safety.md", "$ forktool status")
    assert [c for c, _ in steps] == ["forktool status", "forktool recover"]
    for command, expected in steps:
        proc = run(root, env, command)
        got = [TIME.sub("<time>", ln.replace(str(root), "/p")).rstrip() for ln in proc.stdout.rstrip("\n").split("\n")]
        assert got == [TIME.sub("<time>", ln) for ln in expected], f"$ {command}\n{proc.stdout}"


def listed_keys(page: str, before: str) -> set[str]:
    """The backticked key names in the parentheses that follow BEFORE in PAGE (`patches[]` read as `patches`)."""
    text = (REPO / page).read_text()
    start = text.index(before) + len(before)
    return {k.removesuffix("[]") for k in re.findall(r"`([a-z_]+(?:\[\])?)`", text[start:text.index(")", start)])}


def test_sync_md_lists_the_keys_of_a_trials_report_json(proj: Proj):
    loop_series(proj)
    commit = new_upstream(proj)
    proj.run("sync", "--to", commit, expect=1)
    report = json.loads((proj.root / "dist" / "sync" / "report.json").read_text())
    assert set(report) == listed_keys("docs/sync.md", "`report.json`: the same facts with stable keys (")


NAMED = r"`(stop\.)?{}(\[\])?`"  # a key as the page names it: `done[]`, `stop.checked[]`


def test_sync_md_lists_the_keys_of_the_loops_json(proj: Proj):
    loop_series(proj)
    commit = new_upstream(proj)
    text = (REPO / "docs" / "sync.md").read_text()
    para = text[text.index("`--json` prints the same facts with stable keys: "):]
    para = para[:para.index("\n\n")]
    stopped = json.loads(proj.run("sync", "--to", commit, "--start", "--json", expect=1)[1])
    for key in [*stopped, *stopped["stop"], *stopped["stop"]["files"][0], *stopped["done"][0]]:
        assert re.search(NAMED.format(re.escape(key)), para), key
    resolve(proj)
    finished = json.loads(proj.run("sync", "--continue", "--json")[1])
    after = para[para.index("after a finish also "):]
    for key in set(finished) - set(stopped):
        assert re.search(NAMED.format(re.escape(key)), after[:after.index(";")]), key


def test_the_manual_names_every_fault_point():
    points = {m for path in (REPO / "forktool").rglob("*.py")
              for m in re.findall(r"\bfault\(\"([a-z-]+)\"\)", path.read_text())}
    manual = (REPO / "docs" / "manual.md").read_text()
    env = manual[manual.index("`FORKTOOL_FAULT`"):]
    assert points and {p for p in points if f"`{p}`" not in env.split("\n\n")[0]} == set()


@pytest.mark.integration
def test_readme_add_a_patch_example_runs_as_shown(tmp_path: Path, session_cache: Path):
    root, env = real_copy(tmp_path, session_cache)
    for setup in ("forktool vendor fetch", "forktool apply"):  # where the README's jobs start: after `make main`
        assert run(root, env, setup).returncode == 0, setup
    steps = shown_session("README.md", '$ forktool new log-window-once --title "kv-residency: log the window line '
                                       'once per context"')
    assert [c.split()[0] for c, _ in steps] == ["forktool", "$EDITOR", "forktool", "forktool"]
    for command, expected in steps:
        if command.startswith("$EDITOR "):
            # the edit its comment describes: a line carrying the new hook's marker, after the sizer's own marker
            path = root / command.split()[1]
            lines = path.read_text().split("\n")
            at = next(i for i, ln in enumerate(lines) if "opencoti-hook: kv-window-sizer" in ln)
            lines.insert(at + 1, "    // once per context // opencoti-hook: log-window-once")
            path.write_text("\n".join(lines))
            continue
        proc = run(root, env, command)
        got = proc.stdout.rstrip("\n").split("\n")
        assert proc.returncode == 0, f"$ {command}\n{proc.stdout}"
        if expected[:1] == ["..."]:  # the page shows the end of the output
            expected, got = expected[1:], got[-(len(expected) - 1):]
        assert got == expected, f"$ {command}\n{proc.stdout}"


def elided_match(shown: list[str], got: list[str]) -> bool:
    """Whether GOT reads as SHOWN, where a line `...` stands for any lines and a line ending ` ...` for any line
    it begins."""
    if not shown:
        return not got
    head, rest = shown[0], shown[1:]
    if head.strip() == "...":
        return any(elided_match(rest, got[k:]) for k in range(len(got) + 1))
    if not got:
        return False
    same = got[0].startswith(head[:-4]) if head.endswith(" ...") else got[0] == head
    return same and elided_match(rest, got[1:])


def test_readme_gates_list_is_what_gates_list_prints(tmp_path: Path):
    root = copy_real_project(tmp_path / "p")
    env = {k: v for k, v in os.environ.items() if k not in ("FORKTOOL_ROOT", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", COLUMNS="1000")
    [shown] = [out for command, out in shown_session("README.md", "$ forktool build --plan")
               if command == "forktool gates --list"]
    proc = run(root, env, "forktool gates --list")
    assert proc.returncode == 0 and elided_match(shown, proc.stdout.rstrip("\n").split("\n")), proc.stdout


def test_caches_md_lists_every_project_cache_kind():
    kinds = {m for path in (REPO / "forktool").rglob("*.py")
             for m in re.findall(r"\bCache\([^,()]+, \"([a-z-]+)\"", path.read_text())}
    text = (REPO / "docs" / "caches.md").read_text()
    assert kinds and {k for k in kinds if f"| `{k}`" not in text and f", `{k}`" not in text} == set()
