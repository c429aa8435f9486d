"""apply, unapply, status, verify, new, refresh: moving and checking the vendored tree."""

from __future__ import annotations

from forktool import output, vendor
from forktool.commands import open_workspace
from forktool.errors import ApplyError, ContextError, ForktoolError, check_id, check_line
from forktool.output import Report
from forktool.project import Project
from forktool.workspace import Workspace, require_tree


def _moved(ws: Workspace, what: str, res: dict) -> Report:
    lines = []
    if res["forced"]:
        lines.append(f"[yellow]--force:[/yellow] backed up and overwrote {len(res['forced'])} locally changed file(s), "
                     "your edits to:")
        lines += [output.escape(f"  {c['change']}: {c['path']}") for c in res["forced_changes"]]
    if res["written"]:
        # a tree written where there was none has nothing to back up, so no backup is named
        taken = f"backup [bold]{res['backup']}[/bold]" if res["backup"] else "no backup (there was no tree to keep)"
        lines.append(f"{what}: wrote {len(res['written'])} file(s); {taken}")
    elif res.get("materialised"):
        lines.append(f"{what}: there was no vendored tree: wrote the pristine upstream there, no patch applied")
    else:
        lines.append(f"{what}: nothing to do, the tree is already there")
    if res["forced"] and res["backup"]:
        lines.append(f"the edits are in backup [bold]{res['backup']}[/bold]: `forktool backup restore {res['backup']}` "
                     f"puts the tree back as it was before this {what}, edits included")
    for d in res["drift"]:
        lines.append(f"[yellow]drift:[/yellow] {d['patch']} {output.escape(d['file'])} hunk #{d['hunk']} at offset "
                     f"{d['offset']:+d}")
    top = ws.state.top
    lines.append(f"top: {top or 'none (pristine)'} ({len(ws.state.applied)}/{len(ws.patches)} applied)")
    res = dict(res, top=top, applied=[a["id"] for a in ws.state.applied], total=len(ws.patches))
    return Report(res, lines)


def apply(project: Project, upto: str | None, force: bool, reanchor: bool = False) -> Report:
    check_id(upto, "--upto")
    try:
        return _apply(project, upto, force, reanchor)
    except ApplyError as e:
        if not isinstance(e, ContextError):
            raise  # a file missing or already there: no merge of the patch's hunks carries that across
        if not reanchor:
            # `refresh` of a patch that is not applied is refused: name the way that carries it across instead
            if e.below:
                e.hint = (f"a patch below it ({', '.join(e.below)}) changed the text it was written against: "
                          "`forktool apply --reanchor` carries the series onto it, stopping at conflict blocks like "
                          "a sync (`forktool sync --continue` / `--abort`)")
            else:  # upstream's text is what it was written against: no patch below explains the difference
                e.hint = (f"no patch below it changes {e.path}, so patches/{e.patch} differs from the upstream text "
                          f"it was written against (the patch was edited, or the pin moved): restore it (`git "
                          f"checkout -- patches/{e.patch}`) or correct that hunk; `forktool apply --reanchor` carries "
                          "it across as a 3-way merge, stopping at conflict blocks like a sync")
            raise
        if upto is not None or force:
            raise
    from forktool.commands import sync_cmds
    from forktool.sync import loop
    output.info("a patch does not apply on the patches below it: re-anchoring as a sync onto the changed base")
    return sync_cmds.loop_report(project, loop.start_reanchor(project, output.info))


def _apply(project: Project, upto: str | None, force: bool, reanchor: bool) -> Report:
    with open_workspace(project) as ws:
        end = ws.index(upto) + 1 if upto else len(ws.patches)
        label = f"apply-{ws.patches[end - 1].id}" if end else "apply-none"
        reanchored: list[str] = []
        if reanchor:
            from forktool import authoring  # the patch writer, loaded only when patches are rewritten

            reanchored = authoring.reanchor(ws, end)
        try:
            res = ws.goto(ws.patches[:end], force=force, label=label)
        except ContextError as e:
            names = [p.name for p in ws.patches]
            at = names.index(e.patch) if e.patch in names else 0
            e.below = tuple(p.id for p in ws.patches[:at] if e.path in p.paths)
            raise
        if reanchored:
            authoring.write_patches(ws, reanchored)
        rep = _moved(ws, "apply", res)
        rep.data["reanchored"] = reanchored
        if reanchored:
            rep.lines.append(f"re-anchored {', '.join(reanchored)}: same changes, canonical bytes on the current base")
        if reanchor:
            rep.data["registry"] = authoring.keep_registry(ws, None)
            rep.lines.append(output.escape(f"registry: {rep.data['registry']}"))
        if ws.record_patched():
            rep.lines.append("recorded the patched tree digest of this series in vendor/vendor.lock")
            rep.data["recorded_lock"] = True
        else:
            rep.data["recorded_lock"] = False
        return rep


