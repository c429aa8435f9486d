"""gates [ID]: run the gates the registry records; a gate needing a GPU is skipped elsewhere, saying why, and a run
that skipped one is not a pass (exit 1): nothing it would have checked was checked."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from forktool import output, proc
from forktool import registry as rg
from forktool.errors import ForktoolError, UsageError, check_id
from forktool.output import Report
from forktool.project import Project
from forktool.tree import Manifest, atomic_write, diff_manifests, read_file, remove_tree, scan, sha256_file
from forktool.tree import digest as tree_digest

# A gate program made of parts (gates/gpu.py runs a subset of its gates a-h) names each part it ran, and that part's
# verdict, on a line of its own; forktool reports those parts, so a pass never stands for a part that did not run.
PART_LINE = re.compile(r"^forktool-gate-part (\S+): (pass|fail|not checked)(?:: (.*))?$", re.M)
# A gate program that could not run at all (a tool, model or build it needs is missing) exits 2 (gates.common's
# COULD_NOT_RUN): it checked nothing, so the gate is not checked, not failed; a part it reported failing still fails it.
COULD_NOT_RUN = 2


def gate_parts(text: str) -> list[dict]:
    """The parts a gate program reported, in order (a part reported twice keeps its last verdict)."""
    parts: dict[str, dict] = {}
    for m in PART_LINE.finditer(text):
        parts.pop(m.group(1), None)
        parts[m.group(1)] = {"part": m.group(1), "verdict": m.group(2), "why": (m.group(3) or "").strip()}
    return list(parts.values())


def judge(exit_code: int, parts: list[dict]) -> str:
    """pass / fail / not checked from the exit code and the parts the program reported.

    pass needs exit 0 and no part failing or unchecked; a non-zero exit whose parts all passed or went unchecked (at
    least one) is "not checked": nothing failed, but not everything was checked; so is exit 2 (the program could not
    run) without a failed part. Anything else fails.
    """
    verdicts = {p["verdict"] for p in parts}
    if "fail" in verdicts:
        return "fail"
    if exit_code == COULD_NOT_RUN:
        return "not checked"
    if exit_code != 0:
        return "not checked" if "not checked" in verdicts else "fail"
    return "not checked" if "not checked" in verdicts else "pass"


def gate_verdict(g: rg.Gate, exit_code: int, err_text: str, parts: list[dict], timed_out: bool) -> tuple[str, str]:
    """(result, reason) of a gate that ran: judge() on its exit code and parts, then what forktool knows besides. Past
    its timeout it failed; exit 2 is a program that could not run (its last line says what it lacks); a gate whose
    registry declares parts and whose program named none of them (nothing, or only parts the registry does not
    declare) says nothing of what it checked."""
    if timed_out:
        return "fail", f"timed out after {g.timeout} s"
    result = judge(exit_code, parts)
    if result == "not checked" and exit_code == COULD_NOT_RUN:
        last = next((ln.strip() for ln in reversed(err_text.splitlines()) if ln.strip()), "")
        return result, f"it could not run (exit {COULD_NOT_RUN}: something it needs is missing)" + (
            f": {last}" if last else "")
    if g.parts and result == "pass" and not any(g.part_of(p["part"]) for p in parts):
        declared = ", ".join(n for n, _ in g.parts)
        if not parts:
            return "not checked", f"it exited 0 without naming any of its parts ({declared}): nothing says what it checked"
        # parts the registry does not declare say nothing of the gate's own: none of those ran
        return "not checked", (f"it named none of its parts ({declared}), only {', '.join(p['part'] for p in parts)}, "
                               "which the registry does not declare: nothing says what of the gate it checked")
    return result, ""


VERDICT_ORDER = ("fail", "not checked", "pass")


def part_lines(g: rg.Gate, parts: list[dict]) -> tuple[list[str], list[str]]:
    """What a gate made of parts checked, as report lines, and the parts its registry entry declares that did not run.

    Each declared part that ran gets one line with its verdict (the worst of its members: gates.cpu reports `a.llama`,
    `a.gemma3` for part a) and the registry's sentence for it; a member that did not pass adds its reason. A part the
    registry does not declare is listed as such. Nothing is said to be checked that did not run. Every text a program
    or the registry gave is shown as is (a part name like `[a.llama]` is not rich markup)."""
    esc = output.escape
    lines: list[str] = []
    members: dict[str, list[dict]] = {}
    for p in parts:
        members.setdefault(g.part_of(p["part"]) or "", []).append(p)
    for name, claim in g.parts:
        ran = members.get(name)
        if not ran:
            continue
        verdict = min((p["verdict"] for p in ran), key=VERDICT_ORDER.index)
        sub = [p["part"] for p in ran if p["part"] != name]
        lines.append(esc(f"    {name} {verdict}: {claim}" + (f" [{', '.join(sub)}]" if sub else "")))
        lines += [esc(f"      {p['part']} {p['verdict']}: {p['why']}") for p in ran
                  if p["why"] and p["verdict"] != "pass"]
    for p in members.get("", []):
        lines.append(esc(f"    {p['part']} {p['verdict']} (a part the registry does not declare)"
                         + (f": {p['why']}" if p["why"] else "")))
    not_run = [name for name, _ in g.parts if name not in members]
    if not_run:
        lines.append(esc(f"    not run, so not checked: {', '.join(not_run)}"))
    return lines, not_run


def have_cuda() -> tuple[bool, str]:
    if os.environ.get("FORKTOOL_NO_CUDA"):
        return False, "FORKTOOL_NO_CUDA is set"
    if not shutil.which("nvidia-smi"):
        return False, "no nvidia-smi on PATH (no NVIDIA driver)"
    r = proc.run(["nvidia-smi", "-L"], check=False)
    if r.returncode != 0 or "GPU" not in r.out:
        return False, "nvidia-smi lists no GPU"
    return True, r.out.strip().splitlines()[0]


def placeholders(project: Project, needs: tuple[str, ...]) -> dict[str, str]:
    profile = "cuda" if "cuda" in needs else "cpu"
    build = project.root / "build"
    return {"root": str(project.root), "python": sys.executable, "profile": profile,
            "bin": str(build / profile / "bin"), "upstream_bin": str(build / f"{profile}-upstream" / "bin"),
            "base_bin": str(build / f"{profile}-base" / "bin"), "out": str(build / "gates")}


def stale_build(project: Project, profile_name: str) -> str:
    """Why build/<profile> is not the build of the tree as it is now ("" when it is): a gate must not pass on
    binaries of another series, of local edits made since, or whose bytes are not the ones the build recorded."""
    from forktool import build as fbuild
    from forktool.commands import open_workspace

    cfg = fbuild.load_config(project)
    with open_workspace(project) as ws:
        applied = ws.patches[:len(ws.state.applied)]
        dirty = sorted({p for _, p in ws.local_changes()}) if project.tree.exists() else []
        pl = fbuild.make_plan(project, cfg, cfg.profile(profile_name), applied, dirty)
    rec = pl.record
    if not rec:
        return "has no build record (never built by forktool)"
    if rec.get("stamp") != pl.stamp:
        return f"was built for {rec.get('stamp')}, the tree is {pl.stamp}"
    if pl.first:
        return f"is incomplete ({pl.configure_reason})"
    if pl.changed:
        return f"was built before {', '.join(pl.changed)} changed"
    if pl.dirty:
        return f"predates local edits to {', '.join(pl.dirty[:3])}"
    for rel, want in sorted((rec.get("outputs") or {}).items()):
        path = pl.build_dir / rel
        if not path.is_file() or sha256_file(path) != want:
            return f"has {rel} with other bytes than its build recorded"
    # the libraries the binaries load, listed output or not (a tool's -impl library): what the build recorded shipping
    shipped = rec.get("shipped")
    if isinstance(shipped, dict):
        now = fbuild.release_files(pl.build_dir, sorted(rec.get("outputs") or {}))
        if set(now) != set(shipped):
            odd = sorted(set(now) ^ set(shipped))
            return f"has other libraries than its build recorded ({', '.join(odd[:3])})"
        for rel, path in sorted(now.items()):
            if not path.is_file() or sha256_file(path) != shipped[rel]:
                return f"has {rel} with other bytes than its build recorded"
    return ""


REFERENCE_STAMP = ".forktool-pristine"  # in build/src-upstream: the pristine digest it was materialised from
REFERENCE_RECORD = "forktool-reference.json"  # in build/<profile>-upstream: the digests of what make produced


def reference_sources_differ(src_root: Path, manifest: Manifest, digest_: str) -> list[str]:
    """Where build/src-upstream is not the pristine upstream it claims to be ([] when it is, byte for byte): files
    changed, added or removed since it was materialised, or a tree that cannot be read as one."""
    try:
        have = scan(src_root)
    except (OSError, ForktoolError) as e:
        return [f"(it cannot be read: {e})"]
    have.pop(REFERENCE_STAMP, None)
    if tree_digest(have) == digest_:
        return []
    return [f"{rel} ({how})" for how, rel in diff_manifests(manifest, have)]


def reference_outputs(bdir: Path, outputs: list[str]) -> dict[str, str]:
    """sha256 of each file the reference's binaries are (its outputs and every shared library in bin/, as a release
    of it would ship them), read whole: a stat cache would vouch for bytes it never read."""
    from forktool.build import release_files

    return {rel: sha256_file(p) for rel, p in release_files(bdir, outputs).items() if p.is_file()}


def ensure_reference_build(project: Project, profile_name: str) -> Path:
    """An unpatched build of the same upstream with the same profile, for the gates that compare against it.

    The pristine tree is materialised from the cache into build/src-upstream (never the vendored tree) and
    built into build/<profile>-upstream; later calls reuse both once they are checked: the sources are read again
    and compared with the pristine manifest, and the outputs with the digests the last build of them recorded. A
    source that differs (an edit, a file added or removed) or an output whose bytes are not the recorded ones makes
    both be made again from scratch, saying why: a gate must not compare the window with something that is not
    upstream.
    """
    from forktool import build as fbuild
    from forktool import vendor
    cfg = fbuild.load_config(project)
    profile = cfg.profile(profile_name)
    src_root = project.root / "build" / "src-upstream"
    bdir = project.root / "build" / f"{profile_name}-upstream"
    manifest, digest_ = vendor.read_pristine(project)
    outputs = [o for a in cfg.artifacts_in(profile) for o in a.outputs]
    stamp_file = src_root / REFERENCE_STAMP
    stamped = stamp_file.is_file() and not stamp_file.is_symlink() and stamp_file.read_text() == digest_
    differ = reference_sources_differ(src_root, manifest, digest_) if stamped else []
    if differ:
        output.warn(f"build/src-upstream is not the pristine upstream {digest_[:12]}: "
                    f"{', '.join(differ[:3])}{' ...' if len(differ) > 3 else ''}; materialising it and building the "
                    "reference again from scratch")
    if not stamped or differ:
        for d in (src_root, bdir):
            _remove(d)
        vendor.materialise_to(vendor.objects(project), manifest, src_root)
        stamp_file.write_text(digest_)
    # what CMake is given for the profile (the launcher aside: it changes how objects are made, not what)
    flags = [profile.generator, *(f for f in fbuild.configure_flags(profile) if "_COMPILER_LAUNCHER=" not in f)]
    record_path = bdir / REFERENCE_RECORD
    record = _read_reference_record(record_path)
    if record is not None and record.get("flags") != flags:
        output.warn(f"build/{profile_name}-upstream was configured with other flags than the {profile_name} profile's "
                    "(registry/build.yaml); building the reference again from scratch")
        _remove(bdir)
    elif record is None and os.path.lexists(bdir):
        # nothing vouches for what is there (a build cut short, a record removed or torn): make alone would keep an
        # output planted newer than its objects
        output.warn(f"build/{profile_name}-upstream has no record of what its build made; building the reference "
                    "again from scratch")
        _remove(bdir)
    elif record is not None and (record.get("pristine") != digest_
                                 or reference_outputs(bdir, outputs) != record.get("outputs")):
        output.warn(f"build/{profile_name}-upstream holds outputs whose bytes are not the ones its build recorded; "
                    "building the reference again from scratch")
        _remove(bdir)
    src = src_root / "llama.cpp"
    env = {"GIT_CEILING_DIRECTORIES": str(src_root)}
    if not (bdir / "CMakeCache.txt").is_file():
        with output.step(f"configuring the unpatched reference build ({profile_name})"):
            proc.run(["cmake", "-S", src, "-B", bdir, "-G", profile.generator, *fbuild.configure_flags(profile),
                      "-DLLAMA_BUILD_COMMIT=upstream"], env=env)
    jobs = str(os.cpu_count() or 2)
    record_path.unlink(missing_ok=True)  # until make has finished, nothing vouches for the outputs
    with output.step(f"building the unpatched reference ({profile_name}) into {bdir}"):
        proc.stream(["make", "-C", bdir, f"-j{jobs}", *profile.targets], env=env)
    atomic_write(record_path, json.dumps({"pristine": digest_, "flags": flags,
                                          "outputs": reference_outputs(bdir, outputs)}, indent=1, sort_keys=True).encode())
    return bdir / "bin"


def _remove(path: Path) -> None:
    """path gone, whatever it is (a link is removed, never followed)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        remove_tree(path)


