"""registry check: registry, series, patches and tree agree both ways; every problem names its place."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from forktool import registry as rg
from forktool.apply import Applied
from forktool.cache import Cache, key_of
from forktool.errors import ApplyError, ForktoolError
from forktool.impact import impacts_for
from forktool.markers import MARKER_RE, Marker, hooks_in_patch, scan_file
from forktool.project import Project
from forktool.series import Patch
from forktool.symbols import find_symbol, site_symbol
from forktool.workspace import Workspace


@dataclass(frozen=True)
class Problem:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def _strip_marker(line: bytes) -> bytes:
    m = MARKER_RE.search(line)
    if not m:
        return line.strip()
    head = line[: m.start()].rstrip()
    for opener in (b"//", b"#", b"/*"):
        if head.endswith(opener):
            head = head[: -len(opener)]
    return head.strip()


def _edited_upstream_lines(patch: Patch) -> list[Problem]:
    out = []
    for f in patch.files:
        for n, h in enumerate(f.hunks, 1):
            removed = {t.strip() for op, t in h.lines if op == b"-"}
            for op, t in h.lines:
                if op == b"+" and MARKER_RE.search(t) and _strip_marker(t) and _strip_marker(t) in removed:
                    out.append(Problem(f"patches/{patch.name}: {f.path} hunk #{n}",
                                       "marker on an upstream line (an existing line was edited to carry it); "
                                       "put the marker on a line the patch adds"))
    return out


NEAR_MISS_RE = re.compile(rb"(?i)opencoti[-_ ]?ho+ks?\b:?\s*\S*")


def _near_miss_markers(patch: Patch) -> list[Problem]:
    """Added lines that name a marker but are not one (`opencoti-hook kv-x`, `opencoti-hok: kv-x`, `OPENCOTI-HOOK:`):
    the hook would silently not exist."""
    out = []
    for f in patch.files:
        for n, h in enumerate(f.hunks, 1):
            for op, t in h.lines:
                if op != b"+":
                    continue
                for m in NEAR_MISS_RE.finditer(t):
                    if not MARKER_RE.match(t, m.start()):
                        out.append(Problem(f"patches/{patch.name}: {f.path} hunk #{n}",
                                           f"{m.group().decode(errors='replace')!r} is not a marker; write "
                                           "`opencoti-hook: <hook-id>` (lowercase, a colon, then the id)"))
    return out


def pristine_markers(ws: Workspace, cache_root: Path | None) -> list[Marker]:
    """Markers upstream itself carries (normally none), cached by the pristine digest."""
    cache = Cache(cache_root, "pristine-markers")
    key = key_of("pristine-markers", ws.pristine_digest)
    hit = cache.get(key)
    if isinstance(hit, list):
        try:
            return [Marker(str(r), int(n), str(h)) for r, n, h in hit]
        except (TypeError, ValueError):
            pass
    found: list[Marker] = []
    for rel, pe in ws.pristine.items():
        data = ws.base_bytes(rel) if pe.mode != "120000" else b""
        found.extend(scan_file(rel, data or b""))
    cache.put(key, [[m.path, m.line, m.hook] for m in found])
    return found


def check(ws: Workspace, reg: rg.Registry, final: Applied | None = None,
          cache_root: Path | None = None) -> tuple[list[Problem], list[str]]:
    """(problems, warnings). final: the fully applied series in memory, computed here when not given."""
    project: Project = ws.project
    P: list[Problem] = []
    warn: list[str] = []
    regf = "registry/UPSTREAM_SYNC.yaml"
    series_ids = [p.id for p in ws.patches]
    for p in ws.patches:
        if reg.patch(p.id) is None:
            P.append(Problem(f"patches/series: {p.name}", f"patch {p.id} is missing from {regf}"))
    for entry in reg.patches:
        if entry.id not in series_ids:
            P.append(Problem(f"{regf}: patch {entry.id}", f"{entry.file} is registered but not in patches/series"))
    for p in ws.patches:
        e = reg.patch(p.id)
        if e is None:
            continue
        where = f"{regf}: patch {p.id}"
        if e.file != p.name:
            P.append(Problem(where, f"file is {e.file!r} but the series names {p.name!r}"))
        touched, declared = set(p.paths), set(e.files)
        for f in sorted(touched - declared):
            P.append(Problem(where, f"the patch touches {f}, which its entry does not declare"))
        for f in sorted(declared - touched):
            P.append(Problem(where, f"declares {f}, which the patch does not touch"))
        computed = impacts_for(project, p.paths)
        if sorted(computed) != sorted(e.build_impact):
            culprits = [f for f in p.paths if impacts_for(project, [f]) and
                        not set(impacts_for(project, [f])) <= set(e.build_impact)]
            P.append(Problem(where, f"declared build impact {list(e.build_impact)} but the touched paths give "
                                    f"{computed}" + (f" (e.g. {culprits[0]})" if culprits else "")))
        in_patch = set(hooks_in_patch(p))
        for h in sorted(in_patch - set(e.hooks)):
            P.append(Problem(where, f"the patch adds markers for hook {h!r}, which its entry does not list"))
        for h in sorted(set(e.hooks) - in_patch):
            P.append(Problem(where, f"lists hook {h!r} but the patch adds no marker for it"))
        for h in e.hooks:
            hk = reg.hooks.get(h)
            if hk is None:
                P.append(Problem(where, f"hook {h!r} has no entry under hooks:"))
            elif hk.patch != p.id:
                P.append(Problem(f"{regf}: hooks.{h}", f"owned by patch {hk.patch}, but patch {p.id} lists it"))
        P.extend(_edited_upstream_lines(p))
        P.extend(_near_miss_markers(p))
    for hid, hk in reg.hooks.items():
        owner = reg.patch(hk.patch)
        if owner is None:
            P.append(Problem(f"{regf}: hooks.{hid}", f"owning patch {hk.patch} is not registered"))
        elif hid not in owner.hooks:
            P.append(Problem(f"{regf}: hooks.{hid}", f"patch {hk.patch} does not list this hook"))

    # sites: checked on the fully applied series computed in memory, whatever the tree holds now
    if final is None:
        try:
            final = ws.compute(ws.patches)
        except ApplyError as e:
            # no whole series to find the sites in: one problem that says so, not the end of the check (verify
            # lists the patch that does not apply beside it; a registry check has no other way to say it)
            P.append(Problem(e.where or regf, f"hook sites not checked: the series does not apply ({e.what})"))
    if final is not None:
        scopes_cache = Cache(cache_root, "scopes")
        markers: list[Marker] = []
        for rel, data in sorted(final.files.items()):
            if data is not None:
                markers.extend(scan_file(rel, data))
        by_hook: dict[str, list[Marker]] = {}
        for m in markers:
            by_hook.setdefault(m.hook, []).append(m)
        for m in markers:
            if m.hook not in reg.hooks:
                P.append(Problem(f"{m.path}:{m.line}", f"marker for hook {m.hook!r}, which nobody registered"))
        for hid, hk in reg.hooks.items():
            found = by_hook.get(hid, [])
            site_files = {s.file for s in hk.sites}
            for s in hk.sites:
                here = [m for m in found if m.path == s.file]
                w = f"{regf}: hooks.{hid} site {s.file} {s.symbol}"
                if not here:
                    P.append(Problem(w, "no marker for this hook in that file"))
                    continue
                data = final.files.get(s.file)
                assert data is not None
                syms = {m.line: site_symbol(data, m.line, scopes_cache) for m in here}
                if s.symbol not in syms.values():
                    P.append(Problem(w, "no marker inside the declared symbol (markers are in "
                                        f"{', '.join(sorted(set(syms.values())))})"))
                declared = {x.symbol for x in hk.sites if x.file == s.file}
                for line, sym in sorted(syms.items()):
                    if sym not in declared:
                        P.append(Problem(f"{s.file}:{line}", f"marker for {hid!r} is in {sym}, outside its declared "
                                                             f"site(s) {', '.join(sorted(declared))}"))
                at = find_symbol(data, s.symbol, scopes_cache)
                if s.line is not None and at is not None and at != s.line:
                    warn.append(f"{w}: advisory line {s.line}, now {at}")
            for m in found:
                if m.path not in site_files:
                    P.append(Problem(f"{m.path}:{m.line}", f"marker for {hid!r} in a file none of its sites names"))

    # the tree: unregistered markers anywhere, and markers upstream itself would carry
    for m in pristine_markers(ws, cache_root):
        P.append(Problem(f"{m.path}:{m.line} (pristine)", f"upstream line carries marker {m.hook!r}"))
    if project.tree.exists():
        for rel in sorted(set(ws.state.files) | {p for _, p in ws.local_changes()}):
            data = ws.disk_bytes(rel)
            for m in scan_file(rel, data or b""):
                if m.hook not in reg.hooks:
                    P.append(Problem(f"{rel}:{m.line} (tree)", f"marker for hook {m.hook!r}, which nobody registered"))
    # duplicates are rejected at load; keep the order of problems stable
    uniq = list(dict.fromkeys(P))
    return uniq, warn


REGISTRY = "registry/UPSTREAM_SYNC.yaml"


def render_md(reg: rg.Registry) -> str:
    """registry/UPSTREAM_SYNC.md rendered from the registry (jinja2, loaded only here)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("forktool", "templates"), keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env.get_template("UPSTREAM_SYNC.md.j2").render(reg=reg)


