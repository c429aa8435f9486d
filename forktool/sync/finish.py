"""A move's finish: pin, lock, state and registry in one transaction, then verify, plan and the undo record."""

from __future__ import annotations

import difflib
import json

from forktool import backup as bk
from forktool import series, txn, vendor
from forktool.apply import apply_series
from forktool.errors import ForktoolError
from forktool.project import Project
from forktool.series import Patch
from forktool.state import State, state_bytes
from forktool.sync.accept import _repin_text
from forktool.sync.move import (
    Context,
    Progress,
    context,
    done_patches,
    project_manifest,
    reanchoring,
    state_path,
    sync_dir,
    undo_path,
)
from forktool.sync.relocate import relocate_registry
from forktool.tree import (
    REGULAR,
    Entry,
    atomic_write,
    digest,
    scan,
    sha256_bytes,
)
from forktool.workspace import Workspace


def finish(project: Project, st: dict, progress: Progress) -> dict:
    """Move the pin and the lock, record the applied series, relocate the registry's sites: one transaction;
    first every profile compiles what the carried series feeds, or the sync stops at the patch that fails."""
    from forktool.sync import compilegate

    stopped = compilegate.gate(project, st, progress)
    if stopped is not None:
        return stopped
    ctx = context(project, st)
    active = done_patches(ctx, {})
    final = apply_series(active, ctx.new_read)
    yaml_text = project.vendor_yaml.read_text(encoding="utf-8")
    if not reanchoring(st):
        yaml_text = _repin_text(yaml_text, st["component"], ctx.new)
    comps = [ctx.new if c.name == st["component"] else c for c in project.vendor.components]
    d = st["new_pristine_digest"]
    tree_now = scan(project.tree)
    lock = {"components": {c.name: vendor.component_lock_key(c) for c in comps}, "pristine_digest": d,
            "pristine_files": len(ctx.new_manifest),
            "patched": {"series_digest": series.series_digest_of(active), "tree_digest": digest(tree_now),
                        "top": active[-1].id} if active else {}}
    files = {rel: (Entry(sha256_bytes(data), ctx.mode_of(rel)) if data is not None else None)
             for rel, data in final.files.items()}
    applied = [{"id": p.id, "name": p.name, "sha256": p.sha256, "diff_sha256": p.diff_sha256,
                "drift": [x.to_json() for x in final.drift.get(p.id, [])]} for p in active]
    writes = [txn.Write("vendor/vendor.yaml", yaml_text.encode(), REGULAR),
              txn.Write("vendor/vendor.lock", vendor.lock_bytes(lock), REGULAR),
              txn.Write(".opencoti/state.json", state_bytes(State(d, applied, files)), REGULAR)]
    progress("relocating hook sites by symbol")
    registry = _relocated_registry(project, ctx, final.files, active, st)
    if registry is not None:
        writes.append(txn.Write("registry/UPSTREAM_SYNC.yaml", registry[0].encode(), REGULAR))
        writes.append(txn.Write("registry/UPSTREAM_SYNC.md", registry[1].encode(), REGULAR))
    st["stage"] = "finished"
    txn.commit(project.root, sync_dir(project), writes, st)
    project._vendor = None  # vendor.yaml moved: read it again
    return conclude(project, st, progress)


def conclude(project: Project, st: dict, progress: Progress) -> dict:
    """Verify the moved fork (tree, re-export, lock, registry) and plan its cpu build, under the lock the caller
    holds. A sync that verifies is done: its state becomes the undo record. One that does not stays in
    progress (stage finished), so `--continue` verifies again and `--abort` still goes back."""
    from forktool.verification import verify
    progress("verifying the moved series")
    ws = Workspace(project)
    v = verify(ws)
    res = {"stage": "finished", "state": st, "verify": v.to_json(), "build_plan": _build_plan(project, ws)}
    if v.ok:
        _keep_undo(project, st)
    return res


def _build_plan(project: Project, ws: Workspace) -> dict:
    """What rebuilding the moved fork costs (the cpu profile's plan), or why it cannot be said."""
    from forktool import build as b
    try:
        cfg = b.load_config(project)
        dirty = sorted({p for _, p in ws.local_changes()})
        pl = b.make_plan(project, cfg, cfg.profile("cpu"), ws.patches[:len(ws.state.applied)], dirty, ws.current())
    except ForktoolError as e:
        return {"error": str(e)}
    return {"lines": b.plan_lines(pl), "plan": dict(pl.to_json(), built=False)}


def _keep_undo(project: Project, st: dict) -> None:
    """The finished sync's state, with digests of everything it left, becomes undo.json; state.json goes."""
    rec = dict(st, finished={"tree_digest": digest(scan(project.tree)),
                             "files": {rel: e.sha256 for rel, e in project_manifest(project).items()}})
    atomic_write(undo_path(project), json.dumps(rec, indent=1, sort_keys=True).encode())
    state_path(project).unlink(missing_ok=True)


def _relocated_registry(project: Project, ctx: Context, final: dict[str, bytes | None], active: list[Patch],
                        st: dict) -> tuple[str, str] | None:
    """(UPSTREAM_SYNC.yaml, UPSTREAM_SYNC.md) on the new base by the one relocator the trial also uses
    (relocate.relocate_registry), None without a registry; written by the one registry writer (regfile), which
    keeps comments and quoting."""
    from forktool.regcheck import render_md

    def read(rel: str) -> bytes | None:
        return final[rel] if rel in final else ctx.new_read(rel)

    keep = {p.id: p for p in active}
    hooks, reg = relocate_registry(project, read, ctx.new_manifest, f"{st['component']}/", final, keep, None)
    st["hooks"] = hooks
    if reg is None:
        return None
    from forktool.regfile import kept, update_text

    # hook lists and entries follow the markers the rebased patches carry (a resolution may add or drop one)
    reg = kept(project, reg, active, {rel: read(rel) for p in active for rel in p.paths})
    return update_text(reg.path.read_text(encoding="utf-8"), reg, str(reg.path)), render_md(reg)


def registry_diff(project: Project, st: dict) -> list[str]:
    """The registry change the finish applied, as a unified diff against the start's backup."""
    path = project.state_dir / "sync-backups" / st["backups"]["project"]
    try:
        m, c, _ = bk.load_for_restore(path, vendor.objects(project).get)
    except ForktoolError:
        return []
    rel = "registry/UPSTREAM_SYNC.yaml"
    if rel not in m or not (project.root / rel).is_file():
        return []
    a = c[rel].decode("utf-8").splitlines()
    b = (project.root / rel).read_text(encoding="utf-8").splitlines()
    return list(difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}", n=0, lineterm=""))
