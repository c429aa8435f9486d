"""A small project with a registry: one patch, one hook with two sites, one gate."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tests.helpers.patches import make_patch
from tests.helpers.project import Proj, make_project

CTX = ("struct ctx {\n    int a;\n};\n\n"
       "int ctx_init(struct ctx * c)\n{\n    c->a = 0;\n    return 0;\n}\n\n"
       "int ctx_run(struct ctx * c)\n{\n    return c->a;\n}\n")
CTX1 = CTX.replace("    int a;\n", "    int a;\n    int window; // opencoti-hook: ctx-window\n").replace(
    "    c->a = 0;\n", "    c->a = 0;\n    c->window = 0; // opencoti-hook: ctx-window\n")
CUDA = "__global__ void k() {\n    int x = 0;\n}\n"

REG = {
    "schema": 1,
    "patches": [{
        "id": "0070", "file": "0070-ctx-window.patch", "title": "ctx window", "bug": "bug-1", "status": "shipped",
        "shipped": "2026-07-01", "build_impact": ["host"], "files": ["up/src/ctx.c"], "hooks": ["ctx-window"],
        "gates": [{"name": "smoke", "needs": ["cpu"], "command": ["true"], "proves": "nothing much"}],
    }],
    "hooks": {"ctx-window": {"patch": "0070", "description": "the window field", "sites": [
        {"file": "up/src/ctx.c", "symbol": "ctx", "line": 1},
        {"file": "up/src/ctx.c", "symbol": "ctx_init", "line": 6}]}},
}


def registry_project(tmp_path: Path) -> Proj:
    """A project over ctx.c and a CUDA file, with 0070 applied and REG as its registry (all in agreement)."""
    p = make_project(tmp_path, {"src/ctx.c": CTX, "ggml/src/ggml-cuda/k.cu": CUDA})
    y = p.root / "vendor" / "vendor.yaml"
    y.write_text(y.read_text().replace("include: [src, include, tools]", "include: [src, ggml]"))
    (p.root / "vendor" / "vendor.lock").unlink()
    shutil.rmtree(p.tree)
    p.run("vendor", "fetch")
    # impact rules for this tiny layout
    (p.root / "registry" / "build.yaml").write_text(
        "artifacts:\n  - name: cuda\n    impact: cuda-dso\n    paths: ['up/ggml/src/ggml-cuda']\n"
        "  - name: lib\n    impact: host\n    paths: ['up/src']\n"
        "profiles:\n  cpu:\n    targets: [lib]\n")
    p.write_patch("0070-ctx-window.patch", make_patch("0070-ctx-window.patch", {"up/src/ctx.c": (CTX, CTX1)},
                                                        "ctx window", "ctx-window"))
    write_reg(p, REG)
    return p


def write_reg(p: Proj, reg: dict) -> None:
    (p.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    p.run("registry", "render")
