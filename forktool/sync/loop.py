"""Moving the fork to another upstream as a resumable operation: start, stop at a conflict, continue/skip, abort."""

from __future__ import annotations

import difflib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from forktool import backup as bk
from forktool import schema, series, txn, vendor
from forktool.apply import apply_series
from forktool.authoring import with_derived_trailers
from forktool.errors import ConfigError, DirtyTreeError, ForktoolError, UsageError
from forktool.project import Component, Project
from forktool.registry import Registry
from forktool.series import Patch
from forktool.state import State, state_bytes, sync_state_path
from forktool.sync.accept import _repin_text, accept_journal, comment_out
from forktool.sync.fetch import fetch_target, resolve_spec
from forktool.sync.relocate import relocate_registry
from forktool.sync.rerere import Memory
from forktool.sync.trial import LABELS, HunkSide, OldSide, _conflict_blocks, classify, rebase
from forktool.tree import (
    REGULAR,
    SYMLINK,
    Entry,
    Manifest,
    atomic_write,
    diff_manifests,
    digest,
    manifest_to_json,
    scan,
    sha256_bytes,
)
from forktool.workspace import Workspace

STATE_VERSION = 1
TREE = "vendor/llamafile"
# what the loop keeps of the project besides the tree: restored byte for byte by --abort
PROJECT_FILES = ("vendor/vendor.yaml", "vendor/vendor.lock", ".opencoti/state.json",
                 "registry/UPSTREAM_SYNC.yaml", "registry/UPSTREAM_SYNC.md")
CONFLICT_PREFIXES = (b"<<<<<<< ", b"||||||| ", b">>>>>>> ")
DROPPED = ("skipped", "upstreamed")
Progress = Callable[[str], None]


def sync_dir(project: Project) -> Path:
    """Beside the apply journal: the loop's state file and its own journal (txn/)."""
    return sync_state_path(project.state_dir).parent


def state_path(project: Project) -> Path:
    return sync_state_path(project.state_dir)


def undo_path(project: Project) -> Path:
    """The last finished sync, with what it left behind: `--undo` puts the project back until the next start."""
    return sync_dir(project) / "undo.json"


def report_path(project: Project) -> Path:
    """Every detail of the last finish (patches, hook sites, registry diff, verify, build plan)."""
    return sync_dir(project) / "report.md"


def write_report(project: Project, text: str) -> None:
    atomic_write(report_path(project), text.encode())


def memory(project: Project) -> Memory:
    return Memory(sync_dir(project) / "rerere")


def _preimage(project: Project, rel: str) -> Path:
    """The conflicted text a stop wrote into the tree, kept to learn the resolution from later."""
    return sync_dir(project) / "preimage" / sha256_bytes(rel.encode())


def read_state(project: Project) -> dict | None:
    """The recorded sync, checked against its schema (forktool/schemas.py) before anything uses it."""
    st = schema.load_sync_state(state_path(project), project.state_dir)
    if st is None or st["stage"] == "aborted":
        return None
    if st["component"] not in {c.name for c in project.vendor.components}:
        raise ConfigError(f"the recorded sync moves component {st['component']!r}, which vendor/vendor.yaml does "
                          "not name", where=f"{state_path(project)}: component",
                          hint=schema.sync_state_hint(state_path(project)))
    return st


def has_backups(project: Project, st: dict) -> bool:
    """False for a stop recorded elsewhere (a CI branch): this checkout has none of its backups."""
    b = st.get("backups", {})
    return bool(b) and (project.backups_dir / b.get("tree", "")).is_dir() and \
        (project.state_dir / "sync-backups" / b.get("project", "")).is_dir()


# ---------------------------------------------------------------- the upstreams and the series


@dataclass
class Context:
    project: Project
    st: dict
    new_manifest: Manifest
    original: list[Patch]  # the series as it was at start, on the pinned upstream
    new: Component

    def new_read(self, rel: str) -> bytes | None:
        e = self.new_manifest.get(rel)
        return None if e is None else vendor.objects(self.project).get(e.sha256)

    def old_read(self, rel: str) -> bytes | None:
        return vendor.pristine_bytes(self.project, self._old, rel)

    def mode_of(self, rel: str) -> str:
        e = self.new_manifest.get(rel)
        return e.mode if e is not None else REGULAR

    def __post_init__(self) -> None:
        self._old = _pristine(self.project, self.st["old_pristine_digest"])