def unapply(project: Project, to: str | None, force: bool) -> Report:
    check_id(to, "--to")
    with open_workspace(project) as ws:
        end = ws.index(to) + 1 if to else 0
        label = f"unapply-to-{to}" if to else "unapply-all"
        return _moved(ws, "unapply", ws.goto(ws.patches[:end], force=force, label=label))


def status(project: Project) -> Report:
    from forktool.state import sync_state_path

    if sync_state_path(project.state_dir).is_file():  # a sync in progress: say where it stands
        from forktool.commands import sync_cmds
        rep = sync_cmds.status_report(project)
        if rep is not None:
            return rep
    with open_workspace(project) as ws:
        # no tree, no patch on disk: what the state recorded is not shown as applied (`apply` starts over from
        # pristine there)
        absent = not project.tree.exists()
        on_disk = [] if absent else ws.state.applied
        top = None if absent else ws.state.top
        applied = {a["id"]: a for a in on_disk}
        stale = set() if absent else set(ws.applied_stale())
        rows = []
        lines = []
        for p in ws.patches:
            a = applied.get(p.id)
            st = "applied" if a and p.id not in stale else ("changed" if a else "unapplied")
            drift = a["drift"] if a else []
            rows.append({"id": p.id, "name": p.name, "title": p.title, "state": st, "drift": drift,
                         "files": p.paths})
            mark = {"applied": "[green]+[/green]", "changed": "[yellow]~[/yellow]", "unapplied": "[dim]-[/dim]"}[st]
            # titles and paths are shown as written, never read as markup (a title `a [red]b[/red]` showed `a b`)
            shown = output.escape(", ".join(f"{d['file']}#{d['hunk']}{d['offset']:+d}" for d in drift))
            dr = f" [yellow]drift {shown}[/yellow]" if drift else ""
            lines.append(f"{mark} {p.id} {output.escape(p.title)} ({len(p.paths)} file(s)){dr}")
        # applied patches the series no longer names (a line removed from patches/series): they are in the tree
        named = {p.id for p in ws.patches}
        gone = [a for a in on_disk if a["id"] not in named]
        for a in gone:
            lines.append(f"[red]![/red] {a['id']} {a['name']}: applied, but patches/series no longer names it "
                         "(`forktool apply` takes it off the tree; put the line back to keep it)")
        changes = [] if absent else ws.local_changes()
        tree = "absent" if absent else ("dirty" if changes else "clean")
        lines.append(f"tree: {tree}; top: {top or 'none'}; "
                     f"{len(on_disk) - len(gone)}/{len(ws.patches)} applied"
                     + (f", and {len(gone)} not in the series" if gone else ""))
        if absent:
            recorded = f" (the state records {ws.state.top} as its top)" if ws.state.top else ""
            lines.append(f"  {output.escape(str(project.tree))} does not exist, so no patch is applied{recorded}; "
                         "next: `forktool apply` writes pristine + the series there")
        for s, path in changes[:50]:
            lines.append(f"  [yellow]{s}[/yellow] {output.escape(path)}")
        if changes and ws.no_record_note():
            lines.append(f"[yellow]note:[/yellow] {ws.no_record_note().removesuffix(' Otherwise: ')}")
        moves = vendor.pin_moves(project)  # "clean" is against the upstream the lock records: a moved pin is said apart
        for m in moves:
            lines.append(f"[yellow]pin moved: {output.escape(m)}[/yellow]")
        if moves:
            lines.append("  next: `forktool unapply`, remove vendor/llamafile, then `forktool vendor fetch && forktool "
                         "apply` (docs/sync.md)")
        return Report({"patches": rows, "tree": tree, "top": top,
                       "local_changes": [{"status": s, "path": path} for s, path in changes],
                       "applied_not_in_series": [a["id"] for a in gone],
                       "pristine_digest": ws.pristine_digest, "pin_moved": moves}, lines)


NOT_READ = "not checked"  # a profile's compile status under verify --no-cache
NO_REGISTRY = "registry: not checked (no registry/UPSTREAM_SYNC.yaml, so no marker in the tree was checked)"


