"""sync: trial the series on another upstream, write the report and refreshed patches, optionally accept."""

from __future__ import annotations

from pathlib import Path

from forktool import output, schema
from forktool import sync as s
from forktool.errors import ForktoolError, UsageError
from forktool.output import Report
from forktool.project import Project


def sync(project: Project, spec: str, accept: bool, build: bool, out: str) -> Report:
    from forktool.sync.move import read_state, state_path

    running = read_state(project)
    if running is not None and (accept or running["stage"] != "finished"):
        # the stopped loop owns patches/: the patches it carried are rewritten for its upstream, the rest are not, so
        # a trial of that mix would report on neither series; --accept would rewrite pin and patches under it at any
        # stage, finished included (its verify failed: `--continue` checks again, `--abort` goes back)
        raise ForktoolError(f"{'--accept' if accept else 'sync trial'} refused: a sync to {running['to_spec']} is in "
                            f"progress ({running['stage']}), and patches/ holds the series half carried by it",
                            where=str(state_path(project)),
                            hint="nothing was changed or written; finish that sync (`forktool sync --continue`, "
                                 "`--skip`) or `forktool sync --abort` it, then run the trial again")
    out_dir = Path(out) if Path(out).is_absolute() else project.root / out
    # a trial records nothing, so it runs on a source that does not say its llama.cpp commit; --accept repins
    res = s.sync(project, spec, build=build, out=out_dir, progress=output.info, need_commit=accept)
    data = res.report()
    data.update(out=str(out_dir), timings=res.timings)
    counts = res.counts
    lines = [f"sync {res.target.old.spec} -> {res.target.new.spec} "
             f"(sha256 {res.target.new.sha256[:12] or 'n/a'}, upstream {res.target.new.upstream_commit[:12] or '?'})"]
    if not res.target.new.upstream_commit and res.target.old.upstream_commit:
        lines.append(f"[yellow]upstream commit: {res.target.new.spec} does not say which llama.cpp commit it "
                     "carries; tried all the same (a trial records nothing), but `--start` and `--accept` need "
                     "--upstream-commit COMMIT[/yellow]")
    colour = {"clean": "green", "offset": "yellow", "merged": "yellow", "conflict": "red", "upstreamed": "cyan",
              "blocked": "red"}
    for r in res.results:
        extra = ""
        if r.status == "offset":
            extra = " " + ", ".join(f"{d['file']}#{d['hunk']}{d['offset']:+d}" for d in r.drift)
        elif r.status == "blocked":
            extra = f" by {', '.join(r.blocked_by)}"
            if r.ahead:
                blocks = sum(len(f["conflicts"]) for f in r.ahead["files"])
                extra += f" (ahead: {r.ahead['status']}" + (f", {blocks} block(s)" if blocks else "") + ")"
        elif r.status in ("merged", "conflict", "upstreamed"):
            extra = " " + ", ".join(f"{f.path}: {f.status}" for f in r.files if f.status != "clean")
        shown = output.escape(f"{r.patch.id} {r.patch.title}{extra}")  # a title or path is never read as markup
        lines.append(f"[{colour[r.status]}]{r.status:>10}[/{colour[r.status]}] {shown}")
    for r in res.results:
        for d in r.api:
            lines.append(f"[yellow]api drift[/yellow]: {d['line']}")
    unchecked: dict[str, int] = {}  # sites of patches that did not apply here: one line, not one a site
    for site in res.hooks.get("sites", []):
        if site["status"] == "not_checked":
            unchecked[site["hook"]] = unchecked.get(site["hook"], 0) + 1
        elif site["status"] != "found":
            lines.append(f"hook {site['hook']}: {site['symbol']} {site['status']} "
                         f"({site['file']}:{site['line']} -> {site['new_file']}:{site['new_line']})")
    if unchecked:
        lines.append(f"hook sites not checked (their patch did not apply here): {sum(unchecked.values())} in "
                     f"{len(unchecked)} hook(s), " + ", ".join(f"{h} {n}" for h, n in sorted(unchecked.items()))
                     + f"; each in {out_dir}/report.md")
    for b in res.build_files:
        if b.get("not_checked"):
            continue
        if b["added"] or b["removed"] or b["note"]:
            lines.append(f"build files {b['target']}: +{len(b['added'])} -{len(b['removed'])} {b['note']}".rstrip())
    unread = [b for b in res.build_files if b.get("not_checked")]
    if unread:  # no source list to compare: said, never left to read as unchanged
        lines.append("[yellow]build files not checked[/yellow]: " + output.escape(
            ", ".join(f"{b['target']} ({b['not_checked']})" for b in unread)))
    lines.append("counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if res.build["status"] == "ok":  # which profile was built, and that the others were not
        n = res.build["objects"]
        compiled = "objects compiled not read: its --json output was not a build report" if n is None \
            else f"{n} object(s) compiled"
        lines.append(f"build: the {res.build['profile']} profile built ({compiled}, "
                     f"{res.build['seconds']} s); no other profile was built or compiled")
    else:
        lines.append(f"build: {res.build['status']}" + (f" ({res.build.get('reason')})" if res.build.get("reason")
                                                        else ""))
    t = res.timings
    lines.append(f"time: fetch {t['fetch_s']:.1f} s{' (cached)' if t['fetch_from_cache'] else ''}, "
                 f"trial {t['trial_s']:.1f} s, total {t['total_s']:.1f} s")
    lines.append(f"wrote {out_dir}/report.md, report.json and patches/")
    code = 1 if res.needs_human else 0
    if accept:
        acc = s.accept(project, res)
        data["accepted"] = acc
        lines.append(f"[green]accepted[/green]: wrote {', '.join(acc['written']) or 'nothing'}; backup {acc['backup']}")
        lines.append(acc["next"])
        code = 0  # taken on purpose: what needed review is in the report
    return Report(data, lines, exit_code=code)


NEXT = ("edit the files above (each `<<<<<<< patch` ... `>>>>>>> new upstream` block: keep what the patch means on "
        "the new upstream, delete the markers), then run `forktool sync --continue`; `forktool sync --skip` drops "
        "{id}; `forktool sync --abort` puts pin, lock, patches and tree back as they were")
REVIEW = ("review the merged hunks above in the tree (edit them if the merge is wrong), then run `forktool sync "
          "--continue`; `forktool sync --skip` drops {id}; `forktool sync --abort` puts pin, lock, patches and tree "
          "back as they were")
REMEMBERED = ("check the files above (every conflict block was resolved as you resolved it before), then run "
              "`forktool sync --continue`; `forktool sync --skip` drops {id}; `forktool sync --abort` puts pin, lock, "
              "patches and tree back as they were")
GONE = ("no conflict block to edit: the file(s) above could not be merged (the reason is beside each); make {id}'s "
        "change where its code now lives (edit those files in vendor/llamafile), then run "
        "`forktool sync --continue`; `forktool sync --skip` drops {id}; `forktool sync --abort` puts pin, lock, "
        "patches and tree back as they were")
REVIEW_LINES_MAX = 60


def _title(st: dict) -> str:
    if st.get("kind") == "reanchor":
        return "re-anchoring the series onto its edited patches (forktool apply --reanchor)"
    return f"sync {st['from_spec']} -> {st['to_spec']}"


def _next(st: dict) -> str:
    stop = st["stop"]
    if stop.get("kind") == "compile":
        return COMPILE_NEXT.format(id=stop["id"])
    if stop.get("kind") == "merged":
        # only `sync --start` takes --no-review-merged: `apply --reanchor` always stops at a merge
        return REVIEW.format(id=stop["id"]) + ("" if st.get("kind") == "reanchor" else
                                                " (`--no-review-merged` at the start carries merges without stopping)")
    if not any(f["blocks"] for f in stop["files"]) and any(f.get("remembered") for f in stop["files"]):
        return REMEMBERED.format(id=stop["id"])
    if not any(f["blocks"] for f in stop["files"]):  # a file gone upstream (or a patch that fails on the pin too)
        return GONE.format(id=stop["id"])
    if st.get("kind") == "reanchor":
        return NEXT.format(id=stop["id"]).replace("`>>>>>>> new upstream`", "`>>>>>>> the tree now`").replace(
            "on the new upstream", "on the edited patches below it")
    return NEXT.format(id=stop["id"])


COMPILE_NEXT = ("the tree holds the patches before {id} and {id} itself: fix the compile error above in "
                "vendor/llamafile (what {id} means on the new upstream), then run `forktool sync --continue`; "
                "`forktool sync --skip` drops {id}; `forktool sync --abort` puts everything back")


def _summary(st: dict) -> dict:
    names = [n for n, _ in st["original"]]
    return {"stage": st["stage"], "from": st["from_spec"], "to": st["to_spec"], "position": st["position"],
            "done": st["done"], "stop": st.get("stop"), "remaining": names[st["position"]:],
            "backups": st["backups"]}


def loop_lines(st: dict) -> list[str]:
    """Where a sync stands: done patches with their status, the stop with files, hunks and blocks."""
    lines = [f"{_title(st)}: {st['stage']}"]
    colour = {"clean": "green", "offset": "yellow", "merged": "yellow", "resolved": "cyan", "upstreamed": "cyan",
              "skipped": "magenta"}
    for d in st["done"]:
        c = colour.get(d["status"], "white")
        extra = ", ".join(f"{f['file']}: {f['status']}" for f in d["files"] if f["status"] not in ("clean", "resolved"))
        lines.append(f"  [{c}]{d['status']:>10}[/{c}] {d['id']} {d['name']}" + (f" ({extra})" if extra else ""))
        lines += [f"             [yellow]api drift[/yellow]: {a}" for a in d.get("api", [])]
    stop = st.get("stop")
    if stop and st["stage"] == "stopped":
        kind = stop.get("kind", "conflict")
        word = {"conflict": "[red]  conflict[/red]", "compile": "[red]   compile[/red]"}.get(kind,
                                                                                        "[yellow]    review[/yellow]")
        lines.append(f"  {word} {stop['id']} {output.escape(stop['title'])}" + (" (a 3-way merge without conflict: look at it "
                                                                 "before it is carried)" if kind == "merged" else ""))
        if kind == "compile":
            c = stop["compile"]
            lines.append(f"             {c['profile']} profile: {output.escape(c['cause'])} (at {c['where']}; "
                         f"log {c['log']})")
        if stop.get("checked"):  # what the compile check at this stop compiled; a profile it could not is said so
            lines.append("             compile check: " + "; ".join(
                f"{c['profile']} {c['status']}" + (f" ({c['reason']})" if c["reason"] else f" ({c['units']} unit(s))")
                for c in stop["checked"]))
        lines += [f"             [yellow]api drift[/yellow]: {a}" for a in stop.get("api", [])]
        for f in stop["files"]:
            hunks = ", ".join(f"#{h['hunk']} {h['how']}" for h in f["hunks"])
            blocks = ", ".join(str(n) for n in f["blocks"])
            what = f"{f['status']}" + (f", hunks {hunks}" if hunks else "") + \
                (f"; conflict block(s) at line {blocks}" if blocks else "")
            if f["status"] == "conflict" and not f["blocks"] and f.get("reason"):  # no block to edit: say why
                what += f"; {output.escape(f['reason'])}"
            if f.get("remembered"):
                what += f"; {f['remembered']} block(s) resolved as you resolved them before (check them)"
            lines.append(f"             vendor/llamafile/{f['file']}: {what}")
        if kind == "merged" and stop.get("review"):
            review = stop["review"].split("\n")
            body = review[next((i for i, ln in enumerate(review) if ln.startswith("diff --git")), 0):]
            lines += [f"    {output.escape(ln)}" for ln in body[:REVIEW_LINES_MAX] if ln]
            if len(body) > REVIEW_LINES_MAX:
                lines.append(f"    ... {len(body) - REVIEW_LINES_MAX} more line(s): `git diff --no-index` or the tree")
    if stop and st["stage"] == "stopped" and stop.get("remembered_files"):
        shown = ", ".join(stop["remembered_files"][:5]) + (" ..." if len(stop["remembered_files"]) > 5 else "")
        lines.append(f"  {len(stop['remembered_files'])} file(s) put back as you left them when this stop read "
                     f"the same before (edits outside the blocks too; check them): {shown}")
    names = [n for n, _ in st["original"]]
    rest = names[st["position"] + (1 if stop and st["stage"] == "stopped" else 0):]
    if rest and st["stage"] == "stopped":
        lines.append(f"  still to carry: {', '.join(rest)}")
    return lines


def _verify_lines(v: dict) -> list[str]:
    from forktool.commands.tree_cmds import registry_line, tree_digest_line

    if v.get("ok"):
        reg = v.get("registry")
        return ([f"{v['exported']} applied patch(es) re-exported byte for byte", tree_digest_line(v)]
                + [output.plain(registry_line(reg))] + [f"advisory: {a}" for a in v.get("advisories", [])]
                + ["verify: OK" + ("; registry not checked" if reg is None else "")])
    return [f"verify failed: {len(v['problems'])} difference(s)"] + \
        [f"  {p['where']}: {p['what']}" for p in v["problems"]]


SUMMARY_LINES = 14  # the finish's terminal summary, before its `time:` line


def _finish_report(project: Project, st: dict, res: dict) -> tuple[list[str], list[str], Path]:
    """(short summary for the terminal, every detail for the report file, that file's path)."""
    from forktool.sync import loop
    counts: dict[str, int] = {}
    for d in st["done"]:
        counts[d["status"]] = counts.get(d["status"], 0) + 1
    hooks = st.get("hooks", {}).get("sites", [])
    moved: dict[str, int] = {}
    for h in hooks:
        moved[h["status"]] = moved.get(h["status"], 0) + 1
    reg_diff = loop.registry_diff(project, st)
    v = res.get("verify", {})
    plan = res.get("build_plan", {})
    path = loop.report_path(project)
    short = [f"{_title(st)}: finished; {len(st['done'])} patch(es): "
             + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))]
    # the end of the summary first: what is left of SUMMARY_LINES goes to the patches a person should look at
    tail: list[str] = []
    if hooks:
        tail.append("hook sites: " + ", ".join(f"{n} {k}" for k, n in sorted(moved.items()))
                    + (f"; registry sites rewritten ({len(reg_diff)} diff line(s))" if reg_diff else ""))
    compiled = st.get("compile", [])
    if compiled:  # what the compile gate compiled for the moved series; a profile it could not is said so
        tail.append("compile: " + "; ".join(
            f"{c['profile']} {c['status']}" + (f" ({c['reason']})" if c["reason"] else f" ({c['units']} unit(s))")
            for c in compiled))
    if v.get("ok"):
        tail.append("[green]verify: OK[/green]" + ("; registry not checked" if v.get("registry") is None else "")
                    + ("; the series is carried onto its edited patches" if st.get("kind") == "reanchor"
                       else "; moved the pin to " + st["to_spec"]))
    else:
        tail.append(f"[red]verify failed[/red]: {len(v.get('problems', []))} difference(s); the sync stays in "
                    "progress")
        tail += [f"  {output.escape(p['where'])}: {output.escape(p['what'])}" for p in v.get("problems", [])[:3]]
        tail.append("fix them and run `forktool sync --continue` to verify again, or `forktool sync --abort`")
    if plan.get("lines"):
        tail.append(f"build plan (cpu): {plan['lines'][0]}")
    tail.append(f"details: {path.relative_to(project.root)}"
                + ("; undo the whole move with `forktool sync --undo` (until the next sync)" if v.get("ok") else ""))
    # what a person should look at: patches not carried as written, and those using upstream API that changed;
    # one line each, then api drift lines while room is left (every one is in the report)
    looked = [d for d in st["done"] if d["status"] in ("resolved", "merged", "skipped", "upstreamed") or d.get("api")]
    room = max(SUMMARY_LINES - len(short) - len(tail), 1)
    shown = looked if len(looked) <= room else looked[:room - 1]
    room -= len(shown) + (len(shown) < len(looked))
    for d in shown:
        short.append(f"  {d['status']:>10} {d['id']} {d['name']}")
        api = d.get("api", [])
        take = min(len(api), 4, room)
        room -= take
        short += [f"             [yellow]api drift[/yellow]: {a}"
                  + (f" (+{len(api) - take} more in the report)" if i == take - 1 and take < len(api) else "")
                  for i, a in enumerate(api[:take])]
    if len(shown) < len(looked):
        short.append(f"  ... {len(looked) - len(shown)} more in the report")
    short += tail
    detail = [f"# {_title(st)}", "", "## Patches", ""]
    detail += [f"- {d['status']} {d['id']} {d['name']}" + "".join(f"\n  - {f['file']}: {f['status']}"
                                                                   for f in d["files"])
               + "".join(f"\n  - api drift: {a}" for a in d.get("api", [])) for d in st["done"]]
    detail += ["", "## Hook sites", ""]
    detail += [f"- {h['hook']}: {h['symbol']} {h['status']} ({h['file']}:{h['line']} -> {h['new_file']}:"
               f"{h['new_line']})" for h in hooks]
    detail += ["", "## compile", ""] + ([f"- {c['profile']}: {c['status']}" + (f" ({c['reason']})" if c["reason"]
                                                                               else f" ({c['units']} unit(s))")
                                         for c in compiled] or ["not run"])
    detail += ["", "## registry/UPSTREAM_SYNC.yaml (applied)", "", "```diff", *reg_diff, "```", "", "## verify", ""]
    detail += _verify_lines(v) if v else ["not run"]
    detail += ["", "## build plan (cpu)", ""] + (plan.get("lines") or [plan.get("error", "not made")])
    return short, detail, path


