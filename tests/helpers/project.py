"""Throwaway forktool projects over a real local git upstream, and copies of this repository's project."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from forktool.tree import digest, scan
from tests.helpers.cli import run_cli

REPO = Path(__file__).resolve().parents[2]  # this repository: its project files are the real series

UPSTREAM = {
    "src/a.c": ("int a(void)\n{\n    return 1;\n}\n\n" + "".join(f"// filler {i}\n" for i in range(40))
                + "int tail(void) { return 0; }\n"),
    "src/b.c": "".join(f"line {i}\n" for i in range(1, 31)),
    "include/c.h": "#pragma once\nint a(void);\n",
    "docs/skip.md": "not vendored\n",
    "tools/run.sh": "#!/bin/sh\necho run\n",
}


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t"})
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_upstream(path: Path, files: dict[str, str]) -> str:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    for rel, text in files.items():
        p = path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        if rel.endswith(".sh"):
            p.chmod(0o755)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "upstream")
    return git(path, "rev-parse", "HEAD")


@dataclass
class Proj:
    root: Path
    upstream: Path

    @property
    def tree(self) -> Path:
        return self.root / "vendor" / "llamafile"

    def run(self, *args: str, expect: int | None = 0) -> tuple[int, str, str]:
        """Run the CLI in-process; returns (code, stdout, stderr)."""
        return run_cli(self.root, list(args), expect)

    def sub(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run the CLI in a subprocess (for crash tests)."""
        e = dict(os.environ, FORKTOOL_ROOT=str(self.root), **(env or {}))
        return subprocess.run([sys.executable, "-m", "forktool", *args], env=e, capture_output=True, text=True)

    def json(self, *args: str, expect: int | None = 0) -> dict:
        code, out, err = self.run(*args, "--json", expect=expect)
        return json.loads(out)

    def digest(self) -> str:
        return digest(scan(self.tree))

    def state_digest(self) -> str:
        """Digest of tree + patches + state: what 'nothing changed' means."""
        parts = [digest(scan(self.tree)), digest(scan(self.root / "patches"))]
        st = self.root / ".opencoti" / "state.json"
        parts.append(st.read_text() if st.exists() else "")
        return "|".join(parts)

    def write_patch(self, name: str, text: str, add_to_series: bool = True) -> Path:
        p = self.root / "patches" / name
        p.write_text(text)
        if add_to_series:
            with open(self.root / "patches" / "series", "a") as f:
                f.write(name + "\n")
        return p

    def edit(self, rel: str, old: str, new: str) -> None:
        p = self.tree / rel
        text = p.read_text()
        assert old in text, f"{old!r} not in {rel}"
        p.write_text(text.replace(old, new, 1))


def make_project(tmp_path: Path, files: dict[str, str]) -> Proj:
    up = tmp_path / "upstream"
    commit = make_upstream(up, files)
    root = tmp_path / "proj"
    (root / "vendor").mkdir(parents=True)
    (root / "patches").mkdir()
    (root / "registry").mkdir()
    shutil.copy(REPO / "registry" / "build.yaml", root / "registry" / "build.yaml")
    (root / "vendor" / "vendor.yaml").write_text(
        "components:\n"
        "  - name: up\n"
        "    kind: git\n"
        f"    url: {up}\n"
        f"    commit: {commit}\n"
        "    include: [src, include, tools]\n"
        "    exclude: ['*.md']\n")
    (root / "patches" / "series").write_text("# test series\n")
    run_cli(root, ["vendor", "fetch"])
    return Proj(root, up)


def bare_project(root: Path, pin: str | None = None, *, build_yaml: bool = False) -> Path:
    """root made a project with an empty series: vendor/vendor.yaml is pin (its text), else this repository's;
    build_yaml: registry/ holds this repository's build.yaml."""
    (root / "vendor").mkdir(parents=True)
    (root / "patches").mkdir()
    (root / "patches" / "series").write_text("")
    if build_yaml:
        (root / "registry").mkdir()
        shutil.copy(REPO / "registry" / "build.yaml", root / "registry" / "build.yaml")
    if pin is None:
        shutil.copy(REPO / "vendor" / "vendor.yaml", root / "vendor" / "vendor.yaml")
    else:
        (root / "vendor" / "vendor.yaml").write_text(pin)
    return root


def copy_real_project(root: Path) -> Path:
    """A copy of this repository's project (pin, lock, series, registry), without its vendored tree or state."""
    for d in ("vendor", "patches", "registry"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("llamafile", ".*"))
    return root