def tree_digest_line(v: dict) -> str:
    """What a passing verify says of the tree digest: the lock's record for the whole series, the pristine tree for
    a series that names no patch (nothing to apply, so nothing is missing), else that the series is not all applied."""
    from forktool.series import series_digest

    head = f"tree digest {v['tree_digest'][:12]}"
    if v["full_series"]:
        return head + " equals vendor.lock's record for this series"
    if not v["applied"] and v["series_digest"] == series_digest(()):
        # ok means no file differs from the pristine tree plus the applied patches, and none is applied
        return head + " is the pristine tree (the series names no patch)"
    return head + " (series not fully applied)"


def registry_line(registry: dict | None) -> str:
    """What a passing verify says of the registry check (its summary): OK with its counts, or not checked where
    the project keeps no registry."""
    if registry is None:
        return f"[yellow]{NO_REGISTRY}[/yellow]"
    return f"registry: OK ({registry['patches']} patches, {registry['hooks']} hooks, all markers at their sites)"


def verify(project: Project, use_cache: bool = True) -> Report:
    from forktool.build.check import NO_CHECK, profile_judgements
    from forktool.regcheck import Problem
    from forktool.verification import verify as run_verify

    with open_workspace(project, use_cache) as ws:
        require_tree(project.tree, ", so there is no tree to verify",
                     "`forktool apply` writes pristine + the series there; then `forktool verify`")
        v = run_verify(ws)
        unrecorded = ws.no_record_note()
    data = v.to_json()
    data["not_checked"] = ["registry"] if v.registry is None else []  # what verify's OK does not cover
    judged = profile_judgements(project, v.series_digest, v.tree_digest)
    compiled = data["compiled"] = {name: st for name, (st, _why) in judged.items()}
    data["not_compiled_why"] = {name: why for name, (st, why) in judged.items() if why}
    if not use_cache:
        # a recorded compile check is remembered, not proved by this run: --no-cache reads none, so a record
        # the checkout carries cannot say a profile compiled
        compiled = data["compiled"] = {name: NOT_READ for name in compiled}
        data["not_compiled_why"] = {}
    by = {st: [n for n, s in compiled.items() if s == st] for st in ("compiled", "failed", "not compiled", NOT_READ)}
    compile_lines = [f"[green]compiled for this series and tree: {', '.join(by['compiled'])}[/green]"] * bool(
        by["compiled"]) + [f"[yellow]not compiled for this series and tree: {', '.join(by['not compiled'])}[/yellow]"
                           " (`forktool build --check --all`)"] * bool(by["not compiled"]) + [
        f"[yellow]compile checks not read (--no-cache reads no recorded check): {', '.join(by[NOT_READ])}; "
        "`forktool build --check --all` compiles them[/yellow]"] * bool(by[NOT_READ]) + [
        # why a recorded check no longer counts (a profile never checked needs no reason beside the line above)
        f"[yellow]  {name}: {output.escape(why)}[/yellow]" for name, why in data["not_compiled_why"].items()
        if why != NO_CHECK]
    if v.ok and by["failed"]:
        v.ok, data["ok"] = False, False  # the last scoped check of this very tree failed to compile
        v.problems.append(Problem(".opencoti/compile-checks.json", f"the last compile check of this series failed "
                                  f"for {', '.join(by['failed'])} (`forktool build --check --all` shows the cause)"))
        data["problems"] = [{"where": p.where, "what": p.what} for p in v.problems]
    if v.ok:
        lines = [f"pristine cache matches vendor.lock ({ws.pristine_digest[:12]})",
                 f"{v.exported} applied patch(es) re-exported byte for byte",
                 tree_digest_line(data)]
        lines.append(registry_line(v.registry))
        lines += [f"[yellow]advisory:[/yellow] {output.escape(a)}" for a in v.advisories]
        lines += compile_lines
        lines.append("[green]verify: OK[/green]" + (f"; not compiled: {', '.join(by['not compiled'])}" if
                                                     by["not compiled"] else "")
                     + (f"; compile not checked: {', '.join(by[NOT_READ])}" if by[NOT_READ] else "")
                     + ("; registry not checked" if v.registry is None else "")
                     + (" (cached verdict: no input changed)" if v.cached else ""))
        return Report(data, lines)
    data["error"] = f"verify found {len(v.problems)} difference(s)"
    lines = [f"[red]✗[/red] {output.escape(str(p))}" for p in v.problems]
    lines += [f"[yellow]{NO_REGISTRY}[/yellow]"] * (v.registry is None)
    lines += [f"[yellow]advisory:[/yellow] {output.escape(a)}" for a in v.advisories] + compile_lines
    lines.append(f"[red]error:[/red] verify found {len(v.problems)} difference(s) "
                 f"(tree digest {v.tree_digest[:12]})")
    # with no state.json every patched file reads as an edit: say why before "fix each item"
    lines.append(f"  next: {unrecorded}fix each item, then run `forktool verify` again")
    return Report(data, lines, exit_code=1)