def _pristine(project: Project, d: str) -> Manifest:
    p = vendor.pristine_path(project, d)
    if not p.is_file():
        raise ForktoolError(f"pristine manifest {d[:12]} is not in the cache", where=str(p),
                            hint="run `forktool sync --abort`, or the start again with the same FORKTOOL_CACHE")
    return vendor.load_pristine_manifest(p)


def _context(project: Project, st: dict) -> Context:
    original = [series.parse_patch(text.encode(), name) for name, text in st["original"]]
    return Context(project, st, _pristine(project, st["new_pristine_digest"]), original, _component(st["to"]))


def _component(raw: dict[str, Any]) -> Component:
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return Component(**fields)


def _disk_patch(project: Project, name: str, pending: dict[str, bytes]) -> Patch:
    data = pending[name] if name in pending else (project.patches_dir / name).read_bytes()
    return series.parse_patch(data, name)


def _done_patches(ctx: Context, pending: dict[str, bytes]) -> list[Patch]:
    """The patches already carried across, as they now stand in patches/ (dropped ones left out)."""
    return [_disk_patch(ctx.project, d["name"], pending) for d in ctx.st["done"] if d["status"] not in DROPPED]


def reanchoring(st: dict) -> bool:
    """True for `apply --reanchor` carrying the series onto its own edited patches (the upstream stays)."""
    return st.get("kind") == "reanchor"


def _series_text(project: Project, st: dict) -> str:
    """patches/series with the dropped patches commented out (their files are kept)."""
    why = {}
    for d in st["done"]:
        if d["status"] not in DROPPED:
            continue
        if reanchoring(st):
            what = "already made by the patches below it" if d["status"] == "upstreamed" else d["status"]
            why[d["name"]] = f"{what} in the re-anchoring (forktool apply --reanchor)"
        else:
            why[d["name"]] = f"{d['status']} in the sync to {st['to_spec']} (forktool sync)"
    return comment_out(project.series_file.read_text(encoding="utf-8"), why)


# ---------------------------------------------------------------- moving the tree


def _tree_writes(project: Project, want: dict[str, tuple[bytes | None, str]], current: Manifest) -> list[txn.Write]:
    """Writes (paths from the project root) that make the tree hold `want`, only where bytes or modes differ."""
    writes = []
    for rel in sorted(set(want) | set(current)):
        data, mode = want.get(rel, (None, REGULAR))
        have = current.get(rel)
        if (Entry(sha256_bytes(data), mode) if data is not None else None) != have:
            writes.append(txn.Write(f"{TREE}/{rel}", data, mode))
    return writes


def _writes_for(ctx: Context, overlay: dict[str, bytes | None]) -> list[txn.Write]:
    """Writes that make the tree hold the new upstream with overlay on top; unchanged files are not read."""
    current = scan(ctx.project.tree)
    store = vendor.objects(ctx.project)
    writes = []
    for rel in sorted(set(ctx.new_manifest) | set(overlay) | set(current)):
        if rel in overlay:
            data = overlay[rel]
            want = Entry(sha256_bytes(data), ctx.mode_of(rel)) if data is not None else None
        else:
            want = ctx.new_manifest.get(rel)
            data = None
        if want == current.get(rel):
            continue
        if rel not in overlay and want is not None:
            data = store.get(want.sha256)
        writes.append(txn.Write(f"{TREE}/{rel}", data, want.mode if want else REGULAR))
    return writes


# ---------------------------------------------------------------- the run: apply in order until a conflict


