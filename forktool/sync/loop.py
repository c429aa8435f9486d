"""The loop's control flow: start (a sync or `apply --reanchor`), stop, continue, skip, abort, undo."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from forktool import backup as bk
from forktool import schema, series, txn, vendor
from forktool.apply import apply_series
from forktool.authoring import with_derived_trailers
from forktool.errors import ForktoolError, UsageError
from forktool.project import Project
from forktool.series import Patch
from forktool.sync.accept import comment_out
from forktool.sync.fetch import fetch_target, names_target, resolve_spec
from forktool.sync.finish import conclude, finish
from forktool.sync.finish import registry_diff as registry_diff  # re-exported: the loop's public face
from forktool.sync.move import (
    DROPPED,
    STATE_VERSION,
    TREE,
    Context,
    Progress,
    component_json,
    component_of,
    context,
    disk_patch,
    done_patches,
    ended_path,
    has_backups,
    memory,
    preimage_path,
    project_manifest,
    read_state,
    reanchoring,
    recover,
    state_path,
    sync_dir,
    undo_path,
)
from forktool.sync.move import backups_in_use as backups_in_use  # re-exported: the loop's public face
from forktool.sync.move import missing_backups as missing_backups  # re-exported: the loop's public face
from forktool.sync.move import report_path as report_path  # re-exported: the loop's public face
from forktool.sync.move import write_report as write_report  # re-exported: the loop's public face
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

CONFLICT_PREFIXES = (b"<<<<<<< ", b"||||||| ", b">>>>>>> ")


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


def _run(project: Project, st: dict, pending: dict[str, bytes], progress: Progress) -> dict:
    """Carry the patches from st['position'] on, stop at the first conflict or finish; one transaction."""
    ctx = context(project, st)
    done = done_patches(ctx, pending)
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
    api = _api_lines(ctx)
    for p in ctx.original[st["position"]:]:
        progress(f"carrying {p.name} across")
        pre, post, err = old.step(p)
        c = classify(p, pre, post, err, cur, labels)
        row = {"id": p.id, "name": p.name, "status": c.status, "drift": c.drift,
               "files": [{"file": f.path, "status": f.status} for f in c.files if f.status != "clean"], "api": api(p)}
        again = None
        if c.status not in ("conflict", "upstreamed"):
            again = rebase(p, {rel: cur(rel) for rel in c.after}, c.after, ctx.mode_of)
        if c.status == "conflict" or (c.status == "merged" and st.get("review_merged", True)):
            checked, stopped = _compile_before_stop(ctx, st, overlay, pending, progress)
            if stopped is not None:
                return stopped
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
                    atomic_write(preimage_path(project, rel), image)
            st["stop"] = {"id": p.id, "name": p.name, "title": p.title, "kind": c.status, "api": row["api"],
                          "checked": checked,
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
        if again is not None and again.raw != disk_patch(project, p.name, pending).raw:
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
    return finish(project, st, progress)


def _compile_before_stop(ctx: Context, st: dict, overlay: dict[str, bytes | None], pending: dict[str, bytes],
                         progress: Progress) -> tuple[list[dict], dict | None]:
    """Before a stop is offered: put the tree as the patches carried so far leave it (one transaction, which a
    `--continue` after a kill carries on from) and compile what they feed, so an error an earlier, cleanly carried
    patch causes stops at that patch and not at the later conflict. (what was compiled, a compile stop or None)"""
    from forktool.sync import compilegate

    project = ctx.project
    if not st["done"]:
        return [], None
    st["stage"], st["stop"] = "starting", None
    writes = _writes_for(ctx, overlay)
    writes += [txn.Write(f"patches/{name}", data, REGULAR) for name, data in sorted(pending.items())]
    writes.append(txn.Write("patches/series", _series_text(project, st).encode(), REGULAR))
    txn.commit(project.root, sync_dir(project), [w for w in writes if not _same_file(project.root, w)], st)
    txn.fault("sync-before-stop-compile")
    return compilegate.before_stop(project, st, progress)


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


def _api_lines(ctx: Context) -> Callable[[Patch], list[str]]:
    """The API drift lines (forktool/sync/apidrift.py) of a patch between the pinned and the new upstream."""
    from forktool.cache import Cache, caches_root
    from forktool.sync.apidrift import Upstream, api_drift

    old = Upstream(frozenset(ctx._old), ctx.old_read)
    new = Upstream(frozenset(ctx.new_manifest), ctx.new_read)
    cache = Cache(caches_root(ctx.project.state_dir), "declarations")
    return lambda p: [d.line for d in api_drift(old, new, p, cache)]


def _same_file(root: Path, w: txn.Write) -> bool:
    if not w.path.startswith("patches/"):
        return False
    p = root / w.path
    return p.is_file() and w.data is not None and p.read_bytes() == w.data


def _recover(project: Project, progress: Progress) -> None:
    for note in recover(project):
        progress(note)


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
        if recorded is not None and spec and spec != recorded["to_spec"] and \
                not names_target(project, spec, component_of(recorded["to"])):
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
        ws.refuse_unexplained(stale_hint="run `forktool apply` (or refresh them) before a sync",
                              dirty_hint="keep them with `forktool new` + `forktool refresh`, or drop them with "
                                         "`forktool apply --force`, then start the sync")
        current = ws.current()
        t0 = time.monotonic()
        if recorded is not None:
            new = component_of(recorded["to"])
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
                  "to_spec": target.new.spec, "to": component_json(target.new),
                  "old_pristine_digest": ws.pristine_digest, "new_pristine_digest": new_digest,
                  "tree_digest_before": digest(current), "backups": {},
                  "original": [[p.name, p.raw.decode("utf-8")] for p in ws.patches],
                  "position": 0, "done": [], "stop": None, "review_merged": review_merged,
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        atomic_write(state_path(project), json.dumps(st, indent=1, sort_keys=True).encode())
        with _left_in_progress(project):
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
        ws.refuse_unexplained(dirty_hint="keep them with `forktool refresh ID`, or drop them with `forktool apply "
                                         "--force`, then re-anchor")
        comp = project.vendor.components[0]
        d = ws.pristine_digest
        st = {"version": STATE_VERSION, "kind": "reanchor", "stage": "starting", "component": comp.name,
              "from_spec": comp.spec, "to_spec": comp.spec, "to": component_json(comp),
              "old_pristine_digest": d, "new_pristine_digest": d, "tree_digest_before": digest(current),
              "backups": {}, "original": [[p.name, p.raw.decode("utf-8")] for p in ws.patches], "position": 0,
              "done": [], "stop": None, "review_merged": True,
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        atomic_write(state_path(project), json.dumps(st, indent=1, sort_keys=True).encode())
        with _left_in_progress(project):
            txn.fault("sync-started")
            _back_up(project, st, ws, current, progress)
            res = _run(project, st, {}, progress)
    res["timings"] = {"tool_s": round(time.monotonic() - t0, 3)}
    return res


@contextmanager
def _left_in_progress(project: Project) -> Iterator[None]:
    """A step that fails once the sync is recorded (a start, or a `--continue`/`--skip` past its checks) leaves that
    sync in progress (a `--start` again is refused): its error says so, at which stage, and what to run, as
    `forktool status` would."""
    try:
        yield
    except ForktoolError as e:
        try:
            st = read_state(project)
        except ForktoolError:  # the record itself is unreadable: the error that came first is the news
            raise e from None
        if st is None:
            raise
        what, next_steps = _in_progress(st)
        e.what = f"{e.what}; {what}"
        if "`forktool sync --" not in e.hint:  # a hint that names the sync's own commands already says what to run
            if e.hint:
                e.details.append(f"about the failure: {e.hint}")
            e.hint = next_steps
        e.extra["sync"] = {"in_progress": True, "to": st["to_spec"], "stage": st["stage"],
                           "position": st["position"], "next": ["forktool sync --continue", "forktool sync --abort"]}
        e.args = (e.what,)
        raise
    except (OSError, KeyboardInterrupt) as e:
        # a full disk, a file this user may not change, Ctrl-C: the CLI names the failure, and prints this note
        # under it to say what the failure left
        try:
            st = read_state(project)
        except Exception:  # the record unreadable too: the failure that came first is the news
            st = None
        if st is not None:
            what, next_steps = _in_progress(st)
            e.add_note(f"{what}: {next_steps}")
        raise


def _in_progress(st: dict) -> tuple[str, str]:
    """(what is in progress and where, what to run next) for a recorded sync."""
    what = "re-anchoring" if reanchoring(st) else f"sync to {st['to_spec']}"
    back = ("puts pin, lock, patches and tree back as they were" if st["backups"]
            else "removes its record (nothing was moved yet)")
    return (f"the {what} is in progress, at stage {st['stage']}",
            f"once the cause is fixed, `forktool sync --continue` goes on from stage {st['stage']}; "
            f"`forktool sync --abort` {back} (`forktool status` shows where it stands)")


def _back_up(project: Project, st: dict, ws: Workspace, current: Manifest, progress: Progress) -> None:
    """Back up the tree (vendor-backups) and pin, lock, patches, state and registry (sync-backups)."""
    progress("backing up the tree, pin, lock and patches")
    label = "sync-start-" + (st["to"]["version"] or st["to"]["commit"][:12] or st["to"]["sha256"][:12]
                             or st["to"]["kind"])
    why = f"before forktool sync --start to {st['to_spec']}"
    if reanchoring(st):
        label, why = "reanchor", "before forktool apply --reanchor carried the series onto its edited patches"
    tb = bk.create(project.backups_dir, project.tree, label, why, current, ws.pristine, ws.state.to_json())
    pb = bk.create(project.state_dir / "sync-backups", project.root, label, why,
                   project_manifest(project), {}, {"kind": "sync-start", "from": st["from_spec"], "to": st["to_spec"],
                                                   "tree": tb.name})
    st["backups"] = {"tree": tb.name, "project": pb.name}
    atomic_write(state_path(project), json.dumps(st, indent=1, sort_keys=True).encode())
    undo_path(project).unlink(missing_ok=True)  # a new move: the last one can no longer be undone
    ended_path(project).unlink(missing_ok=True)  # nor is how the one before ended the last word
    txn.fault("sync-backed-up")


def _require(project: Project, what: str) -> dict:
    st = read_state(project)
    if st is None:
        raise ForktoolError(f"no sync in progress to {what}", where=str(state_path(project)),
                            hint="start one with `forktool sync --to SPEC --start`")
    bk.check_dirs(project)  # a backup directory replaced by a file or a link is refused, not taken for "elsewhere"
    if not has_backups(project, st) and not (st["stage"] == "starting" and not st.get("backups")):
        gone, lost_here = missing_backups(project, st)
        if lost_here:
            raise ForktoolError(f"a backup of the sync to {st['to_spec']} is gone from this checkout", where=gone[0],
                                details=gone, hint=f"nothing was changed; `forktool sync --{what}` needs the "
                                "start's backups: put it back where it was (`forktool backup prune` keeps the "
                                "backups of a sync in progress, so it was moved or removed by hand)")
        raise ForktoolError(f"the sync to {st['to_spec']} was recorded elsewhere; this checkout has not reached "
                            "its stop", where=str(state_path(project)), details=[f"no {d}" for d in gone],
                            hint="run `forktool sync --start` to reach the same stop here; if this checkout did "
                                 "reach it and its backups were removed since, put them back first")
    return st


def _markers(text: bytes) -> list[tuple[int, bytes]]:
    """(line number, line) of each line that reads as a conflict-block marker."""
    return [(n, line) for n, line in enumerate(text.split(b"\n"), 1)
            if line.startswith(CONFLICT_PREFIXES) or line.rstrip(b"\r") == b"======="]


def conflict_lines(project: Project, rels: list[str],
                   own: Callable[[str], Counter[bytes]] = lambda _rel: Counter()) -> list[str]:
    """file:line of every conflict-block line left in these tree files. own(rel) counts the marker-like lines the
    file holds of its own (a lone `=======` rule upstream, or one the patch adds): the file must hold more of a line
    than that for them to be named."""
    out = []
    for rel in rels:
        p = project.tree / rel
        if p.is_symlink() or not p.is_file():
            continue
        marks = _markers(p.read_bytes())
        have = Counter(line.rstrip(b"\r") for _, line in marks)
        allowed = own(rel)
        out += [f"{TREE}/{rel}:{n}: {line.decode('utf-8', 'replace')[:60]}" for n, line in marks
                if have[line.rstrip(b"\r")] > allowed[line.rstrip(b"\r")]]
    return out


def continue_(project: Project, progress: Progress = lambda _m: None) -> dict:
    """Refuse while conflict blocks remain; else rewrite the stopped patch from the tree and go on."""
    t0 = time.monotonic()
    with txn.locked(project.state_dir):
        _recover(project, progress)
        st = _require(project, "continue")
        if st["stage"] in ("starting", "finishing", "finished"):
            with _left_in_progress(project):
                if st["stage"] == "starting":
                    if not st["backups"]:  # killed before the backups were recorded: the tree has not moved
                        ws = Workspace(project)
                        _back_up(project, st, ws, scan(project.tree), progress)
                    res = _run(project, st, {}, progress)
                elif st["stage"] == "finishing":
                    res = finish(project, st, progress)
                else:  # finished, and verify failed last time: check again
                    res = conclude(project, st, progress)
        else:
            ctx = context(project, st)
            k = st["position"]
            patch = disk_patch(project, ctx.original[k].name, {})
            before, expected = _stop_base(ctx)
            current = scan(project.tree)
            changed = {rel for _, rel in diff_manifests(expected, current)}
            rels = sorted(set(patch.paths) | changed)
            gone = [fd.path for fd in patch.files if not fd.is_deleted and fd.path not in current
                    and (fd.path in expected or preimage_path(project, fd.path).is_file())]
            if gone:
                raise ForktoolError(f"{gone[0]}, a file {patch.id} changes, is gone from the tree; taken so, "
                                    f"{patch.id} would delete it", where=f"{TREE}/{gone[0]}",
                                    details=[f"{TREE}/{rel}" for rel in gone[1:]],
                                    hint=f"nothing was changed; `forktool sync --skip` drops {patch.id}; "
                                         "`forktool sync --abort` goes back, and a `--start` again stops here with "
                                         "the file as the stop wrote it (the blocks you resolved are remembered)")
            def own(rel: str) -> Counter[bytes]:  # the marker-like lines of the text the stop began from, and the patch's
                base = before[rel] if rel in before else ctx.new_read(rel)
                added = b"".join(t for fd in patch.files if fd.path == rel for h in fd.hunks
                                 for op, t in h.lines if op == b"+")
                return Counter(line.rstrip(b"\r") for _, line in _markers(base or b"") + _markers(added))

            left = conflict_lines(project, rels, own)
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
                    raise ForktoolError(f"{rel} is a symlink; patches carry regular files only", where=f"{TREE}/{rel}",
                                        hint="nothing was changed; make it a regular file (or remove it, if you "
                                             "added it), then `forktool sync --continue`; `forktool sync --abort` "
                                             "goes back")
                new = (project.tree / rel).read_bytes() if e is not None else None
                mode = ctx.mode_of(rel) if old is not None else (e.mode if e else REGULAR)
                fd = series.diff_file(rel, old, new, mode if old is not None else None,
                                      (e.mode if e else None) if new is not None else None)
                if fd is not None:
                    fds.append(fd)
            if not fds:  # as git's rebase: a change that became empty is dropped on purpose, never carried as nothing
                raise ForktoolError(f"resolved as the tree stands, {patch.id} changes nothing: every file it touches "
                                    "holds the text the patches before it give on the new upstream",
                                    where=f"patches/{patch.name}", details=[f"{TREE}/{rel}" for rel in patch.paths],
                                    hint=f"nothing was changed; if the new upstream already does what {patch.id} did, "
                                         f"`forktool sync --skip` drops it (series comments it out, the file stays); "
                                         "else edit the files to keep its change, then `forktool sync --continue`")
            resolved, _ = with_derived_trailers(project, patch, fds)
            _harvest(project, st)
            # a reviewed merge taken as it stood stays `merged`; any edit makes it the maintainer's resolution
            how = "merged" if st["stop"].get("merged_diff_sha256") == resolved.diff_sha256 else "resolved"
            if how == "merged":  # the same bytes a sync without review writes (the patch's own trailers kept)
                order = {rel: n for n, rel in enumerate(patch.paths)}
                fds = sorted(resolved.files, key=lambda f: order.get(f.path, len(order)))
                resolved = series.parse_patch(series.with_files(patch, fds).raw, patch.name)
            with _left_in_progress(project):
                stopped = _compile_resolved(ctx, st, resolved, progress)
                if stopped is not None:
                    stopped["timings"] = {"tool_s": round(time.monotonic() - t0, 3)}
                    return stopped
                st["done"].append({"id": patch.id, "name": patch.name, "status": how, "drift": [],
                                   "files": [{"file": f.path, "status": how} for f in resolved.files],
                                   "api": (st.get("stop") or {}).get("api", [])})
                st["position"] = k + 1
                res = _run(project, st, {patch.name: resolved.raw}, progress)
            joined = sorted(f.path for f in resolved.files if f.path not in patch.paths)
            if joined:  # edits outside the stopped patch's files went into it: said, never silently
                res["joined"] = {"id": patch.id, "files": joined}
    res["timings"] = {"tool_s": round(time.monotonic() - t0, 3)}
    return res


def _compile_resolved(ctx: Context, st: dict, resolved: Patch, progress: Progress) -> dict | None:
    """After a resolution: the units the resolved patch's files feed compile for every profile on the tree as the
    maintainer left it, or the sync stops again at the same patch with the error (errors outside the conflict
    blocks show at the patch that causes them). None when it may go on."""
    from forktool.sync import compilegate

    project = ctx.project
    results, failed = compilegate.resolved(project, done_patches(ctx, {}), resolved, progress)
    st["stop"]["checked"] = compilegate.summary(results)
    if failed is None:
        return None
    st["stop"].update(compilegate.compile_stop(project, failed, results))
    st["stage"] = "stopped"
    txn.commit(project.root, sync_dir(project), [], st)
    return {"stage": "stopped", "state": st, "written": 0}


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
        ctx = context(project, st)
        _, expected = _stop_base(ctx)
        own = set(ctx.original[st["position"]].paths) | {f["file"] for f in stop["files"]} \
            | set(stop.get("remembered_files", []))
        elsewhere = sorted({rel for _, rel in diff_manifests(expected, scan(project.tree))} - own)
        if elsewhere:
            raise ForktoolError(f"{len(elsewhere)} file(s) outside {stop['id']} changed since the stop; --skip would "
                                "throw them away", where=f"{TREE}/{elsewhere[0]}",
                                details=[f"{TREE}/{rel}" for rel in elsewhere],
                                hint=f"nothing was changed; to keep them, `forktool sync --continue` carries them in "
                                     f"{stop['id']} (as `refresh` would); to drop them, undo those edits (remove the "
                                     f"files you added) and skip again; `forktool sync --abort` goes back")
        st["done"].append({"id": stop["id"], "name": stop["name"], "status": "skipped", "drift": [], "files": []})
        st["position"] += 1
        with _left_in_progress(project):
            res = _run(project, st, {}, progress)
    res["timings"] = {"tool_s": round(time.monotonic() - t0, 3)}
    return res


def _record_end(project: Project, how: str, st: dict) -> str:
    """Write ended.json (how the sync `st` ended: undone or aborted) before its own record goes, so that a later
    `--undo` can say so even when this process was killed after the work and before it could tell; returns the
    tree digest as it was left."""
    tree_digest = digest(scan(project.tree))
    rec = {"version": 1, "how": how, "from_spec": st["from_spec"], "to_spec": st["to_spec"],
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "tree_digest_before": st["tree_digest_before"],
           "tree_digest": tree_digest}
    try:
        atomic_write(ended_path(project), json.dumps(rec, indent=1, sort_keys=True).encode())
    except OSError:  # it only informs: a full disk or something planted there must not fail the undo or abort
        pass
    return tree_digest


def read_ended(project: Project) -> tuple[dict | None, str]:
    """How the last sync ended (ended.json), or None with why where the record cannot be read: it only informs, so
    a damaged one never blocks a command."""
    try:
        return schema.load_sync_ended(ended_path(project), project.state_dir), ""
    except ForktoolError as e:
        return None, f"{ended_path(project)} could not be read ({e.what}); {e.hint or 'delete it'}"


def abort(project: Project, progress: Progress = lambda _m: None) -> dict:
    """Pin, lock, patches, series, registry and tree back to the bytes they had before the start."""
    with txn.locked(project.state_dir):
        _recover(project, progress)
        st = _require(project, "abort")
        if not st["backups"]:  # killed before the backups were recorded: the tree has not moved
            st["stage"] = "aborted"
            tree_digest = _record_end(project, "aborted", st)
            state_path(project).unlink()
            return {"stage": "aborted", "state": st, "written": 0, "tree_digest": tree_digest, "backups": {}}
        kept = _harvest(project, st) if st["stage"] == "stopped" else 0
        writes = _restore_writes(project, st)
        st["stage"] = "aborted"
        txn.commit(project.root, sync_dir(project), writes, st)
        tree_digest = _record_end(project, "aborted", st)
        state_path(project).unlink()
    return {"stage": "aborted", "state": st, "written": len(writes), "tree_digest": tree_digest,
            "backups": st["backups"], "remembered": {"new": kept, "total": memory(project).count()}}


def _restore_writes(project: Project, st: dict) -> list[txn.Write]:
    """Writes that put tree, pin, lock, patches, series, state and registry back as the start's backups hold them."""
    tree_m, tree_c, _ = bk.load_for_restore(project.backups_dir / st["backups"]["tree"], vendor.objects(project).get)
    proj_m, proj_c, _ = bk.load_for_restore(project.state_dir / "sync-backups" / st["backups"]["project"],
                                           vendor.objects(project).get)
    writes = _tree_writes(project, {rel: (tree_c[rel], e.mode) for rel, e in tree_m.items()}, scan(project.tree))
    now = project_manifest(project)
    # a file the start did not record goes only from patches/ (the loop never adds one elsewhere)
    for rel in sorted(set(proj_m) | {r for r in now if r.startswith("patches/")}):
        if proj_m.get(rel) != now.get(rel):
            writes.append(txn.Write(rel, proj_c.get(rel), REGULAR))
    return writes


