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
    """value written the way the line it replaces was (plain or quoted), plain only where YAML reads a string."""
    plain = not was.startswith(("'", '"')) and re.fullmatch(r"[0-9a-f]{40,64}", value) is not None \
        and isinstance(yaml.safe_load(value), str)
    return value if plain else json.dumps(value)


def _repin_text(text: str, name: str, new: Component) -> str:
    """vendor.yaml with one component's pin moved, comments and layout kept; checked by re-parsing."""
    lines = text.split("\n")
    start = next((i for i, ln in enumerate(lines)
                  if re.match(r"^\s*-\s*name:\s*['\"]?" + re.escape(name) + r"['\"]?\s*$", ln)), None)
    if start is None:
        raise ConfigError(f"cannot find component {name!r} in vendor.yaml", where="vendor/vendor.yaml")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].lstrip().startswith("#")
                                or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    keys = ("version", "sha256", "upstream_commit") if new.kind == "sdist" else ("url", "commit", "upstream_commit")
    values = {k: getattr(new, k) for k in keys}
    block = lines[start:end]
    key_indent = " " * (indent + 2)
    seen = set()
    out = []
    for ln in block:
        m = re.match(r"^(\s*)(version|sha256|upstream_commit|url|commit):", ln)
        if m and m.group(2) in values:
            seen.add(m.group(2))
            key_indent = m.group(1)
            if values[m.group(2)]:
                out.append(f"{m.group(1)}{m.group(2)}: {_scalar(values[m.group(2)], ln[m.end():].strip())}")
            continue  # an unknown upstream commit: drop the stale line rather than keep a wrong one
        out.append(ln)
    missing = [k for k in keys if k not in seen and values[k]]
    if missing:
        anchor = next(i for i, ln in enumerate(out) if re.match(r"^\s*(sha256|commit):", ln))
        for k in reversed(missing):
            out.insert(anchor + 1, f"{key_indent}{k}: {json.dumps(values[k])}")
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
        b = bk.create(project.state_dir / "sync-backups", root, f"accept-{res.target.new.version or 'commit'}",
                      f"before forktool sync --accept to {res.target.new.spec}", current, {},
                      {"kind": "sync-accept", "from": res.target.old.spec, "to": res.target.new.spec})
        txn.commit(root, txn_state, writes, {"accepted": res.target.new.spec})
    return {"written": [w.path for w in writes], "backup": str(b.path.relative_to(root)),
            "next": "the vendored tree still holds the old upstream: run `forktool unapply`, remove "
                    "vendor/llamafile, then `forktool vendor fetch && forktool apply`"}

