"""The sync's compile gate: before it finishes, every profile compiles what the series feeds, or it stops there."""

from __future__ import annotations

import os
from typing import Any

from forktool import txn
from forktool.apply import apply_series
from forktool.build import check
from forktool.project import Project
from forktool.series import Patch, series_digest_of
from forktool.tree import REGULAR, digest, scan


def _culprit(failed: check.CheckResult, patches: list[Patch], tree: str) -> Patch:
    """The patch to stop at: the first that changes the file the error is in, else the first that changes a
    file the failing units are or include, else the last one carried."""
    cause_rel = os.path.relpath(failed.cause.file, tree) if failed.cause and failed.cause.file.startswith(tree) \
        else ""
    for p in patches:
        if cause_rel in p.paths:
            return p
    for p in patches:
        if set(failed.failed) & set(p.paths):
            return p
    return patches[-1]


def gate(project: Project, st: dict, progress: Any) -> dict | None:
    """Compile the carried series on disk; on an error, put the tree back to the patch that causes it (the patches
    before it and its own change) and stop there as at a conflict. None when the sync may finish."""
    from forktool.sync import loop
    from forktool.sync.move import context, done_patches

    ctx = context(project, st)
    active = done_patches(ctx, {})
    if not active:
        return None
    results = check.compile_series(project, active, progress=progress)
    st["compile"] = [{"profile": r.profile, "status": r.status, "reason": r.reason, "units": len(r.units)}
                     for r in results]
    failed = next((r for r in results if r.status == "failed"), None)
    if failed is None:
        # the carried tree is what the finish locks: verify reads these records for the moved series
        sd, td = series_digest_of(active), digest(scan(project.tree))
        for r in results:
            if r.status == "compiled":
                r.series_digest, r.tree_digest = sd, td
                check.record(project, r, len(active))
        return None
    culprit = _culprit(failed, active, str(project.tree))
    order = [p.name for p in ctx.original]
    k = order.index(culprit.name)
    st["done"] = [d for d in st["done"] if order.index(d["name"]) < k]
    st["position"] = k
    overlay = dict(apply_series([*done_patches(ctx, {}), culprit], ctx.new_read).files)
    where = failed.cause.where if failed.cause else failed.log
    rel = os.path.relpath(failed.cause.file, project.tree) if failed.cause and failed.cause.file else ""
    st["stop"] = {"id": culprit.id, "name": culprit.name, "title": culprit.title, "kind": "compile",
                  "compile": {"profile": failed.profile, "cause": failed.cause.text if failed.cause else "",
                              "where": where, "failed": failed.failed, "log": failed.log},
                  "files": [{"file": rel or f, "status": "compile error", "reason": failed.cause.text if failed.cause
                             else "", "hunks": [], "blocks": []} for f in (failed.failed[:1] or [""])]}
    st["stage"] = "stopped"
    writes = loop._writes_for(ctx, overlay)
    writes.append(txn.Write("patches/series", loop._series_text(project, st).encode(), REGULAR))
    txn.commit(project.root, loop.sync_dir(project), writes, st)
    return {"stage": "stopped", "state": st, "written": len(writes)}