def _stop_base(ctx: Context) -> tuple[dict[str, bytes | None], Manifest]:
    """The contents the carried patches give (files they touch) and the whole tree they make, at a stop."""
    before = apply_series(done_patches(ctx, {}), ctx.new_read).files
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
    ctx = context(project, st)
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
        pre_path = preimage_path(project, rel)
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
            ended, unreadable = read_ended(project)
            if ended is not None and ended["how"] == "undone":  # an undo that finished, perhaps unreported
                return {"stage": "undone", "already": ended, "written": 0, "tree_digest": digest(scan(project.tree))}
            said = ([f"the last sync, to {ended['to_spec']}, was aborted at {ended['at']} (before it finished)"]
                    if ended is not None else [unreadable] if unreadable else [])
            raise ForktoolError("no finished sync to undo", where=str(undo_path(project)), details=said,
                                hint="a sync can be undone from its finish until the next `forktool sync --start`")
        if not has_backups(project, rec):
            raise ForktoolError(f"the backups of the sync to {rec['to_spec']} are gone", where=str(project.backups_dir),
                                details=[f".opencoti/vendor-backups/{rec['backups']['tree']}",
                                         f".opencoti/sync-backups/{rec['backups']['project']}"],
                                hint="nothing was changed; put the pin, lock, patches and registry back from git")
        writes = _restore_writes(project, rec)
        if not writes:  # already as before the start: an undo killed after its transaction; only the record is left
            tree_digest = _record_end(project, "undone", rec)
            undo_path(project).unlink()
            state_path(project).unlink(missing_ok=True)
            return {"stage": "undone", "state": rec, "written": 0, "tree_digest": tree_digest,
                    "backups": rec["backups"]}
        fin = rec["finished"]
        now = {rel: e.sha256 for rel, e in project_manifest(project).items()}
        moved = [rel for rel in sorted(set(now) | set(fin["files"])) if now.get(rel) != fin["files"].get(rel)]
        tree_now = digest(scan(project.tree))
        if tree_now != fin["tree_digest"]:
            moved.insert(0, f"{TREE} (tree digest {tree_now[:12]}, the finish left {fin['tree_digest'][:12]})")
        if moved:
            raise ForktoolError(f"{len(moved)} thing(s) changed since the sync to {rec['to_spec']} finished; undoing "
                                "it would lose them", where=str(project.root), details=moved,
                                hint="nothing was changed; put them back as the finish left them (e.g. `forktool "
                                     "apply` for the tree), or restore the start's backups by hand")
        txn.commit(project.root, sync_dir(project), writes, dict(rec, stage="aborted"))
        tree_digest = _record_end(project, "undone", rec)
        undo_path(project).unlink()
        state_path(project).unlink(missing_ok=True)
        txn.fault("sync-undone")  # the undo is done and not yet reported: the next `--undo` must say so
    return {"stage": "undone", "state": rec, "written": len(writes), "tree_digest": tree_digest,
            "backups": rec["backups"]}
