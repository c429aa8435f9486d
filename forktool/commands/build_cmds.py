"""build: configure once per profile, make only what the applied series impacts, check the rest kept its bytes."""

from __future__ import annotations

import os

from forktool import build as b
from forktool import output
from forktool.commands import open_workspace
from forktool.errors import UsageError
from forktool.output import Report
from forktool.project import Project
from forktool.workspace import require_tree


def build(project: Project, profile: str, plan: bool, jobs: int | None) -> Report:
    if jobs is not None and not 1 <= jobs <= 1024:
        raise UsageError(f"-j {jobs}: the number of make jobs must be between 1 and 1024", where="--jobs",
                         hint="give -j a number from 1 to 1024, or leave it out")
    cfg = b.load_config(project)
    prof = cfg.profile(profile)
    # the lock is held through make: the tree must not move under the compiler
    with open_workspace(project) as ws:
        # the state may still name a series: none of it is on disk to build
        require_tree(project.tree, ", so there is nothing to build", "`forktool apply` makes the tree with the series applied")
        ws.refuse_unexplained(stale_hint="run `forktool apply` first, so the tree holds what you build")
        applied = ws.patches[:len(ws.state.applied)]
        dirty = sorted({p for _, p in ws.local_changes()})
        pl = b.make_plan(project, cfg, prof, applied, dirty, ws.current())
        lines = b.plan_lines(pl)
        data = pl.to_json()
        if plan:
            return Report(dict(data, built=False), lines)
        with output.progress(f"build {prof.name}") as bar:
            def show(e: b.BuildEvent) -> None:
                current = {"configure": e.text, "start": "make"}.get(e.kind, e.target)
                bar.update(e.done, e.total, current, e.text, e.percent)

            res = b.run_build(project, cfg, pl, jobs or os.cpu_count() or 1, show, pristine=ws.pristine_digest)
    by_target = res.objects_by_target()
    shown = ", ".join(f"{t}: {n}" for t, n in by_target.items())
    cmake = f"cmake {res.configure_seconds:.1f} s, " if res.configured else ""
    lines.append(f"built in {res.seconds:.1f} s ({cmake}make {res.make_seconds:.1f} s): {len(res.objects)} object(s) "
                 f"recompiled{f' ({shown})' if shown else ''}, {len(res.linked)} relinked")
    if res.cache:
        lines.append(f"compiler cache: {res.cache.describe()}")
    elif res.launcher:
        lines.append(f"compiler cache: {res.launcher} (its counters are not readable)")
    if res.changed_outputs:
        lines.append(f"changed: {', '.join(res.changed_outputs)}")
    lines.append(f"make's log: {res.log}")
    code = 0
    if res.unexpected:
        lines.append(f"[red]bytes moved outside the impact: {', '.join(res.unexpected)}[/red] "
                     "(a rule in registry/build.yaml misses a path, or the stamp reaches further than declared)")
        code = 1
    elif res.kept:
        cuda = "ggml-cuda" in res.kept
        verdict = "no CUDA DSO rebuild, no restamp" if cuda else (
            "no CUDA DSO in this profile" if not prof.has_cuda else "CUDA DSO rebuilt")
        lines.append(f"[green]kept their sha256: {', '.join(res.kept)} -> {verdict}[/green]")
    data.update(built=True, objects=res.objects, objects_by_target=by_target, linked=res.linked,
                seconds=round(res.seconds, 3), make_seconds=round(res.make_seconds, 3),
                configure_seconds=round(res.configure_seconds, 3),
                changed_outputs=res.changed_outputs, kept=res.kept, unexpected=res.unexpected, outputs=res.outputs,
                cuda_dso_rebuilt=prof.has_cuda and "ggml-cuda" not in res.kept, log=str(res.log),
                launcher=res.launcher, cache=res.cache.to_json() if res.cache else None)
    return Report(data, lines, exit_code=code)


def check(project: Project, profile: str | None, every: bool, jobs: int | None) -> Report:
    """The scoped compile check of one profile (or every profile): only the units the applied series feeds."""
    from forktool.build import check as bcheck

    if jobs is not None and not 1 <= jobs <= 1024:
        raise UsageError(f"-j {jobs}: the number of make jobs must be between 1 and 1024", where="--jobs",
                         hint="give -j a number from 1 to 1024, or leave it out")
    if every and profile is not None:
        raise UsageError("--all and --profile name the profiles twice", where="--all", hint="give one of them")
    cfg = b.load_config(project)
    names = sorted(cfg.profiles) if every else [cfg.profile("cpu" if profile is None else profile).name]
    results = []
    with open_workspace(project) as ws:
        ws.refuse_unexplained(stale_hint="run `forktool apply` first, so the tree holds what you check")
        for name in names:
            with output.progress(f"check {name}") as bar:
                def show(e: b.BuildEvent) -> None:
                    bar.update(e.done, e.total, {"configure": e.text, "start": "make"}.get(e.kind, e.target), e.text)

                results.append(bcheck.check_compile(ws, name, jobs=jobs, progress=show))
    lines = []
    code = 0
    for r in results:
        if r.ok:
            lines.append(f"[green]{output.escape(r.describe())}[/green]")
        elif r.status == bcheck.NOT_COMPILED:
            lines.append(f"[yellow]{output.escape(r.describe())}[/yellow]")
            if r.hint:
                lines.append(f"  next: {output.escape(r.hint)}")
            code = code or (0 if every else 1)  # asked by name: what was asked went unchecked
        else:
            lines.append(f"[red]{output.escape(r.describe())}[/red]")
            if r.cause and r.cause.where:
                lines.append(f"  at {output.escape(r.cause.where)}; full log: {r.log}")
            lines.append(f"  next: {output.escape(r.hint)}")
            code = 1
    if any(r.status != bcheck.NOT_COMPILED for r in results):
        lines.append(f"recorded for series {results[0].series_digest[:12]}, tree {results[0].tree_digest[:12]} "
                     "(`forktool verify` reports it)")
    unchecked = [r.profile for r in results if r.status == bcheck.NOT_COMPILED]
    if unchecked and len(unchecked) == len(results) > 1:  # --all: exit 0 by design, so the words must say it
        lines.append("[yellow]no profile was compiled: this check checked nothing[/yellow]")
    # ok: nothing failed (and, by name, what was asked was compiled); not_compiled: the profiles it did not check
    return Report({"profiles": [r.to_json() for r in results], "ok": code == 0, "not_compiled": unchecked}, lines,
                  exit_code=code)


def dispatch(project: Project, profile: str | None, plan: bool, check_only: bool, every: bool,
             jobs: int | None) -> Report:
    """`forktool build`: the scoped check with --check, else the build (or its plan)."""
    if check_only:
        if plan:
            raise UsageError("--plan and --check are two different runs", where="--check", hint="give one of them")
        return check(project, profile, every, jobs)
    if every:
        raise UsageError("--all goes with --check", where="--all",
                         hint="`forktool build --check --all` checks every profile; a build takes one --profile")
    return build(project, "cpu" if profile is None else profile, plan, jobs)
