"""Moving the fork to another upstream as a resumable operation: start, stop at a conflict, continue/skip, abort."""

from __future__ import annotations

import dataclasses
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
from forktool.state import State
from forktool.sync import compilegate
from forktool.sync.accept import _repin_text
from forktool.sync.fetch import fetch_target, resolve_spec
from forktool.sync.relocate import relocate
from forktool.sync.trial import OldSide, classify, rebase
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
    return project.state_dir / "sync"


def state_path(project: Project) -> Path:
    return sync_dir(project) / "state.json"


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


def _series_text(project: Project, st: dict) -> str:
    """patches/series with the dropped patches commented out (their files are kept)."""
    why = {d["name"]: d["status"] for d in st["done"] if d["status"] in DROPPED}
    text = project.series_file.read_text(encoding="utf-8")
    out = []
    for line in text.splitlines():
        name = line.split("#", 1)[0].strip()
        if name in why:
            out.append(f"# {name}  # {why[name]} in the sync to {st['to_spec']} (forktool sync)")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


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

    old = OldSide(ctx.old_read)
    for p in ctx.original[:st["position"]]:
        old.step(p)
    st["stop"] = None
    for p in ctx.original[st["position"]:]:
        progress(f"carrying {p.name} across")
        pre, post, err = old.step(p)
        c = classify(p, pre, post, err, cur)
        row = {"id": p.id, "name": p.name, "status": c.status, "drift": c.drift,
               "files": [{"file": f.path, "status": f.status} for f in c.files if f.status != "clean"]}
        if c.status == "conflict":
            for rel, data in c.after.items():
                overlay[rel] = data
            for rel, data in c.conflicted.items():
                overlay[rel] = data
            st["stop"] = {"id": p.id, "name": p.name, "title": p.title,
                          "files": [{"file": f.path, "status": f.status, "reason": f.reason,
                                     "hunks": [h for h in f.hunks if h["how"] != "exact"],
                                     "blocks": [b["line"] for b in f.conflicts]} for f in c.files
                                    if f.status != "clean"]}
            break
        if c.status != "upstreamed":
            again = rebase(p, {rel: cur(rel) for rel in c.after}, c.after, ctx.mode_of)
            if again.raw != _disk_patch(project, p.name, pending).raw:
                pending[p.name] = again.raw
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


def _same_file(root: Path, w: txn.Write) -> bool:
    if not w.path.startswith("patches/"):
        return False
    p = root / w.path
    return p.is_file() and w.data is not None and p.read_bytes() == w.data


# ---------------------------------------------------------------- finish


def _finish(project: Project, st: dict, progress: Progress) -> dict:
    """Move the pin and the lock, record the applied series, relocate the registry's sites: one transaction."""
    stopped = compilegate.gate(project, st, progress)  # or stop at the patch whose units do not compile
    if stopped is not None:
        return stopped
    ctx = _context(project, st)
    active = _done_patches(ctx, {})
    final = apply_series(active, ctx.new_read)
    yaml_text = _repin_text(project.vendor_yaml.read_text(encoding="utf-8"), st["component"], ctx.new)
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
    ws_state = State(d, applied, files).to_json()
    writes = [txn.Write("vendor/vendor.yaml", yaml_text.encode(), REGULAR),
              txn.Write("vendor/vendor.lock", (json.dumps(lock, indent=2, sort_keys=True) + "\n").encode(), REGULAR),
              txn.Write(".opencoti/state.json", json.dumps(ws_state, indent=1, sort_keys=True).encode(), REGULAR)]
    progress("relocating hook sites by symbol")
    registry = _relocated_registry(project, ctx, final.files, active, st)
    if registry is not None:
        writes.append(txn.Write("registry/UPSTREAM_SYNC.yaml", registry[0].encode(), REGULAR))
        writes.append(txn.Write("registry/UPSTREAM_SYNC.md", registry[1].encode(), REGULAR))
    st["stage"] = "finished"
    txn.commit(project.root, sync_dir(project), writes, st)
    project._vendor = None  # vendor.yaml moved: read it again
    return {"stage": "finished", "state": st}


