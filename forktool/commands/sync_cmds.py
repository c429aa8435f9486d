"""sync: trial the series on another upstream, write the report and refreshed patches, optionally accept."""

from __future__ import annotations

from pathlib import Path

from forktool import output
from forktool import sync as s
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