def sync_loop(project: Project, action: str, spec: str | None, review_merged: bool = True) -> Report:
    from forktool.sync import loop
    fn = {"start": lambda: loop.start(project, spec, output.info, review_merged=review_merged),
          "continue": lambda: loop.continue_(project, output.info), "skip": lambda: loop.skip(project, output.info),
          "abort": lambda: loop.abort(project, output.info), "undo": lambda: loop.undo(project, output.info)}[action]
    return loop_report(project, fn())


def loop_report(project: Project, res: dict) -> Report:
    """The report of one step of the loop (a sync, or `apply --reanchor` carried as one)."""
    from forktool.sync import loop
    if "already" in res:  # a second --undo: the first one finished (its own report may never have been printed)
        e = res["already"]
        same = res["tree_digest"] == e["tree_digest"]
        return Report({"stage": "undone", "already": True, "from": e["from_spec"], "to": e["to_spec"], "at": e["at"],
                       "tree_digest": res["tree_digest"], "tree_digest_undone": e["tree_digest"],
                       "tree_digest_before": e["tree_digest_before"], "written": 0},
                      [f"nothing left to undo: the sync {e['from_spec']} -> {e['to_spec']} was undone at {e['at']}; "
                       f"tree digest {res['tree_digest'][:12]}" + (" = as that undo left it" if same else
                                                                   f" (that undo left {e['tree_digest'][:12]}: the "
                                                                   "tree changed since)")],
                      exit_code=0 if same else 1)
    st = res["state"]
    data = dict(_summary(st), timings=res.get("timings", {}))
    if res["stage"] == "undone":
        data.update(stage="undone", tree_digest=res["tree_digest"], tree_digest_before=st["tree_digest_before"])
        same = res["tree_digest"] == st["tree_digest_before"]
        return Report(data, [f"undid the sync {st['from_spec']} -> {st['to_spec']}: pin, lock, patches, series, "
                             f"registry and tree as before its start ({res['written']} file(s) written); tree digest "
                             f"{res['tree_digest'][:12]}" + (" = before the start" if same else
                                                             f" (before: {st['tree_digest_before'][:12]})")],
                      exit_code=0 if same else 1)
    if res["stage"] == "aborted":
        data.update(tree_digest=res["tree_digest"], tree_digest_before=st["tree_digest_before"],
                    remembered=res.get("remembered", {}))
        same = res["tree_digest"] == st["tree_digest_before"]
        mem = res.get("remembered", {})
        return Report(data, [f"aborted the sync to {st['to_spec']}: pin, lock, patches, series and tree restored "
                             f"({res['written']} file(s) written); tree digest {res['tree_digest'][:12]}"
                             + (" = before the start" if same else f" (before: {st['tree_digest_before'][:12]})")]
                      + ([f"backups kept: .opencoti/vendor-backups/{st['backups']['tree']}, "
                          f".opencoti/sync-backups/{st['backups']['project']}"] if st["backups"] else [])
                      + ([f"kept {mem['total']} remembered resolution(s) in .opencoti/sync/rerere/ ({mem['new']} "
                          "learnt from this stop): the next sync applies them where the same conflict comes back"]
                         if mem.get("total") else []),
                      exit_code=0 if same else 1)
    joined = []
    if res.get("joined"):
        data["joined"] = res["joined"]
        j = res["joined"]
        joined = [f"{j['id']} took in {len(j['files'])} file(s) outside it that changed during the stop (as `refresh` "
                  "would): " + ", ".join(output.escape(f) for f in j["files"])]
    if res["stage"] == "stopped":
        lines = joined + loop_lines(st)
        lines.append(_next(st))
        t = data["timings"]
        if "tool_s" in t:
            lines.append(f"time: {t['tool_s']:.1f} s" + (f" (fetch {t['fetch_s']:.1f} s"
                         f"{', cached' if t.get('fetch_from_cache') else ''})" if "fetch_s" in t else ""))
        return Report(data, lines, exit_code=1)
    short, detail, path = _finish_report(project, st, res)
    short = joined + short
    written: Path | None = path
    try:
        loop.write_report(project, "\n".join(detail) + "\n")
    except OSError as e:
        # the finish is committed (and, verified, already the undo record): a full disk or an unwritable
        # .opencoti/sync must not make it look undone, nor send the user to a `--continue` that finds no sync
        why = "no space left on the device" if schema.is_no_space(e) else (e.strerror or str(e))
        where = path.relative_to(project.root)
        short = [line for line in short if not line.startswith(f"details: {where}")]
        short.append(f"[yellow]details not written to {where} ({why}); the move itself is "
                     + ("finished: undo it with `forktool sync --undo` (until the next sync)"
                        if res.get("verify", {}).get("ok") else "held at its finish") + "[/yellow]")
        written = None
    data.update(hooks=st.get("hooks", {}).get("sites", []), registry_diff=loop.registry_diff(project, st),
                verify=dict(res.get("verify", {}), lines=_verify_lines(res.get("verify", {}))),
                build_plan=res.get("build_plan", {}), report=str(written) if written else None,
                compile=st.get("compile", []))
    t = data["timings"]
    if "tool_s" in t:
        short.append(f"time: {t['tool_s']:.1f} s" + (f" (fetch {t['fetch_s']:.1f} s)" if "fetch_s" in t else ""))
    return Report(data, short, exit_code=0 if res.get("verify", {}).get("ok") else 1)