def _run(project: Project, st: dict, pending: dict[str, bytes], progress: Progress) -> dict:
    """Carry the patches from st['position'] on, stop at the first conflict or finish; one transaction."""
    ctx = _context(project, st)
    done = _done_patches(ctx, pending)
    overlay: dict[str, bytes | None] = dict(apply_series(done, ctx.new_read).files)

    def cur(rel: str) -> bytes | None:
        return overlay[rel] if rel in overlay else ctx.new_read(rel)

    old: OldSide | HunkSide = HunkSide() if reanchoring(st) else OldSide(ctx.old_read)
    for p in ctx.original[:st["position"]]:
        old.step(p)
    labels = _labeller(ctx, done)
    mem = memory(project)
    shutil.rmtree(sync_dir(project) / "preimage", ignore_errors=True)
    st["stop"] = None
    for p in ctx.original[st["position"]:]:
        progress(f"carrying {p.name} across")
        pre, post, err = old.step(p)
        c = classify(p, pre, post, err, cur, labels)
        row = {"id": p.id, "name": p.name, "status": c.status, "drift": c.drift,
               "files": [{"file": f.path, "status": f.status} for f in c.files if f.status != "clean"]}
        again = None
        if c.status not in ("conflict", "upstreamed"):
            again = rebase(p, {rel: cur(rel) for rel in c.after}, c.after, ctx.mode_of)
        if c.status == "conflict" or (c.status == "merged" and st.get("review_merged", True)):
            overlay.update(c.after)
            # each file as the stop leaves it before any memory: what the resolutions are learnt against
            images: dict[str, bytes | None] = {**c.after, **c.conflicted}
            remembered: dict[str, int] = {}
            for rel, data in c.conflicted.items():
                data, remembered[rel] = mem.replay(data)
                overlay[rel] = data
            whole = []
            for rel in mem.file_names(p.id):
                image = images[rel] if rel in images else cur(rel)
                again_file = mem.get_file(p.id, rel, image) if image is not None else None
                if again_file is not None and again_file != cur(rel):
                    images[rel] = image
                    overlay[rel] = again_file
                    whole.append(rel)
            for rel, image in images.items():
                if image is not None:
                    atomic_write(_preimage(project, rel), image)
            st["stop"] = {"id": p.id, "name": p.name, "title": p.title, "kind": c.status,
                          "files": [{"file": f.path, "status": f.status, "reason": f.reason,
                                     "hunks": [h for h in f.hunks if h["how"] != "exact"],
                                     "blocks": [b["line"] for b in _conflict_blocks(overlay[f.path] or b"")]
                                     if f.path in c.conflicted else [],
                                     "remembered": remembered.get(f.path, 0)}
                                    for f in c.files if f.status != "clean"], "remembered_files": sorted(whole)}
            if again is not None:  # a merge to review: its hunks, and the form that --continue keeps as merged
                merged = {f.path for f in c.files if f.status == "merged"}
                st["stop"]["review"] = series.with_files(again, [fd for fd in again.files
                                                                 if fd.path in merged]).raw.decode("utf-8", "replace")
                st["stop"]["merged_diff_sha256"] = again.diff_sha256
            break
        if again is not None and again.raw != _disk_patch(project, p.name, pending).raw:
            pending[p.name] = again.raw
        if again is not None:
            done.append(series.parse_patch(pending.get(p.name) or again.raw, p.name))
        overlay.update(c.after)
        st["done"].append(row)
        st["position"] += 1
    st["stage"] = "stopped" if st["stop"] else "finishing"
    writes = _writes_for(ctx, overlay)
    writes += [txn.Write(f"patches/{name}", data, REGULAR) for name, data in sorted(pending.items())]
    writes.append(txn.Write("patches/series", _series_text(project, st).encode(), REGULAR))
    writes = [w for w in writes if not _same_file(project.root, w)]
    txn.commit(project.root, sync_dir(project), writes, st)
    if st["stop"]:
        return {"stage": "stopped", "state": st, "written": len(writes)}
    return _finish(project, st, progress)


def _labeller(ctx: Context, done: list[Patch]) -> Callable[[str], tuple[str, str, str]]:
    """The diff3 labels for one file: which earlier patches each side already holds, and which of them a person
    resolved, so `new upstream` never names text that is partly the maintainer's own. done grows as the loop
    carries patches, so the labels always name the patches carried before the one being merged."""
    how = {d["id"]: d["status"] for d in ctx.st["done"]}

    def labels(rel: str) -> tuple[str, str, str]:
        if reanchoring(ctx.st):
            below = [p.id + (" as you resolved it" if how.get(p.id) == "resolved" else "")
                     for p in done if rel in p.paths]
            return ("patch (as written)", "the context it was written against",
                    "the tree now" + (f" (with {', '.join(below)})" if below else ""))
        old_ids = [p.id for p in ctx.original[:ctx.st["position"]] if rel in p.paths]
        new_ids = [p.id + (" as you resolved it" if how.get(p.id) == "resolved" else "")
                   for p in done if rel in p.paths]
        return (LABELS[0], LABELS[1] + (f" + {', '.join(old_ids)}" if old_ids else ""),
                LABELS[2] + (f" + {', '.join(new_ids)}" if new_ids else ""))
    return labels


def _same_file(root: Path, w: txn.Write) -> bool:
    if not w.path.startswith("patches/"):
        return False
    p = root / w.path
    return p.is_file() and w.data is not None and p.read_bytes() == w.data


# ---------------------------------------------------------------- finish