def _relocated_registry(project: Project, ctx: Context, final: dict[str, bytes | None], active: list[Patch],
                        st: dict) -> tuple[str, str] | None:
    """(UPSTREAM_SYNC.yaml, UPSTREAM_SYNC.md) on the new base, None without a registry: each hook's sites are
    where its markers now stand (found sites keep their place in the list with the symbol's new line, sites
    whose symbol holds no marker any more go, symbols that gained one are added), dropped patches' entries
    go, and each kept patch's files and build impact come from its rebased form."""
    path = project.registry_dir / "UPSTREAM_SYNC.yaml"
    if not path.is_file():
        return None
    from forktool import registry as rg
    from forktool import symbols
    from forktool.impact import impacts_for
    from forktool.markers import scan_file
    from forktool.regcheck import render_md

    def read(rel: str) -> bytes | None:
        return final[rel] if rel in final else ctx.new_read(rel)

    hooks, reg = relocate(project, read, ctx.new_manifest, f"{st['component']}/")
    if reg is None:
        st["hooks"] = hooks
        return None
    held: dict[str, dict[tuple[str, str], int]] = {}  # hook -> (file, symbol) -> advisory line
    for rel, data in sorted(final.items()):
        for m in scan_file(rel, data or b""):
            sym = symbols.site_symbol(data or b"", m.line)
            line = m.line if sym == symbols.FILE_SCOPE else (symbols.find_symbol(data or b"", sym) or m.line)
            held.setdefault(m.hook, {}).setdefault((rel, sym), line)
    for hid, hook in list(reg.hooks.items()):
        here = held.get(hid)
        if not here:
            continue  # no marker left at all: the registry check says so; a human decides
        sites = [s for s in hook.sites if (s.file, s.symbol) in here]
        known = {(s.file, s.symbol) for s in sites}
        for s in hook.sites:
            if (s.file, s.symbol) not in here:
                for row in hooks["sites"]:
                    if (row["hook"], row["file"], row["symbol"]) == (hid, s.file, s.symbol):
                        row.update(new_file=None, new_line=None, status="dropped")
        for (f, sym), line in sorted(here.items()):
            if (f, sym) in known:
                continue
            # before the first site of the same file that stands further down, else after that file's last
            same = [i for i, x in enumerate(sites) if x.file == f]
            later = [i for i in same if (x := sites[i].line) is not None and x > line]
            at = later[0] if later else (same[-1] + 1 if same else len(sites))
            sites.insert(at, rg.Site(f, sym, line))
            hooks["sites"].append({"hook": hid, "patch": hook.patch, "symbol": sym, "file": None,
                                   "line": None, "new_file": f, "new_line": line, "status": "added"})
        reg.hooks[hid] = dataclasses.replace(hook, sites=tuple(sites))
    st["hooks"] = hooks
    keep = {p.id: p for p in active}
    dropped_hooks = {h for e in reg.patches if e.id not in keep for h in e.hooks}
    reg.patches[:] = [dataclasses.replace(e, files=tuple(keep[e.id].paths),
                                          build_impact=tuple(impacts_for(project, keep[e.id].paths)))
                      for e in reg.patches if e.id in keep]
    for h in dropped_hooks:
        reg.hooks.pop(h, None)
    return _registry_text(path.read_text(encoding="utf-8"), reg), render_md(reg)


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


def _recover(project: Project, progress: Progress) -> None:
    for note in (txn.recover(project.tree, project.state_dir), txn.recover(project.root, sync_dir(project), "sync-state")):
        if note:
            progress(note)


def _project_manifest(project: Project) -> Manifest:
    out: Manifest = {}
    rels = [r for r in PROJECT_FILES if (project.root / r).is_file()]
    rels += sorted(f"patches/{p.name}" for p in project.patches_dir.iterdir() if p.is_file())
    for rel in rels:
        out[rel] = Entry(sha256_bytes((project.root / rel).read_bytes()), REGULAR)
    return out