def _md_stale(registry_dir: Path, yaml_path: Path, reg: rg.Registry, cache_root: Path | None) -> bool:
    """Is UPSTREAM_SYNC.md other than what render_md makes of the YAML? Remembered by both files' digests."""
    from forktool.cache import tool_fingerprint
    from forktool.tree import sha256_bytes

    md = registry_dir / "UPSTREAM_SYNC.md"
    md_bytes = md.read_bytes() if md.is_file() else None
    cache = Cache(cache_root, "registry-md")
    key = key_of("registry-md", tool_fingerprint(), sha256_bytes(yaml_path.read_bytes()),
                 sha256_bytes(md_bytes) if md_bytes is not None else None)
    hit = cache.get(key)
    if isinstance(hit, bool):
        return hit
    stale = md_bytes is None or md.read_text() != render_md(reg)
    cache.put(key, stale)
    return stale


def registry_problems(ws: Workspace, final: Applied | None, cache_root: Path | None,
                      ) -> tuple[list[Problem], list[str], dict] | None:
    """(problems, advisories, summary) of the registry against the snapshot; None when there is no registry.

    A registry that does not load is one problem among the others, not the end of the check.
    """
    path = ws.project.registry_dir / "UPSTREAM_SYNC.yaml"
    if not path.is_file():
        return None
    try:
        reg = rg.load(path)
    except ForktoolError as e:
        return [Problem(e.where or REGISTRY, e.what)], [], {"ok": False, "patches": 0, "hooks": 0}
    problems, warnings = check(ws, reg, final, cache_root)
    if _md_stale(ws.project.registry_dir, path, reg, cache_root):
        problems.append(Problem("registry/UPSTREAM_SYNC.md", "is stale; run `forktool registry render`"))
    return problems, warnings, {"ok": not problems, "patches": len(reg.patches), "hooks": len(reg.hooks)}