def _finish(project: Project, st: dict, progress: Progress) -> dict:
    """Move the pin and the lock, record the applied series, relocate the registry's sites: one transaction."""
    ctx = _context(project, st)
    active = _done_patches(ctx, {})
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
                             "files": {rel: e.sha256 for rel, e in _project_manifest(project).items()}})
    atomic_write(undo_path(project), json.dumps(rec, indent=1, sort_keys=True).encode())
    state_path(project).unlink(missing_ok=True)


def _relocated_registry(project: Project, ctx: Context, final: dict[str, bytes | None], active: list[Patch],
                        st: dict) -> tuple[str, str] | None:
    """(UPSTREAM_SYNC.yaml, UPSTREAM_SYNC.md) on the new base by the one relocator the trial also uses
    (relocate.relocate_registry), None without a registry; the YAML keeps its comments and layout."""
    from forktool.regcheck import render_md

    def read(rel: str) -> bytes | None:
        return final[rel] if rel in final else ctx.new_read(rel)

    keep = {p.id: p for p in active}
    hooks, reg = relocate_registry(project, read, ctx.new_manifest, f"{st['component']}/", final, keep, None)
    st["hooks"] = hooks
    if reg is None:
        return None
    return _registry_text(reg.path.read_text(encoding="utf-8"), reg), render_md(reg)


def _registry_text(text: str, reg: Registry) -> str:
    """The registry file with only each hook's `sites:` list rewritten, so comments and layout stay; the
    whole file dumped again when that does not give exactly `reg` (e.g. patches were dropped)."""
    from forktool import registry as rg
    lines = text.split("\n")
    out: list[str] = []
    hook = None
    i = 0
    in_hooks = False
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("hooks:"):
            in_hooks = True
        elif in_hooks and ln.startswith("  ") and not ln.startswith("   ") and ln.rstrip().endswith(":"):
            hook = ln.strip()[:-1].strip("'\"")
        if in_hooks and hook in reg.hooks and ln.rstrip() == "    sites:":
            out.append(ln)
            i += 1
            while i < len(lines) and (lines[i].startswith("    - ") or lines[i].startswith("      ")):
                i += 1
            for site in reg.hooks[hook].sites:
                item = {"file": site.file, "symbol": site.symbol, "line": site.line}
                dumped = yaml.safe_dump([{k: v for k, v in item.items() if v is not None}], sort_keys=False,
                                        width=110).rstrip("\n").split("\n")
                out += ["    " + d for d in dumped]
            continue
        out.append(ln)
        i += 1
    again = "\n".join(out)
    try:
        tmp = _load_via_file(again, reg.path)
    except ForktoolError:
        return rg.dump(reg)
    return again if rg.dump(tmp) == rg.dump(reg) else rg.dump(reg)


def _load_via_file(text: str, path: Path) -> Registry:
    from forktool import registry as rg
    tmp = path.with_name(f".{path.name}.check")
    atomic_write(tmp, text.encode())
    try:
        return rg.load(tmp)
    finally:
        tmp.unlink()


# ---------------------------------------------------------------- the commands


def recover(project: Project) -> list[str]:
    """Finish every interrupted transaction a sync can leave, under the project lock the caller holds: the tree's
    (apply's journal), the loop's (.opencoti/sync/txn) and --accept's (.opencoti/sync-txn)."""
    notes = [txn.recover(project.tree, project.state_dir, "state"),
             txn.recover(project.root, sync_dir(project), "sync-state"),
             txn.recover(project.root, accept_journal(project))]
    return [n for n in notes if n]


def _recover(project: Project, progress: Progress) -> None:
    for note in recover(project):
        progress(note)


def _project_manifest(project: Project) -> Manifest:
    out: Manifest = {}
    rels = [r for r in PROJECT_FILES if (project.root / r).is_file()]
    rels += sorted(f"patches/{p.name}" for p in project.patches_dir.iterdir() if p.is_file())
    for rel in rels:
        out[rel] = Entry(sha256_bytes((project.root / rel).read_bytes()), REGULAR)
    return out


