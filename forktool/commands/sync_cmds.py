"""sync: trial the series on another upstream, write the report and refreshed patches, optionally accept."""

from __future__ import annotations

from pathlib import Path

from forktool import output
from forktool import sync as s
from forktool.errors import UsageError
from forktool.output import Report
from forktool.project import Project


def sync(project: Project, spec: str, accept: bool, build: bool, out: str) -> Report:
    out_dir = Path(out) if Path(out).is_absolute() else project.root / out
    res = s.sync(project, spec, build=build, out=out_dir, progress=output.info)
    data = res.report()
    data.update(out=str(out_dir), timings=res.timings)
    counts = res.counts
    lines = [f"sync {res.target.old.spec} -> {res.target.new.spec} "
             f"(sha256 {res.target.new.sha256[:12] or 'n/a'}, upstream {res.target.new.upstream_commit[:12] or '?'})"]
    colour = {"clean": "green", "offset": "yellow", "merged": "yellow", "conflict": "red", "upstreamed": "cyan",
              "blocked": "red"}
    for r in res.results:
        extra = ""
        if r.status == "offset":
            extra = " " + ", ".join(f"{d['file']}#{d['hunk']}{d['offset']:+d}" for d in r.drift)
        elif r.status == "blocked":
            extra = f" by {', '.join(r.blocked_by)}"
        elif r.status in ("merged", "conflict", "upstreamed"):
            extra = " " + ", ".join(f"{f.path}: {f.status}" for f in r.files if f.status != "clean")
        lines.append(f"[{colour[r.status]}]{r.status:>10}[/{colour[r.status]}] {r.patch.id} {r.patch.title}{extra}")
    for site in res.hooks.get("sites", []):
        if site["status"] != "found":
            lines.append(f"hook {site['hook']}: {site['symbol']} {site['status']} "
                         f"({site['file']}:{site['line']} -> {site['new_file']}:{site['new_line']})")
    for b in res.build_files:
        if b["added"] or b["removed"] or b["note"]:
            lines.append(f"build files {b['target']}: +{len(b['added'])} -{len(b['removed'])} {b['note']}".rstrip())
    lines.append("counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    lines.append(f"build: {res.build['status']}" + (f" ({res.build.get('reason')})" if res.build.get("reason") else ""))
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
    lines = [f"sync {st['from_spec']} -> {st['to_spec']}: {st['stage']}"]
    colour = {"clean": "green", "offset": "yellow", "merged": "yellow", "resolved": "cyan", "upstreamed": "cyan",
              "skipped": "magenta"}
    for d in st["done"]:
        c = colour.get(d["status"], "white")
        extra = ", ".join(f"{f['file']}: {f['status']}" for f in d["files"] if f["status"] not in ("clean", "resolved"))
        lines.append(f"  [{c}]{d['status']:>10}[/{c}] {d['id']} {d['name']}" + (f" ({extra})" if extra else ""))
    stop = st.get("stop")
    if stop and st["stage"] == "stopped":
        lines.append(f"  [red]{stop.get('kind', 'conflict'):>10}[/red] {stop['id']} {stop['title']}")
        if stop.get("kind") == "compile":
            c = stop["compile"]
            lines.append(f"             {c['profile']} profile: {output.escape(c['cause'])} (at {c['where']}; "
                         f"log {c['log']})")
        for f in stop["files"]:
            hunks = ", ".join(f"#{h['hunk']} {h['how']}" for h in f["hunks"])
            blocks = ", ".join(str(n) for n in f["blocks"])
            what = f"{f['status']}" + (f", hunks {hunks}" if hunks else "") + \
                (f"; conflict block(s) at line {blocks}" if blocks else "")
            lines.append(f"             vendor/llamafile/{f['file']}: {what}")
    names = [n for n, _ in st["original"]]
    rest = names[st["position"] + (1 if stop and st["stage"] == "stopped" else 0):]
    if rest and st["stage"] == "stopped":
        lines.append(f"  still to carry: {', '.join(rest)}")
    return lines


def sync_loop(project: Project, action: str, spec: str | None) -> Report:
    from forktool.sync import loop
    fn = {"start": lambda: loop.start(project, spec, output.info), "continue": lambda: loop.continue_(
        project, output.info), "skip": lambda: loop.skip(project, output.info),
        "abort": lambda: loop.abort(project, output.info)}[action]
    res = fn()
    if res["stage"] == "finished":
        _verify_and_plan(project, res)
    st = res["state"]
    data = dict(_summary(st), timings=res.get("timings", {}))
    if res["stage"] == "aborted":
        data.update(tree_digest=res["tree_digest"], tree_digest_before=st["tree_digest_before"])
        same = res["tree_digest"] == st["tree_digest_before"]
        return Report(data, [f"aborted the sync to {st['to_spec']}: pin, lock, patches, series and tree restored "
                             f"({res['written']} file(s) written); tree digest {res['tree_digest'][:12]}"
                             + (" = before the start" if same else f" (before: {st['tree_digest_before'][:12]})")]
                      + ([f"backups kept: .opencoti/vendor-backups/{st['backups']['tree']}, "
                          f".opencoti/sync-backups/{st['backups']['project']}"] if st["backups"] else []),
                      exit_code=0 if same else 1)
    lines = loop_lines(st)
    if res["stage"] == "stopped":
        lines.append((COMPILE_NEXT if st["stop"].get("kind") == "compile" else NEXT).format(id=st["stop"]["id"]))
        t = data["timings"]
        if "tool_s" in t:
            lines.append(f"time: {t['tool_s']:.1f} s" + (f" (fetch {t['fetch_s']:.1f} s"
                         f"{', cached' if t.get('fetch_from_cache') else ''})" if "fetch_s" in t else ""))
        return Report(data, lines, exit_code=1)
    hooks = st.get("hooks", {}).get("sites", [])
    moved = [h for h in hooks if h["status"] != "found"]
    data["hooks"] = hooks
    data["registry_diff"] = loop.registry_diff(project, st)
    for h in moved:
        lines.append(f"hook {h['hook']}: {h['symbol']} {h['status']} ({h['file']}:{h['line']} -> "
                     f"{h['new_file']}:{h['new_line']})")
    if data["registry_diff"]:
        lines.append("registry/UPSTREAM_SYNC.yaml (applied):")
        lines += [f"  {ln}" for ln in data["registry_diff"]]
    lines.append(f"[green]moved the pin to {st['to_spec']}[/green]: vendor.yaml, vendor.lock, patches and series "
                 "rewritten on the new base")
    data["compile"] = st.get("compile", [])
    lines += [f"compile {c['profile']}: {c['status']}" + (f" ({c['reason']})" if c["reason"] else
                                                          f" ({c['units']} unit(s) the series feeds)")
              for c in data["compile"]]
    data["verify"] = res.get("verify", {})
    data["build_plan"] = res.get("build_plan", {})
    if res.get("verify", {}).get("ok"):
        lines += res["verify"]["lines"]
    else:
        v = res.get("verify", {})
        lines.append(f"[red]verify failed[/red]: {v.get('error', '')}")
        lines += [f"  {d}" for d in v.get("details", [])[:30]]
        lines.append("fix it and run `forktool sync --continue` to verify again, or `forktool sync --abort`")
    lines += res.get("build_plan", {}).get("lines", [])
    t = data["timings"]
    if "tool_s" in t:
        lines.append(f"time: {t['tool_s']:.1f} s" + (f" (fetch {t['fetch_s']:.1f} s)" if "fetch_s" in t else ""))
    return Report(data, lines, exit_code=0 if res.get("verify", {}).get("ok") else 1)


def _verify_and_plan(project: Project, res: dict) -> None:
    """After the finish: verify (tree, re-export, lock, registry) and the cpu build plan; a sync that
    verifies is done, one that does not stays for --continue (verify again) or --abort."""
    from forktool.commands import build_cmds, tree_cmds
    from forktool.errors import ForktoolError
    from forktool.sync import loop
    output.info("verifying the moved series")
    try:
        rep = tree_cmds.verify(project)
    except ForktoolError as e:
        res["verify"] = {"ok": False, "error": str(e), "details": e.details}
        return
    res["verify"] = {"ok": True, "lines": rep.lines}
    try:
        plan = build_cmds.build(project, "cpu", True, None)
        res["build_plan"] = {"lines": plan.lines, "plan": plan.data}
    except ForktoolError as e:
        res["build_plan"] = {"error": str(e)}
    loop.done(project)


def status_report(project: Project) -> Report | None:
    """`forktool status` while a sync is in progress (None when there is none)."""
    from forktool.sync import loop
    st = loop.read_state(project)
    if st is None:
        return None
    lines = loop_lines(st)
    if not loop.has_backups(project, st):
        lines.append("recorded elsewhere: run `forktool sync --start` to reach this stop here")
    elif st["stage"] == "stopped":
        lines.append((COMPILE_NEXT if st["stop"].get("kind") == "compile" else NEXT).format(id=st["stop"]["id"]))
    else:
        lines.append("run `forktool sync --continue` to go on, or `forktool sync --abort`")
    return Report({"sync": _summary(st)}, lines)


def dispatch(project: Project, to: str | None, accept: bool, build: bool, out: str, actions: list[str]) -> Report:
    if len(actions) > 1:
        raise UsageError(f"--{' and --'.join(actions)} cannot be combined", where="forktool sync",
                         hint="give one of --start, --continue, --skip, --abort")
    if actions:
        if accept or build:
            raise UsageError("--accept and --build belong to the trial, not to the loop", where="forktool sync",
                             hint="the loop moves the fork itself; build afterwards with `forktool build`")
        if to is not None and actions[0] != "start":
            raise UsageError(f"--to goes with --start, not --{actions[0]}", where="forktool sync")
        return sync_loop(project, actions[0], to)
    if not to:
        raise UsageError("--to SPEC is required", where="forktool sync",
                         hint="e.g. `forktool sync --to llama-cpp-python==0.3.35`")
    return sync(project, to, accept, build, out)
