"""The sync result and its outputs: report.json, report.md, the refreshed patches."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from forktool.project import Project
from forktool.sync.fetch import Target
from forktool.sync.trial import NEEDS_HUMAN, STATUSES, PatchResult
from forktool.tree import atomic_write, digest, remove_dead_work_dirs

CONFLICT_LINES_MAX = 80


@dataclass
class SyncResult:
    target: Target
    results: list[PatchResult]
    hooks: dict
    build_files: list[dict]
    build: dict
    timings: dict
    series_text: str
    yaml_text: str
    registry_yaml: str | None = None  # UPSTREAM_SYNC.yaml with relocated sites (a proposal, never applied)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for r in self.results if r.status == s) for s in STATUSES}

    @property
    def needs_human(self) -> bool:
        moved = any(s["status"] in ("vanished", "moved_file") for s in self.hooks.get("sites", [])) \
            or bool(self.hooks.get("error"))
        return any(r.status in NEEDS_HUMAN or r.api for r in self.results) or moved \
            or self.build.get("status") == "failed"

    @property
    def acceptable(self) -> bool:
        return not any(r.status in ("conflict", "blocked") for r in self.results)

    def report(self) -> dict:
        """report.json: only facts that follow from the inputs (no timings), so reruns are byte-identical."""
        t = self.target
        return {
            "schema": 1,
            "from": {"spec": t.old.spec, "sha256": t.old.sha256, "upstream_commit": t.old.upstream_commit},
            "to": {"spec": t.new.spec, "sha256": t.new.sha256, "upstream_commit": t.new.upstream_commit,
                   "files": t.component_files, "pristine_digest": digest(t.manifest)},
            "component": t.old.name,
            "counts": self.counts,
            "needs_human": self.needs_human,
            "acceptable": self.acceptable,
            "patches": [r.to_json() for r in self.results],
            "hooks": self.hooks,
            "build_files": self.build_files,
            "build": {k: v for k, v in self.build.items() if k not in ("seconds", "project")},
        }


def _conflict_excerpt(text: str) -> str:
    lines = text.split("\n")
    if len(lines) <= CONFLICT_LINES_MAX:
        return text
    return "\n".join(lines[:CONFLICT_LINES_MAX] + [f"… {len(lines) - CONFLICT_LINES_MAX} more line(s) in report.json"])


def render_markdown(data: dict) -> str:
    import jinja2
    env = jinja2.Environment(loader=jinja2.PackageLoader("forktool", "templates"), autoescape=False,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["excerpt"] = _conflict_excerpt
    return env.get_template("sync_report.md.j2").render(r=data, statuses=STATUSES)


REPORTS = ("report.json", "report.md")


def check_out(project: Project, out: Path) -> None:
    """--out DIR before anything is fetched: a directory of its own. The trial replaces DIR/patches/ and writes
    DIR/registry/UPSTREAM_SYNC.yaml, so DIR must be neither the project root (its patches/ and registry/ are the
    project's own) nor inside the directories forktool keeps (patches/, vendor/, registry/, .opencoti/)."""
    from forktool.errors import UsageError

    real = out.resolve()
    root = project.root.resolve()
    own = [project.patches_dir, project.root / "vendor", project.registry_dir, project.state_dir]
    if real == root or any(real == d.resolve() or real.is_relative_to(d.resolve()) for d in own):
        raise UsageError(f"--out {out} is the project's own {'root' if real == root else 'directory'}: the trial "
                         "would replace its patches/ (or write among forktool's files)", where=f"--out {out}",
                         hint="nothing was changed; give a directory of its own, e.g. the default `--out dist/sync`")
    there = next(d for d in (out, *out.parents) if d.exists())  # what stands at DIR, or the nearest parent that does
    if not there.is_dir():
        raise UsageError(f"--out {out} is not a directory" + (f" ({there} is a file)" if there != out else ""),
                         where=f"--out {out}",
                         hint="nothing was changed; give a directory (it is made when absent), e.g. `--out dist/sync`")


def retire_outputs(out: Path) -> None:
    """Remove the reports of the trial before, first of all that a trial writes into out: until this trial's own are
    written (report.json last), out holds no report (nor registry proposal) that could describe other patches or
    another build."""
    for name in (*REPORTS, "registry/UPSTREAM_SYNC.yaml"):
        if (out / name).is_file() or (out / name).is_symlink():
            (out / name).unlink()


def write_outputs(out: Path, res: SyncResult) -> dict:
    """patches/ (refreshed ones + series), the registry proposal, report.md, then report.json; the earlier trial's
    reports go first and patches/ is replaced as a whole, so a run cut short leaves no report of another run."""
    out.mkdir(parents=True, exist_ok=True)
    # the work directory's name carries this process's id: one that a SIGTERM or a kill left is removed here by the
    # next trial writing to out, once its process is gone
    remove_dead_work_dirs(out, re.compile(r"^\.patches-(\d+)-"))
    retire_outputs(out)
    work = Path(tempfile.mkdtemp(prefix=f".patches-{os.getpid()}-", dir=out))
    try:
        new = work / "patches"
        new.mkdir()
        for r in res.results:
            if r.refreshed is not None:
                (new / r.patch.name).write_bytes(r.refreshed.raw)
        (new / "series").write_bytes(res.series_text.encode())
        old = out / "patches"
        if old.exists():
            old.rename(work / "old")  # out of the way whole: what is left of it goes with the work directory
        new.rename(old)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    proposal = out / "registry" / "UPSTREAM_SYNC.yaml"
    if res.registry_yaml is not None:
        atomic_write(proposal, res.registry_yaml.encode())
    data = res.report()
    atomic_write(out / "report.md", render_markdown(data).encode())
    atomic_write(out / "report.json", (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
    return data