def start(project: Project, spec: str | None, progress: Progress = lambda _m: None, review_merged: bool = True) -> dict:
    """Back up, materialise SPEC as the vendored tree, carry the series across until a stop or the end (a
    conflict, or a 3-way merge to review unless review_merged is False)."""
    with txn.locked(project.state_dir):
        _recover(project, progress)
        recorded = read_state(project)
        if recorded is not None and has_backups(project, recorded):
            raise ForktoolError(f"a sync to {recorded['to_spec']} is already in progress ({recorded['stage']})",
                                where=str(state_path(project)),
                                hint="run `forktool sync --continue`, `--skip` or `--abort` (`forktool status` "
                                     "shows where it stands)")
        if recorded is not None and spec and spec != recorded["to_spec"]:
            raise UsageError(f"this checkout records a stopped sync to {recorded['to_spec']}, not {spec}",
                             where=str(state_path(project)), hint="run `forktool sync --start` without --to to "
                             "reach that stop, or remove the file to start another sync")
        if recorded is None and not spec:
            raise UsageError("--start needs --to SPEC", where="forktool sync",
                             hint="e.g. `forktool sync --to llama-cpp-python==0.3.35 --start`")
        ws = Workspace(project)
        if not project.tree.exists():
            progress("materialising the pinned tree first")
            ws.goto([], force=False, label="sync-fetch")
        stale = ws.applied_stale()
        if stale:
            raise ForktoolError(f"applied patch(es) {', '.join(stale)} changed on disk since they were applied",
                                where="patches/", hint="run `forktool apply` (or refresh them) before a sync")
        current = ws.current()
        dirty = ws.local_changes()
        if dirty:
            raise DirtyTreeError(f"the vendored tree has {len(dirty)} change(s) that no patch explains",
                                 where=str(project.tree), details=[f"{s}: {p}" for s, p in dirty[:50]],
                                 hint="keep them with `forktool new` + `forktool refresh`, or drop them with "
                                      "`forktool apply --force`, then start the sync")
        t0 = time.monotonic()
        if recorded is not None:
            new = _component(recorded["to"])
            old = next(c for c in project.vendor.components if c.name == recorded["component"])
        else:
            assert spec is not None
            old, new = resolve_spec(project, spec)
        target = fetch_target(project, old, new, ws.pristine, progress)
        t_fetched = time.monotonic()
        new_digest = digest(target.manifest)
        path = vendor.pristine_path(project, new_digest)
        if not path.is_file():
            atomic_write(path, json.dumps(manifest_to_json(target.manifest), sort_keys=True).encode())
        if recorded is not None:
            st = dict(recorded, backups={}, stage="starting", old_pristine_digest=ws.pristine_digest,
                      new_pristine_digest=new_digest, tree_digest_before=digest(current), stop=None)
        else:
            st = {"version": STATE_VERSION, "stage": "starting", "component": old.name, "from_spec": old.spec,
                  "to_spec": target.new.spec, "to": _component_json(target.new),
                  "old_pristine_digest": ws.pristine_digest, "new_pristine_digest": new_digest,
                  "tree_digest_before": digest(current), "backups": {},
                  "original": [[p.name, p.raw.decode("utf-8")] for p in ws.patches],
                  "position": 0, "done": [], "stop": None, "review_merged": review_merged,
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        atomic_write(state_path(project), json.dumps(st, indent=1, sort_keys=True).encode())
        txn.fault("sync-started")
        _back_up(project, st, ws, current, progress)
        res = _run(project, st, {}, progress)
    res["timings"] = {"fetch_s": round(t_fetched - t0, 3), "tool_s": round(time.monotonic() - t_fetched, 3),
                      "fetch_from_cache": target.from_cache}
    return res


def start_reanchor(project: Project, progress: Progress = lambda _m: None) -> dict:
    """`apply --reanchor` when a patch no longer applies on the edited patches below it: the same loop as a sync,
    onto the series' changed base (the upstream stays); it stops at conflict blocks and merges to review."""
    t0 = time.monotonic()
    with txn.locked(project.state_dir):
        _recover(project, progress)
        recorded = read_state(project)
        if recorded is not None:
            raise ForktoolError(f"a sync to {recorded['to_spec']} is already in progress ({recorded['stage']})",
                                where=str(state_path(project)), hint="run `forktool sync --continue`, `--skip` or "
                                "`--abort` first (`forktool status` shows where it stands)")
        ws = Workspace(project)
        current = ws.current()
        dirty = ws.local_changes()
        if dirty:
            raise DirtyTreeError(f"the vendored tree has {len(dirty)} change(s) that no patch explains",
                                 where=str(project.tree), details=[f"{s}: {p}" for s, p in dirty[:50]],
                                 hint="keep them with `forktool refresh ID`, or drop them with `forktool apply "
                                      "--force`, then re-anchor")
        comp = project.vendor.components[0]
        d = ws.pristine_digest
        st = {"version": STATE_VERSION, "kind": "reanchor", "stage": "starting", "component": comp.name,
              "from_spec": comp.spec, "to_spec": comp.spec, "to": _component_json(comp),
              "old_pristine_digest": d, "new_pristine_digest": d, "tree_digest_before": digest(current),
              "backups": {}, "original": [[p.name, p.raw.decode("utf-8")] for p in ws.patches], "position": 0,
              "done": [], "stop": None, "review_merged": True,
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        atomic_write(state_path(project), json.dumps(st, indent=1, sort_keys=True).encode())
        txn.fault("sync-started")
        _back_up(project, st, ws, current, progress)
        res = _run(project, st, {}, progress)
    res["timings"] = {"tool_s": round(time.monotonic() - t0, 3)}
    return res


def _back_up(project: Project, st: dict, ws: Workspace, current: Manifest, progress: Progress) -> None:
    """Back up the tree (vendor-backups) and pin, lock, patches, state and registry (sync-backups)."""
    progress("backing up the tree, pin, lock and patches")
    label = "sync-start-" + (st["to"]["version"] or st["to"]["commit"][:12])
    why = f"before forktool sync --start to {st['to_spec']}"
    if reanchoring(st):
        label, why = "reanchor", "before forktool apply --reanchor carried the series onto its edited patches"
    tb = bk.create(project.backups_dir, project.tree, label, why, current, ws.pristine, ws.state.to_json())
    pb = bk.create(project.state_dir / "sync-backups", project.root, label, why,
                   _project_manifest(project), {}, {"kind": "sync-start", "from": st["from_spec"], "to": st["to_spec"]})
    st["backups"] = {"tree": tb.name, "project": pb.name}
    atomic_write(state_path(project), json.dumps(st, indent=1, sort_keys=True).encode())
    undo_path(project).unlink(missing_ok=True)  # a new move: the last one can no longer be undone
    txn.fault("sync-backed-up")


def _component_json(c: Component) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in c._asdict().items()}


def _require(project: Project, what: str) -> dict:
    st = read_state(project)
    if st is None:
        raise ForktoolError(f"no sync in progress to {what}", where=str(state_path(project)),
                            hint="start one with `forktool sync --to SPEC --start`")
    if not has_backups(project, st) and not (st["stage"] == "starting" and not st.get("backups")):
        raise ForktoolError(f"the sync to {st['to_spec']} was recorded elsewhere; this checkout has not reached "
                            "its stop", where=str(state_path(project)),
                            hint="run `forktool sync --start` to reach the same stop here")
    return st


def conflict_lines(project: Project, rels: list[str]) -> list[str]:
    """file:line of every conflict-block line left in these tree files."""
    out = []
    for rel in rels:
        p = project.tree / rel
        if p.is_symlink() or not p.is_file():
            continue
        for n, line in enumerate(p.read_bytes().split(b"\n"), 1):
            if line.startswith(CONFLICT_PREFIXES) or line.rstrip(b"\r") == b"=======":
                out.append(f"{TREE}/{rel}:{n}: {line.decode('utf-8', 'replace')[:60]}")
    return out


def continue_(project: Project, progress: Progress = lambda _m: None) -> dict:
    """Refuse while conflict blocks remain; else rewrite the stopped patch from the tree and go on."""
    t0 = time.monotonic()
    with txn.locked(project.state_dir):
        _recover(project, progress)
        st = _require(project, "continue")
        if st["stage"] == "starting":
            if not st["backups"]:  # killed before the backups were recorded: the tree has not moved
                ws = Workspace(project)
                _back_up(project, st, ws, scan(project.tree), progress)
            res = _run(project, st, {}, progress)
        elif st["stage"] == "finishing":
            res = _finish(project, st, progress)
        elif st["stage"] == "finished":  # verify failed last time: check again
            res = conclude(project, st, progress)
        else:
            ctx = _context(project, st)
            k = st["position"]
            patch = _disk_patch(project, ctx.original[k].name, {})
            before, expected = _stop_base(ctx)
            current = scan(project.tree)
            changed = {rel for _, rel in diff_manifests(expected, current)}
            rels = sorted(set(patch.paths) | changed)
            left = conflict_lines(project, rels)
            if left:
                raise ForktoolError(f"{len(left)} conflict-block line(s) remain in the tree", where=left[0],
                                    details=left[:50], hint="resolve each block (keep what the patch means on "
                                    "the new upstream, delete the markers), then `forktool sync --continue`; or "
                                    f"`forktool sync --skip` to drop {patch.id}, `forktool sync --abort` to go back")
            fds = []
            for rel in rels:
                old = before[rel] if rel in before else ctx.new_read(rel)
                e = current.get(rel)
                if e is not None and e.mode == SYMLINK:
                    raise ForktoolError(f"{rel} is a symlink; patches carry regular files only", where=rel)
                new = (project.tree / rel).read_bytes() if e is not None else None
                mode = ctx.mode_of(rel) if old is not None else (e.mode if e else REGULAR)
                fd = series.diff_file(rel, old, new, mode if old is not None else None,
                                      (e.mode if e else None) if new is not None else None)
                if fd is not None:
                    fds.append(fd)
            resolved, _ = with_derived_trailers(project, patch, fds)
            _harvest(project, st)
            # a reviewed merge taken as it stood stays `merged`; any edit makes it the maintainer's resolution
            how = "merged" if st["stop"].get("merged_diff_sha256") == resolved.diff_sha256 else "resolved"
            if how == "merged":  # the same bytes a sync without review writes (the patch's own trailers kept)
                order = {rel: n for n, rel in enumerate(patch.paths)}
                fds = sorted(resolved.files, key=lambda f: order.get(f.path, len(order)))
                resolved = series.parse_patch(series.with_files(patch, fds).raw, patch.name)
            st["done"].append({"id": patch.id, "name": patch.name, "status": how, "drift": [],
                               "files": [{"file": f.path, "status": how} for f in resolved.files]})
            st["position"] = k + 1
            res = _run(project, st, {patch.name: resolved.raw}, progress)
    res["timings"] = {"tool_s": round(time.monotonic() - t0, 3)}
    return res


def skip(project: Project, progress: Progress = lambda _m: None) -> dict:
    """Drop the stopped patch (series comments it out, the file stays), restore its files, go on."""
    t0 = time.monotonic()
    with txn.locked(project.state_dir):
        _recover(project, progress)
        st = _require(project, "skip")
        if st["stage"] != "stopped":
            raise ForktoolError(f"the sync is {st['stage']}, not stopped at a patch", where=str(state_path(project)),
                                hint="`forktool sync --continue` goes on, `--abort` goes back")
        stop = st["stop"]
        st["done"].append({"id": stop["id"], "name": stop["name"], "status": "skipped", "drift": [], "files": []})
        st["position"] += 1
        res = _run(project, st, {}, progress)
    res["timings"] = {"tool_s": round(time.monotonic() - t0, 3)}
    return res


def abort(project: Project, progress: Progress = lambda _m: None) -> dict:
    """Pin, lock, patches, series, registry and tree back to the bytes they had before the start."""
    with txn.locked(project.state_dir):
        _recover(project, progress)
        st = _require(project, "abort")
        if not st["backups"]:  # killed before the backups were recorded: the tree has not moved
            state_path(project).unlink()
            st["stage"] = "aborted"
            return {"stage": "aborted", "state": st, "written": 0, "tree_digest": digest(scan(project.tree)),
                    "backups": {}}
        kept = _harvest(project, st) if st["stage"] == "stopped" else 0
        writes = _restore_writes(project, st)
        st["stage"] = "aborted"
        txn.commit(project.root, sync_dir(project), writes, st)
        state_path(project).unlink()
    return {"stage": "aborted", "state": st, "written": len(writes), "tree_digest": digest(scan(project.tree)),
            "backups": st["backups"], "remembered": {"new": kept, "total": memory(project).count()}}


def _restore_writes(project: Project, st: dict) -> list[txn.Write]:
    """Writes that put tree, pin, lock, patches, series, state and registry back as the start's backups hold them."""
    tree_m, tree_c, _ = bk.load_for_restore(project.backups_dir / st["backups"]["tree"], vendor.objects(project).get)
    proj_m, proj_c, _ = bk.load_for_restore(project.state_dir / "sync-backups" / st["backups"]["project"],
                                           vendor.objects(project).get)
    writes = _tree_writes(project, {rel: (tree_c[rel], e.mode) for rel, e in tree_m.items()}, scan(project.tree))
    now = _project_manifest(project)
    # a file the start did not record goes only from patches/ (the loop never adds one elsewhere)
    for rel in sorted(set(proj_m) | {r for r in now if r.startswith("patches/")}):
        if proj_m.get(rel) != now.get(rel):
            writes.append(txn.Write(rel, proj_c.get(rel), REGULAR))
    return writes


def _stop_base(ctx: Context) -> tuple[dict[str, bytes | None], Manifest]:
    """The contents the carried patches give (files they touch) and the whole tree they make, at a stop."""
    before = apply_series(_done_patches(ctx, {}), ctx.new_read).files
    expected = dict(ctx.new_manifest)
    for rel, data in before.items():
        if data is None:
            expected.pop(rel, None)
        else:
            expected[rel] = Entry(sha256_bytes(data), ctx.mode_of(rel))
    return before, expected


def _harvest(project: Project, st: dict) -> int:
    """Learn the resolutions made so far at the stop: each block whose markers are gone, and each file changed
    since the stop left it, as a whole (what conflicts no block shows); how many were new."""
    mem = memory(project)
    ctx = _context(project, st)
    before, expected = _stop_base(ctx)
    current = scan(project.tree)
    rels = {f["file"] for f in (st.get("stop") or {}).get("files", [])}
    rels |= {rel for _, rel in diff_manifests(expected, current)}
    kept = 0
    for rel in sorted(rels):
        now = project.tree / rel
        e = current.get(rel)
        if e is None or e.mode == SYMLINK:
            continue
        post = now.read_bytes()
        pre_path = _preimage(project, rel)
        if pre_path.is_file():
            pre: bytes | None = pre_path.read_bytes()
            kept += mem.harvest(pre_path.read_bytes(), post, f"{st['stop']['id']} {rel}")
        else:
            pre = before[rel] if rel in before else ctx.new_read(rel)
        if pre is not None and pre != post:
            kept += mem.put_file(st["stop"]["id"], rel, pre, post)
    return kept


def undo(project: Project, progress: Progress = lambda _m: None) -> dict:
    """Put a finished sync's pin, lock, patches, series, registry and tree back as they were before its start,
    while nothing has changed since it finished (the next start replaces the record)."""
    with txn.locked(project.state_dir):
        _recover(project, progress)
        running = read_state(project)
        if running is not None:
            raise ForktoolError(f"a sync to {running['to_spec']} is in progress ({running['stage']}); only a "
                                "finished one can be undone", where=str(state_path(project)),
                                hint="`forktool sync --abort` goes back from where it stands")
        rec = schema.load_sync_state(undo_path(project), project.state_dir)
        if rec is None or "finished" not in rec:
            raise ForktoolError("no finished sync to undo", where=str(undo_path(project)),
                                hint="a sync can be undone from its finish until the next `forktool sync --start`")
        if not has_backups(project, rec):
            raise ForktoolError(f"the backups of the sync to {rec['to_spec']} are gone", where=str(project.backups_dir),
                                details=[f".opencoti/vendor-backups/{rec['backups']['tree']}",
                                         f".opencoti/sync-backups/{rec['backups']['project']}"],
                                hint="nothing was changed; put the pin, lock, patches and registry back from git")
        fin = rec["finished"]
        now = {rel: e.sha256 for rel, e in _project_manifest(project).items()}
        moved = [rel for rel in sorted(set(now) | set(fin["files"])) if now.get(rel) != fin["files"].get(rel)]
        tree_now = digest(scan(project.tree))
        if tree_now != fin["tree_digest"]:
            moved.insert(0, f"{TREE} (tree digest {tree_now[:12]}, the finish left {fin['tree_digest'][:12]})")
        if moved:
            raise ForktoolError(f"{len(moved)} thing(s) changed since the sync to {rec['to_spec']} finished; undoing "
                                "it would lose them", where=str(project.root), details=moved,
                                hint="nothing was changed; put them back as the finish left them (e.g. `forktool "
                                     "apply` for the tree), or restore the start's backups by hand")
        writes = _restore_writes(project, rec)
        txn.commit(project.root, sync_dir(project), writes, dict(rec, stage="aborted"))
        undo_path(project).unlink()
        state_path(project).unlink(missing_ok=True)
    return {"stage": "undone", "state": rec, "written": len(writes), "tree_digest": digest(scan(project.tree)),
            "backups": rec["backups"]}


def backups_in_use(project: Project) -> dict[str, list[str]]:
    """Backups that a sync in progress (for --abort) or a finished one (for --undo) needs: never to be pruned."""
    out: dict[str, list[str]] = {"vendor-backups": [], "sync-backups": []}
    for path in (state_path(project), undo_path(project)):
        try:
            st = schema.load_sync_state(path, project.state_dir)
        except ForktoolError:
            st = None
        if st and st.get("backups") and st["stage"] != "aborted":
            out["vendor-backups"].append(st["backups"]["tree"])
            out["sync-backups"].append(st["backups"]["project"])
    return out


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
