"""The sync's compile gate: at each stop and before the finish, every profile compiles what the carried patches
feed, or the sync stops at the patch that causes the error."""

from __future__ import annotations

import os
from typing import Any

from forktool import txn
from forktool.apply import apply_series
from forktool.build import check
from forktool.project import Project
from forktool.series import Patch, series_digest_of
from forktool.tree import REGULAR, digest, scan


def summary(results: list[check.CheckResult]) -> list[dict]:
    """What a check compiled, per profile, as the sync state keeps it."""
    return [{"profile": r.profile, "status": r.status, "reason": r.reason, "units": len(r.units)} for r in results]


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


def compile_stop(project: Project, failed: check.CheckResult, results: list[check.CheckResult]) -> dict:
    """The `compile` part of a stop and its files: which profile failed, the first real error and where."""
    where = failed.cause.where if failed.cause else failed.log
    rel = os.path.relpath(failed.cause.file, project.tree) if failed.cause and failed.cause.file else ""
    return {"kind": "compile", "checked": summary(results),
            "compile": {"profile": failed.profile, "cause": failed.cause.text if failed.cause else "",
                        "where": where, "failed": failed.failed, "log": failed.log},
            "files": [{"file": rel or f, "status": "compile error", "reason": failed.cause.text if failed.cause
                       else "", "hunks": [], "blocks": []} for f in (failed.failed[:1] or [""])]}


def _check(project: Project, st: dict, progress: Any, keep: bool) -> tuple[list[check.CheckResult], dict | None]:
    """Compile what the carried patches (on disk) feed; on an error, put the tree back to the patch that causes
    it (the patches before it and its own change) and stop there as at a conflict. keep: record a clean check
    for the carried series (the finish's tree is what the lock records)."""
    from forktool.sync import loop
    from forktool.sync.move import context, done_patches

    ctx = context(project, st)
    active = done_patches(ctx, {})
    if not active:
        return [], None
    results = check.compile_series(project, active, progress=progress)
    failed = next((r for r in results if r.status == "failed"), None)
    if failed is None:
        if keep:  # verify reads these records for the moved series
            sd, td = series_digest_of(active), digest(scan(project.tree))
            for r in results:
                if r.status == "compiled":
                    r.series_digest, r.tree_digest = sd, td
                    check.record(project, r, len(active))
        return results, None
    culprit = _culprit(failed, active, str(project.tree))
    order = [p.name for p in ctx.original]
    k = order.index(culprit.name)
    st["done"] = [d for d in st["done"] if order.index(d["name"]) < k]
    st["position"] = k
    overlay = dict(apply_series([*done_patches(ctx, {}), culprit], ctx.new_read).files)
    st["stop"] = {"id": culprit.id, "name": culprit.name, "title": culprit.title,
                  **compile_stop(project, failed, results)}
    st["stage"] = "stopped"
    st["compile"] = summary(results)
    writes = loop._writes_for(ctx, overlay)
    writes.append(txn.Write("patches/series", loop._series_text(project, st).encode(), REGULAR))
    txn.commit(project.root, loop.sync_dir(project), writes, st)
    return results, {"stage": "stopped", "state": st, "written": len(writes)}


def gate(project: Project, st: dict, progress: Any) -> dict | None:
    """Before the finish: the whole carried series compiles for every profile, or the sync stops at the patch that
    fails. None when the sync may finish."""
    results, stopped = _check(project, st, progress, keep=True)
    if stopped is None and results:
        st["compile"] = summary(results)
    elif stopped is None:  # no patch carried (all skipped or upstreamed): nothing was compiled, and it says so
        from forktool.errors import ForktoolError
        from forktool.impact import profile_names

        try:
            names = profile_names(project)
        except ForktoolError:
            names = []
        st["compile"] = [{"profile": n, "status": check.NOT_COMPILED, "units": 0,
                          "reason": "no patch was carried, so the series feeds nothing to compile"} for n in names]
    return stopped


def before_stop(project: Project, st: dict, progress: Any) -> tuple[list[dict], dict | None]:
    """Before a conflict or review stop is offered: the patches carried so far (the tree on disk) compile, or the
    sync stops at the earlier patch that breaks them instead. (what was compiled, the compile stop or None)"""
    results, stopped = _check(project, st, progress, keep=False)
    return summary(results), stopped


def resolved(project: Project, carried: list[Patch], patch: Patch,
             progress: Any) -> tuple[list[check.CheckResult], check.CheckResult | None]:
    """After `--continue`: the units the resolved patch's files feed, on the tree as the maintainer left it (the
    carried patches and the resolved one), for every profile. (the results, the first failed one or None)"""
    results = check.compile_series(project, [*carried, patch], progress=progress, paths=sorted(patch.paths))
    return results, next((r for r in results if r.status == "failed"), None)