def _read_reference_record(path: Path) -> dict | None:
    """The reference build's record, or None where there is none a gate could trust (absent, unreadable, not JSON)."""
    try:
        raw = json.loads(read_file(path))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def gates(project: Project, patch_id: str | None, name: str | None, list_only: bool) -> Report:
    check_id(patch_id, "ID")
    reg = rg.load(project.registry_dir / "UPSTREAM_SYNC.yaml")
    selected = [(p.id, g) for p in reg.patches for g in p.gates
                if (patch_id is None or p.id == patch_id) and (name is None or g.name == name)]
    if patch_id and reg.patch(patch_id) is None:
        raise UsageError(f"no patch {patch_id} in the registry", where="registry/UPSTREAM_SYNC.yaml",
                         hint="`forktool gates --list` shows the gates of every patch; `forktool status` lists the "
                              "ids of the series")
    if not selected and patch_id is None and name is None:  # nothing to match: the registry holds no gate
        if list_only:
            return Report({"gates": [], "cuda": None, "cuda_reason": "", "failed": 0, "not_checked": 0,
                           "skipped": 0}, ["no gates: registry/UPSTREAM_SYNC.yaml records none"])
        raise ForktoolError("no gates to run: registry/UPSTREAM_SYNC.yaml records none, so nothing was checked",
                            where="registry/UPSTREAM_SYNC.yaml",
                            hint="add a gate under a patch's `gates:` in the registry (docs/registry.md)")
    if not selected:
        raise UsageError("no gate matches", where="registry/UPSTREAM_SYNC.yaml",
                         hint="`forktool gates --list` shows them")
    cuda, why = have_cuda()
    rows: list[dict] = []
    lines: list[str] = []
    failed = unchecked = skipped = 0
    stale: dict[str, str] = {}  # profile -> why its build is not of the tree ("" when it is)
    for pid, g in selected:
        row: dict = {"patch": pid, "gate": g.name, "needs": list(g.needs), "proves": g.proves}
        missing = [n for n in g.needs if n == "cuda" and not cuda]
        if list_only:
            rows.append(row | {"command": list(g.command)} | ({"parts": dict(g.parts)} if g.parts else {}))
            lines.append(output.escape(f"{pid} {g.name} (needs {', '.join(g.needs)}): {g.proves}"))
            lines += [output.escape(f"    part {name}: {claim}") for name, claim in g.parts]
            continue
        if missing:
            rows.append(row | {"result": "skipped", "reason": f"needs cuda: {why}"})
            lines.append(f"[yellow]not checked[/yellow] {pid} {g.name}: skipped, it needs a CUDA GPU ("
                         + output.escape(why) + ")")
            skipped += 1
            continue
        ph = placeholders(project, g.needs)
        try:
            argv = [a.format(**ph) for a in g.command]
        except KeyError as e:
            raise ForktoolError(f"gate {g.name}: unknown placeholder {e}", where="registry/UPSTREAM_SYNC.yaml",
                                hint=f"known: {', '.join('{' + k + '}' for k in ph)}") from None
        if any("{bin}" in a for a in g.command):
            # before any reference build is made; one look per profile and command (the tree does not move under it)
            if ph["profile"] not in stale:
                stale[ph["profile"]] = stale_build(project, ph["profile"]) if os.path.isdir(ph["bin"]) else "does not exist"
            why_stale = stale[ph["profile"]]
            if why_stale:
                raise ForktoolError(f"gate {g.name} needs the {ph['profile']} build of this tree: "
                                    f"build/{ph['profile']} {why_stale}", where=f"build/{ph['profile']}",
                                    hint=f"run `forktool build --profile {ph['profile']}` first")
        if any("{upstream_bin}" in a for a in g.command):
            ensure_reference_build(project, ph["profile"])
        os.makedirs(ph["out"], exist_ok=True)
        output.info(f"gate {pid} {g.name}: {' '.join(argv)}")
        t0 = time.monotonic()
        r, timed_out = proc.run_session(argv, cwd=project.root, timeout=g.timeout)
        dt = time.monotonic() - t0
        log = os.path.join(ph["out"], f"{pid}-{g.name}.log")
        with open(log, "wb") as f:
            f.write(r.stdout + b"\n--- stderr ---\n" + r.stderr)
        err_text = r.stderr.decode("utf-8", "replace")
        parts = gate_parts(r.out + "\n" + err_text)
        result, reason = gate_verdict(g, r.returncode, err_text, parts, timed_out)
        ok = result == "pass"
        failed += result == "fail"
        unchecked += result == "not checked"
        tail = err_text.strip().splitlines()[-8:]
        if tail and reason.endswith(": " + tail[-1].strip()):  # the line the reason quotes is not shown twice
            tail.pop()
        if timed_out:
            tail.append(f"{reason} (the registry's timeout); every process it started was stopped")
        declared, not_run = part_lines(g, parts) if g.parts and parts else ([], [])
        rows.append(row | {"result": result, "exit_code": r.returncode, "timed_out": timed_out, "seconds": round(dt, 1),
                           "reason": reason,
                           "parts": parts, "parts_not_run": not_run,
                           "log": log, "stdout": r.out[-4000:]})
        mark = {"pass": "[green]pass[/green]", "not checked": "[yellow]not checked[/yellow]"}.get(result, "[red]FAIL[/red]")
        if declared:
            # the verdict covers the parts that ran: their sentences, never the whole gate's claim
            ran = len(g.parts) - len(not_run)
            lines.append(f"{mark} {pid} {g.name} ({dt:.0f} s): {ran} of its {len(g.parts)} parts ran")
            lines += declared
        else:
            lines.append(f"{mark} {pid} {g.name} ({dt:.0f} s): " + output.escape(g.proves))
            if parts:
                lines.append(output.escape("    parts run: " + ", ".join(f"{p['part']} {p['verdict']}" for p in parts)
                                           + "; a part not listed did not run"))
                lines += [output.escape(f"    {p['part']} {p['verdict']}: {p['why']}") for p in parts
                          if p["why"] and p["verdict"] != "pass"]
        if reason and not timed_out:
            lines.append(output.escape(f"    {reason}"))
        if not ok:
            lines += [output.escape(f"    {t}") for t in tail] + [output.escape(f"    full log: {log}")]
    if skipped and not list_only:
        lines.append(f"[yellow]{skipped} gate(s) skipped, so not checked[/yellow]: run them on a machine with an NVIDIA "
                     f"GPU, or select those this one can run (`forktool gates --list` says what each needs)")
    return Report({"gates": rows, "cuda": cuda, "cuda_reason": why, "failed": failed, "not_checked": unchecked,
                   "skipped": skipped}, lines,
                  exit_code=1 if failed or unchecked or skipped else 0)