def refresh(project: Project, pid: str) -> Report:
    from forktool import authoring

    check_id(pid, "ID")
    with open_workspace(project) as ws:
        res = authoring.refresh(ws, pid)
    word = "rewrote" if res["changed"] else "unchanged:"
    lines = [f"{word} patches/{res['patch']} ({len(res['files'])} file(s); hooks: {res['hooks'] or 'none'}; "
             f"build impact: {res['build_impact'] or 'none'})"]
    if res.get("reanchored"):
        lines.append(f"re-anchored above it: {', '.join(res['reanchored'])} (same changes, canonical bytes)")
    lines.append(output.escape(f"registry: {res['registry']}"))
    return Report(res, lines)


def new(project: Project, slug: str, title: str, author: str, patch_id: str | None = None) -> Report:
    from forktool import authoring

    title, author = check_line(title, "--title"), check_line(author, "--author")
    check_id(patch_id, "--id")
    with open_workspace(project) as ws:
        # the new patch goes after the top applied on disk: with no tree, or a tree and no record of what it holds,
        # that top is not known
        require_tree(project.tree, ", so no patch is applied to insert the new one after",
                     "`forktool apply --upto ID` makes the tree with the series up to the patch the new one follows; "
                     "then `forktool new SLUG`")
        if not (project.state_dir / "state.json").exists() and ws.local_changes():
            raise ForktoolError("there is no .opencoti/state.json, the record of what is applied, so the top the new "
                                "patch would follow is not known", where=str(project.state_dir / "state.json"),
                                hint="if the tree holds the series, `forktool apply --force` backs it up and applies "
                                     "it again (which records it); then `forktool new SLUG`")
        res = authoring.new(ws, slug, title, author, patch_id)
    return Report(res, [f"created patches/{res['patch']} after {res['after'] or 'the start'}; "
                        f"edit the tree, then `forktool refresh {res['id']}`", f"registry: {res['registry']}"])


def vendor_fetch(project: Project, sdist: str | None, use_cache: bool = True) -> Report:
    from pathlib import Path

    from forktool.tree import check_root

    check_root(project.tree)  # a file or link there is refused before anything is fetched ("already present")
    res = vendor.fetch_pristine(project, local_sdist=Path(sdist) if sdist else None, progress=output.info,
                                use_cache=use_cache)
    lines = [f"pristine {res.digest[:12]}: {res.files} files" + (" (from cache)" if res.from_cache else
                                                                   f" ({res.skipped} filtered out)")]
    materialised = False
    if not project.tree.exists():
        with open_workspace(project, use_cache) as ws:
            ws.goto([], force=False, label="fetch")
        materialised = True
        lines.append(f"materialised {project.tree}")
    else:
        lines.append(f"vendored tree already present at {project.tree} (use `forktool status`)")
    return Report({"pristine_digest": res.digest, "files": res.files, "from_cache": res.from_cache,
                   "materialised": materialised, "tree": str(project.tree)}, lines)


def vendor_status(project: Project) -> Report:
    from forktool.tree import check_root

    check_root(project.tree)  # a file there is neither "present" nor "absent"
    lock = vendor.load_lock(project)
    problems = vendor.verify_pristine_cache(project) if lock else ["no vendor.lock yet"]
    comps = [{"name": c.name, "kind": c.kind, "spec": c.spec, "upstream_commit": c.upstream_commit}
             for c in project.vendor.components]
    lines = [f"{c['name']}: {c['spec']} (upstream {c['upstream_commit'][:12]})" for c in comps]
    lines.append(f"pristine digest {lock.get('pristine_digest', '?')[:12]}, {lock.get('pristine_files', '?')} files; "
                 f"tree {'present' if project.tree.exists() else 'absent'}")
    lines += [f"[yellow]{p}[/yellow]" for p in problems]
    return Report({"components": comps, "pristine_digest": lock.get("pristine_digest"),
                   "pristine_files": lock.get("pristine_files"), "problems": problems,
                   "tree_present": project.tree.exists()}, lines, exit_code=1 if problems else 0)