def start(project: Project, spec: str | None, progress: Progress = lambda _m: None) -> dict:
    """Back up, materialise SPEC as the vendored tree, carry the series across until a conflict or the end."""
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
                  "position": 0, "done": [], "stop": None,
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        atomic_write(state_path(project), json.dumps(st, indent=1, sort_keys=True).encode())
        txn.fault("sync-started")
        _back_up(project, st, ws, current, progress)
        res = _run(project, st, {}, progress)
    res["timings"] = {"fetch_s": round(t_fetched - t0, 3), "tool_s": round(time.monotonic() - t_fetched, 3),
                      "fetch_from_cache": target.from_cache}
    return res


def _back_up(project: Project, st: dict, ws: Workspace, current: Manifest, progress: Progress) -> None:
    """Back up the tree (vendor-backups) and pin, lock, patches, state and registry (sync-backups)."""
    progress("backing up the tree, pin, lock and patches")
    label = st["to"]["version"] or st["to"]["commit"][:12]
    why = f"before forktool sync --start to {st['to_spec']}"
    tb = bk.create(project.backups_dir, project.tree, f"sync-start-{label}", why, current, ws.pristine,
                   ws.state.to_json())
    pb = bk.create(project.state_dir / "sync-backups", project.root, f"sync-start-{label}", why,
                   _project_manifest(project), {}, {"kind": "sync-start", "from": st["from_spec"], "to": st["to_spec"]})
    st["backups"] = {"tree": tb.name, "project": pb.name}
    atomic_write(state_path(project), json.dumps(st, indent=1, sort_keys=True).encode())
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
        elif st["stage"] == "finished":
            res = {"stage": "finished", "state": st}
        else:
            ctx = _context(project, st)
            k = st["position"]
            patch = _disk_patch(project, ctx.original[k].name, {})
            before = apply_series(_done_patches(ctx, {}), ctx.new_read).files
            expected = dict(ctx.new_manifest)
            for rel, data in before.items():
                if data is None:
                    expected.pop(rel, None)
                else:
                    expected[rel] = Entry(sha256_bytes(data), ctx.mode_of(rel))
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
            st["done"].append({"id": patch.id, "name": patch.name, "status": "resolved", "drift": [],
                               "files": [{"file": f.path, "status": "resolved"} for f in resolved.files]})
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
        tree_m, tree_c, _ = bk.load_for_restore(project.backups_dir / st["backups"]["tree"],
                                               vendor.objects(project).get)
        proj_m, proj_c, _ = bk.load_for_restore(project.state_dir / "sync-backups" / st["backups"]["project"],
                                               vendor.objects(project).get)
        current = scan(project.tree)
        writes = [txn.Write(w.path, w.data, w.mode) for w in _tree_writes(
            project, {rel: (tree_c[rel], e.mode) for rel, e in tree_m.items()}, current)]
        now = _project_manifest(project)
        # a file the start did not record goes only from patches/ (the loop never adds one elsewhere)
        for rel in sorted(set(proj_m) | {r for r in now if r.startswith("patches/")}):
            if proj_m.get(rel) != now.get(rel):
                writes.append(txn.Write(rel, proj_c.get(rel), REGULAR))
        st["stage"] = "aborted"
        txn.commit(project.root, sync_dir(project), writes, st)
        state_path(project).unlink()
    return {"stage": "aborted", "state": st, "written": len(writes),
            "tree_digest": digest(scan(project.tree)), "backups": st["backups"]}


def done(project: Project) -> None:
    """A finished sync that verified: its state goes (kept as last.json beside it); the backups stay."""
    with txn.locked(project.state_dir):
        p = state_path(project)
        if p.is_file():
            shutil.copyfile(p, sync_dir(project) / "last.json")
            p.unlink()


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
