"""The whole trial job: fetch SPEC, trial the series, relocate hooks, diff build files, build, write outputs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from forktool import series, txn, vendor
from forktool.project import Project
from forktool.sync import buildfiles
from forktool.sync.accept import _repin_text, _series_text
from forktool.sync.fetch import fetch_target, pinned_manifest, resolve_spec
from forktool.sync.relocate import relocate_hooks
from forktool.sync.report import SyncResult, check_out, retire_outputs, write_outputs
from forktool.sync.scratch import run_build
from forktool.sync.trial import Reader, final_state, name_api_drift, trial
from forktool.tree import REGULAR, Manifest


def sync(project: Project, spec: str, *, build: bool, out: Path,
         progress: Callable[[str], None] = lambda _m: None, need_commit: bool = True) -> SyncResult:
    """Fetch SPEC, trial the series on it, relocate hooks, diff the build files, optionally build; write outputs.
    need_commit=False: a source that does not say its llama.cpp commit is tried all the same (fetch_target)."""
    from forktool.workspace import load_patches
    check_out(project, out)
    t_start = time.monotonic()
    from forktool.sync.loop import recover
    with txn.locked(project.state_dir):  # every journal a sync can leave, in one place, under the lock
        for note in recover(project):
            progress(note)
    old, new = resolve_spec(project, spec)
    pinned = pinned_manifest(project, progress)
    target = fetch_target(project, old, new, pinned, progress, need_commit=need_commit)
    t_fetched = time.monotonic()
    store = vendor.objects(project)

    def reader(m: Manifest) -> Reader:
        def read(rel: str) -> bytes | None:
            e = m.get(rel)
            return None if e is None else store.get(e.sha256)
        return read

    old_read, new_read = reader(pinned), reader(target.manifest)
    patches = load_patches(project, series.read_series(project.series_file))
    progress(f"trying {len(patches)} patch(es) on {target.new.spec}")
    results = trial(patches, old_read, new_read,
                    lambda rel: target.manifest[rel].mode if rel in target.manifest else REGULAR)
    t_trial = time.monotonic()
    # re-applying the refreshed patches proves they apply exactly on the new upstream
    final = final_state(results, new_read)

    def result_read(rel: str) -> bytes | None:
        return final[rel] if rel in final else new_read(rel)

    prefix = f"{old.name}/"
    progress("relocating hook sites")
    # the loop's relocator: the proposal is what a move with these results would write
    hooks, registry_yaml = relocate_hooks(project, result_read, target.manifest, prefix, final,
                                          {r.patch.id: r.refreshed for r in results if r.refreshed is not None},
                                          {r.patch.id for r in results if r.status == "upstreamed"})
    # a site whose patch did not apply was looked for in a tree without that patch: where its symbol stands
    # upstream says nothing of where the marker would be, so it is not checked (never found, moved or vanished)
    unapplied = {r.patch.id: r.status for r in results if r.status in ("conflict", "blocked")}
    for row in hooks.get("sites", []):
        if row["patch"] in unapplied and row["status"] != "added":
            row.update(status="not_checked", new_file=None, new_line=None,
                       reason=f"patch {row['patch']} is {unapplied[row['patch']]} here")
    t_hooks = time.monotonic()
    progress("naming the upstream API drift the patches use")
    from forktool.cache import caches_root
    name_api_drift(results, pinned, old_read, target.manifest, new_read, caches_root(project.state_dir))
    progress("configuring both trees for the build-file drift")
    # under .opencoti/tmp/ (two whole upstream trees and their CMake build directories), never $TMPDIR: one that a
    # SIGTERM or a kill leaves is removed by the next fetch or sync
    with vendor.temp_dir(project, "forktool-drift-") as work:
        drift = buildfiles.drift(_drift_flags(project), old_read, new_read, sorted(pinned), sorted(target.manifest),
                                 prefix, work)
    series_text = _series_text(results, project.series_file.read_text(encoding="utf-8"), target.new.spec)
    yaml_text = _repin_text(project.vendor_yaml.read_text(encoding="utf-8"), old.name, target.new)
    t_analysis = time.monotonic()
    build_res: dict = {"status": "not_run", "reason": "--build not given"}
    if build:
        if any(r.status in ("conflict", "blocked") for r in results):
            build_res = {"status": "skipped", "reason": "some patches do not apply on the new upstream"}
        else:
            retire_outputs(out)  # the reports of the trial before never stand beside this trial's build
            build_res = run_build(project, out / "build-project", yaml_text, results, series_text, progress)
    timings = {"fetch_s": round(t_fetched - t_start, 3), "trial_s": round(t_trial - t_fetched, 3),
               "hooks_s": round(t_hooks - t_trial, 3), "analysis_s": round(t_analysis - t_fetched, 3),
               "build_s": build_res.get("seconds", 0.0), "fetch_from_cache": target.from_cache}
    res = SyncResult(target, results, hooks, drift, build_res, timings, series_text, yaml_text, registry_yaml)
    write_outputs(out, res)
    res.timings["total_s"] = round(time.monotonic() - t_start, 3)
    return res



def _drift_flags(project: Project) -> list[str] | None:
    """The cpu profile's CMake flags (the first profile's without one), None when the project has no profiles."""
    from forktool.build import load_config
    from forktool.errors import ForktoolError

    try:
        cfg = load_config(project)
    except ForktoolError:
        return None
    prof = cfg.profiles.get("cpu") or next(iter(cfg.profiles.values()), None)
    return list(prof.flags) if prof else None