def status_report(project: Project) -> Report | None:
    """`forktool status` while a sync is in progress (None when there is none)."""
    from forktool.sync import loop
    st = loop.read_state(project)
    if st is None:
        return None
    lines = loop_lines(st)
    gone, lost_here = loop.missing_backups(project, st)
    if lost_here:
        lines.append(f"a backup of this sync is gone from this checkout ({', '.join(gone)}): put it back, "
                     "`--abort` and `--continue` need it")
    elif not loop.has_backups(project, st):
        lines.append("recorded elsewhere: run `forktool sync --start` to reach this stop here")
    elif st["stage"] == "stopped":
        lines.append(_next(st))
    else:
        lines.append("run `forktool sync --continue` to go on, or `forktool sync --abort`")
    return Report({"sync": _summary(st)}, lines)


def dispatch(project: Project, to: str | None, accept: bool, build: bool, out: str, actions: list[str],
             review_merged: bool = True) -> Report:
    if len(actions) > 1:
        raise UsageError(f"--{' and --'.join(actions)} cannot be combined", where="forktool sync",
                         hint="give one of --start, --continue, --skip, --abort, --undo")
    if actions:
        if accept or build:
            raise UsageError("--accept and --build belong to the trial, not to the loop", where="forktool sync",
                             hint="the loop moves the fork itself; build afterwards with `forktool build`")
        if to is not None and actions[0] != "start":
            raise UsageError(f"--to goes with --start, not --{actions[0]}", where="forktool sync",
                             hint=f"--to names the upstream a new sync moves to (`forktool sync --to SPEC --start`); "
                                  f"leave it out of --{actions[0]}")
        if not review_merged and actions[0] != "start":
            raise UsageError("--no-review-merged goes with --start", where="forktool sync",
                             hint="the choice is made when the sync starts and kept until it finishes")
        return sync_loop(project, actions[0], to, review_merged)
    if not to:
        raise UsageError("--to SPEC is required", where="forktool sync",
                         hint="e.g. `forktool sync --to llama-cpp-python==0.3.35`")
    return sync(project, to, accept, build, out)
