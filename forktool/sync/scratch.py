"""--build: a cpu build of the fully applied result in a scratch project (the user's tree is never touched)."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from forktool import proc
from forktool.project import Project
from forktool.sync.trial import PatchResult
from forktool.tree import atomic_write


def run_build(project: Project, scratch: Path, yaml_text: str, results: list[PatchResult], series_text: str,
              progress: Callable[[str], None]) -> dict:
    """cpu build of the fully applied result in a scratch project (the user's tree is never touched)."""
    import importlib.util
    if importlib.util.find_spec("forktool.build") is None:
        return {"status": "not_run", "reason": "forktool.build is not available in this checkout"}
    for sub in ("patches", "registry"):
        if (scratch / sub).exists():
            shutil.rmtree(scratch / sub)
    (scratch / "patches").mkdir(parents=True)
    if project.registry_dir.is_dir():
        shutil.copytree(project.registry_dir, scratch / "registry")
    # same pin as last time: keep the scratch tree, so apply writes only changed files and make stays
    # incremental; another pin: start the tree afresh (the workspace refuses a tree from another upstream)
    pin = scratch / "vendor" / "vendor.yaml"
    if not pin.is_file() or pin.read_text(encoding="utf-8") != yaml_text:
        for stale in ("vendor/llamafile", "vendor/vendor.lock", ".opencoti/state.json"):
            p = scratch / stale
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    atomic_write(scratch / "vendor" / "vendor.yaml", yaml_text.encode())
    for res in results:
        if res.refreshed is not None:
            atomic_write(scratch / "patches" / res.patch.name, res.refreshed.raw)
    atomic_write(scratch / "patches" / "series", series_text.encode())
    env = {"FORKTOOL_ROOT": str(scratch), "FORKTOOL_CACHE": str(project.cache_dir)}
    t0 = time.monotonic()
    steps = (["vendor", "fetch"], ["apply"], ["build", "--profile", "cpu"])
    for step in steps:
        progress(f"scratch build: forktool {' '.join(step)}")
        r = proc.run([sys.executable, "-m", "forktool", *step, "--json"], cwd=scratch, env=env, check=False)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).decode("utf-8", "replace").strip().splitlines()[-20:]
            return {"status": "failed", "step": " ".join(step), "exit_code": r.returncode, "log_tail": tail,
                    "seconds": round(time.monotonic() - t0, 1), "project": str(scratch)}
    built = {"status": "ok", "profile": "cpu", "seconds": round(time.monotonic() - t0, 1), "project": str(scratch)}
    try:
        data = json.loads(r.stdout)
        return {**built, "objects": len(data["objects"]), "outputs": data.get("outputs", {})}
    except (json.JSONDecodeError, KeyError, TypeError):  # built (exit 0), but what it compiled is not known
        return {**built, "objects": None, "outputs": {}}

