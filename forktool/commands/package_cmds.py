"""package and package verify: a release of the last build of the applied series, and its re-check."""

from __future__ import annotations

from pathlib import Path

from forktool import build as b
from forktool import package as pk
from forktool.commands import open_workspace
from forktool.errors import UsageError
from forktool.output import Report
from forktool.project import Project


def package(project: Project, profile: str, out: str | None) -> Report:
    cfg = b.load_config(project)
    prof = cfg.profile(profile)
    with open_workspace(project) as ws:
        ws.refuse_unexplained(stale_hint="run `forktool apply`, then `forktool build`, then package",
                              dirty_hint="a release carries only reviewed patches: refresh them into a patch first")
        applied = ws.patches[:len(ws.state.applied)]
        spec = pk.spec_from_build(project, cfg, prof, applied, ws.pristine_digest)
        if out is not None and not out.strip():
            raise UsageError("--out must name a directory", where="--out", hint="leave it out for dist/")
        dest = Path(out) if out else project.root / "dist"
        res = pk.write_release(spec, dest if dest.is_absolute() else project.root / dest)
    lines = [f"release {res['name']}: {res['files']} files",
             f"  {res['dir']}",
             f"  {res['archive']} (sha256 {res['archive_sha256']})",
             f"check it with `forktool package verify {res['dir']}`"]
    return Report(dict(res, profile=prof.name, stamp=spec.manifest["stamp"]), lines)


def verify(project: Project, directory: str) -> Report:
    if not directory.strip():
        raise UsageError("package verify needs the release directory (or its .tar.gz), not an empty name",
                         where="DIRECTORY", hint="pass what `forktool package` printed, e.g. dist/NAME")
    path = Path(directory)
    if path.is_file():
        from forktool import vendor

        # an archive is extracted under .opencoti/tmp/, never $TMPDIR: what a SIGTERM or a kill leaves there (a
        # whole release) is removed by the next command that makes a temporary directory there
        with vendor.temp_dir(project, "forktool-verify-") as work:
            res = pk.verify_release(path, work)
    else:
        res = pk.verify_release(path)
    return Report(res, [f"{res['files']} file(s) match SHA256SUMS; manifest agrees (stamp {res['stamp']}, "
                        f"series {str(res['series_digest'])[:12]})", "[green]package verify: OK[/green]"])
