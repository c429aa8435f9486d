"""The shared test helpers hold: patch bytes written without forktool agree with git and with forktool's exporter."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from forktool.series import diff_file, format_patch, parse_patch, with_files
from tests.helpers.patches import make_patch
from tests.helpers.project import git

LONG = "".join(f"line {i}\n" for i in range(1, 41))
CASES = {
    "one line changed": {"src/a.c": (LONG, LONG.replace("line 20\n", "line twenty\n"))},
    "two hunks": {"src/a.c": (LONG, LONG.replace("line 3\n", "line three\n").replace("line 35\n", "x\ny\n"))},
    "lines added at the end": {"src/a.c": (LONG, LONG + "more\n")},
    "lines removed at the start": {"src/a.c": (LONG, LONG.split("\n", 2)[2])},
    "a new file and a deleted one": {"src/new.h": (None, "#pragma once\nint n(void);\n"), "src/old.c": ("gone\n", None)},
    "no newline at the end, before": {"src/a.c": ("a\nb", "a\nb\nc\n")},
    "no newline at the end, after": {"src/a.c": ("a\nb\n", "a\nc")},
    "no newline on either side": {"src/a.c": ("a\nb", "a\nc")},
    "a one-line file": {"src/one.c": ("x\n", "y\n")},
}


def _repo(root: Path, files: dict[str, str | None]) -> None:
    root.mkdir()
    git(root, "init", "-q")
    for rel, text in files.items():
        if text is not None:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "before", "--allow-empty")


@pytest.mark.parametrize("case", sorted(CASES))
def test_git_applies_the_written_patch_and_gets_the_new_bytes(case: str, tmp_path: Path):
    changes = CASES[case]
    text = make_patch("0001-x.patch", changes, "x", "hook")
    _repo(tmp_path / "r", {rel: old for rel, (old, new) in changes.items()})
    proc = subprocess.run(["git", "apply", "--index", "-"], cwd=tmp_path / "r", input=text.encode(), capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    for rel, (_, new) in changes.items():
        p = tmp_path / "r" / rel
        assert (p.read_text() if p.exists() else None) == new, rel


@pytest.mark.parametrize("case", sorted(CASES))
def test_forktool_parses_it_and_exports_the_same_bytes(case: str):
    changes = CASES[case]
    text = make_patch("0001-x.patch", changes, "x", "hook").encode()
    parsed = parse_patch(text, "0001-x.patch")
    enc = {rel: tuple(t.encode() if t is not None else None for t in pair) for rel, pair in changes.items()}
    exported = with_files(parsed, [fd for rel, (old, new) in sorted(enc.items()) if (fd := diff_file(rel, old, new))])
    assert format_patch(exported) == text


def test_no_test_module_imports_another():
    here = Path(__file__).parent
    offenders = []
    for path in sorted(here.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for n in names:
                last = n.split(".")[-1]
                if n.startswith(("tests.test_", "test_", "tests.conftest", "conftest")) or last.startswith("test_"):
                    offenders.append(f"{path.name}: {n}")
    assert offenders == []
