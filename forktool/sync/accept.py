"""--accept: move the pin and the refreshed patches to the new upstream, backed up, in one transaction."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from forktool import backup as bk
from forktool import txn
from forktool.errors import ConfigError, ForktoolError
from forktool.project import Component, Project, parse_component
from forktool.sync.report import SyncResult
from forktool.sync.trial import PatchResult
from forktool.tree import REGULAR, Entry, sha256_file


def _scalar(value: str, was: str) -> str:
    """value written the way the line it replaces was (plain or quoted), plain only where YAML reads it back as
    this very string."""
    plain = not was.startswith(("'", '"')) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/+-]*", value) is not None \
        and yaml.safe_load(value) == value
    return value if plain else json.dumps(value)


# the keys that say where a component's source comes from, in the order a new one is written
SOURCE_KEYS = ("kind", "package", "version", "url", "path", "commit", "sha256", "upstream_commit", "subdir")


def _repin_text(text: str, name: str, new: Component) -> str:
    """vendor.yaml with one component's source moved (another version, or another kind of source), its filters,
    comments and layout kept; checked by re-parsing."""
    lines = text.split("\n")
    start = next((i for i, ln in enumerate(lines)
                  if re.match(r"^\s*-\s*name:\s*['\"]?" + re.escape(name) + r"['\"]?\s*$", ln)), None)
    if start is None:
        raise ConfigError(f"cannot find component {name!r} in vendor.yaml", where="vendor/vendor.yaml",
                          hint=f"write its entry as a block that starts with the line `- name: {name}`")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].lstrip().startswith("#")
                                or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    values = {k: getattr(new, k) for k in SOURCE_KEYS}
    block = lines[start:end]
    key_indent = " " * (indent + 2)
    seen = set()
    out = []
    anchor = 0  # the last source line kept: keys the old source lacked go after it
    key_re = re.compile(r"^(\s*)(" + "|".join(SOURCE_KEYS) + r"):")
    for ln in block:
        m = key_re.match(ln)
        if m and len(m.group(1)) == len(key_indent) and m.group(2) in values:
            seen.add(m.group(2))
            if values[m.group(2)]:
                out.append(f"{m.group(1)}{m.group(2)}: {_scalar(values[m.group(2)], ln[m.end():].strip())}")
                anchor = len(out) - 1
            continue  # a key this source does not have (or an unknown upstream commit): the stale line goes
        out.append(ln)
    for k in SOURCE_KEYS:
        if k not in seen and values[k]:
            anchor += 1
            out.insert(anchor, f"{key_indent}{k}: {_scalar(values[k], '')}")
    result = "\n".join(lines[:start] + out + lines[end:])
    raw = yaml.safe_load(result)
    got = next(parse_component(c, "vendor.yaml") for c in raw["components"] if c.get("name") == name)
    if got != new:
        raise ConfigError("rewriting vendor.yaml did not give the intended pin", where="vendor/vendor.yaml",
                          details=[f"wanted {new}", f"got {got}"], hint="edit the pin by hand")
    return result


def comment_out(text: str, why: dict[str, str]) -> str:
    """patches/series with each named patch's line commented out, its reason after it (the patch file is kept,
    so nothing is lost): the one series rewriter of the trial, --accept and the loop."""
    out = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        name = entry.split()[0] if entry else ""
        out.append(f"# {line.strip()}  # {why[name]}" if name in why else line)
    return "\n".join(out) + "\n"


def _series_text(results: list[PatchResult], original: str, spec: str) -> str:
    """patches/series with upstreamed patches commented out (kept on disk, so nothing is lost)."""
    return comment_out(original, {r.patch.name: f"upstreamed in {spec} (forktool sync)" for r in results
                                  if r.status == "upstreamed"})


def accept_journal(project: Project) -> Path:
    """--accept's own journal (its state is not the loop's), recovered with the others by sync.loop.recover."""
    return project.state_dir / "sync-txn"


def accept(project: Project, res: SyncResult) -> dict:
    """Move the pin and the patches to the new upstream: backed up first, then one journaled transaction."""
    if not res.acceptable:
        bad = [f"{r.patch.id} {r.status}" for r in res.results if r.status in ("conflict", "blocked")]
        raise ForktoolError(f"--accept refused: {len(bad)} patch(es) conflict or are blocked", where="forktool sync",
                            details=bad, hint="resolve them on the new upstream first (see the report), or sync "
                            "to another version")
    root = project.root
    writes: list[txn.Write] = [txn.Write("vendor/vendor.yaml", res.yaml_text.encode(), REGULAR)]
    for r in res.results:
        if r.refreshed is not None and r.changed:
            writes.append(txn.Write(f"patches/{r.patch.name}", r.refreshed.raw, REGULAR))
    writes.append(txn.Write("patches/series", res.series_text.encode(), REGULAR))
    writes = [w for w in writes if (root / w.path).read_bytes() != w.data]
    current = {w.path: Entry(sha256_file(root / w.path), REGULAR) for w in writes}
    txn_state = accept_journal(project)
    with txn.locked(project.state_dir):
        from forktool.sync.move import read_state, state_path

        running = read_state(project)
        if running is not None:  # the loop owns pin, patches and series until it finishes or is aborted
            raise ForktoolError(f"--accept refused: a sync to {running['to_spec']} is in progress "
                                f"({running['stage']})", where=str(state_path(project)),
                                hint="nothing was changed (the report was written); finish that sync (`forktool "
                                     "sync --continue`) or `forktool sync --abort` it, then run the trial with "
                                     "--accept again")
        new = res.target.new
        b = bk.create(project.state_dir / "sync-backups", root, f"accept-{new.version or new.commit[:12] or new.kind}",
                      f"before forktool sync --accept to {res.target.new.spec}", current, {},
                      {"kind": "sync-accept", "from": res.target.old.spec, "to": res.target.new.spec})
        txn.commit(root, txn_state, writes, {"accepted": res.target.new.spec})
    return {"written": [w.path for w in writes], "backup": str(b.path.relative_to(root)),
            "next": "the vendored tree still holds the old upstream: run `forktool unapply`, remove "
                    "vendor/llamafile, then `forktool vendor fetch && forktool apply`"}

