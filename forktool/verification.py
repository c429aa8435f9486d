"""verify: every difference between the snapshot and what the lock, the patches and the registry say, in one report."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forktool import vendor
from forktool.apply import Applied, apply_patch
from forktool.authoring import export, steps
from forktool.cache import Cache, caches_root, key_of, tool_fingerprint
from forktool.errors import ApplyError
from forktool.regcheck import Problem, registry_problems
from forktool.tree import digest, sha256_bytes
from forktool.workspace import Workspace, series_digest


@dataclass
class Verdict:
    ok: bool
    problems: list[Problem]
    tree_digest: str
    series_digest: str
    applied: list[str]
    exported: int
    full_series: bool
    registry: dict[str, Any] | None = None  # None: the project keeps no registry
    advisories: list[str] = field(default_factory=list)
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": [{"where": p.where, "what": p.what} for p in self.problems],
                "tree_digest": self.tree_digest, "series_digest": self.series_digest, "applied": self.applied,
                "exported": self.exported, "full_series": self.full_series, "registry": self.registry,
                "advisories": self.advisories, "cached": self.cached}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Verdict:
        return cls(bool(raw["ok"]), [Problem(str(p["where"]), str(p["what"])) for p in raw["problems"]],
                   str(raw["tree_digest"]), str(raw["series_digest"]), [str(a) for a in raw["applied"]],
                   int(raw["exported"]), bool(raw["full_series"]), raw.get("registry"),
                   [str(a) for a in raw.get("advisories", [])], True)


def _file_digest(path: Path) -> str | None:
    try:
        return sha256_bytes(path.read_bytes())
    except (FileNotFoundError, IsADirectoryError):
        return None


def store_signature(ws: Workspace) -> str:
    """The stat fields of every pristine object in the cache: a changed object changes this key (taken once per
    verify: the verdict key and the pristine check both use it)."""
    parts = []
    root = str(ws.store.root)
    for e in ws.pristine.values():
        try:
            st = os.stat(f"{root}/{e.sha256[:2]}/{e.sha256[2:]}")
            parts.append((e.sha256, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        except OSError:
            parts.append((e.sha256, -1, 0, 0, 0))
    parts.sort()
    return key_of("store", parts)


def verdict_key(ws: Workspace, tree_digest: str, store_sig: str) -> str:
    """Everything a verdict depends on: tool, pristine and its cache, lock, pin, state, series, tree, registry,
    build config."""
    p = ws.project
    files = [p.vendor_lock, p.vendor_yaml, ws.state_dir / "state.json", p.series_file,
             p.registry_dir / "UPSTREAM_SYNC.yaml", p.registry_dir / "UPSTREAM_SYNC.md", p.registry_dir / "build.yaml",
             vendor.pristine_path(p, ws.pristine_digest)]
    return key_of("verdict", tool_fingerprint(), ws.pristine_digest, [_file_digest(f) for f in files],
                  [(x.name, x.sha256) for x in ws.patches], tree_digest, store_sig)


def verify(ws: Workspace) -> Verdict:
    """The verdict on the snapshot, from the cache when every input is unchanged, else proven and stored."""
    cache_root = caches_root(ws.state_dir, ws.use_cache)
    tree_digest = digest(ws.current())
    if cache_root is None:  # --no-cache: proven from the files, nothing remembered is read or written
        return prove(ws, tree_digest, None, "")
    store_sig = store_signature(ws)
    verdicts = Cache(cache_root, "verdict")
    key = verdict_key(ws, tree_digest, store_sig)
    hit = verdicts.get(key)
    if isinstance(hit, dict):
        try:
            return Verdict.from_json(hit)
        except (KeyError, TypeError, ValueError):
            pass
    v = prove(ws, tree_digest, cache_root, store_sig)
    verdicts.put(key, v.to_json())
    return v


def prove(ws: Workspace, tree_digest: str, cache_root: Path | None, store_sig: str) -> Verdict:
    """The verdict from the snapshot (cache_root None: nothing remembered is used; store_sig: store_signature's
    value, for the remembered pristine check)."""
    problems: list[Problem] = []
    lock_where = "vendor/vendor.lock"
    problems += [Problem(lock_where, f"pristine: {p}") for p in _pristine_problems(ws, cache_root, store_sig)]
    for s, p in ws.local_changes():
        problems.append(Problem(f"vendor/llamafile/{p}", f"tree: {s} {p} (no patch explains it)"))
    named = {p.id for p in ws.patches}
    for pid in ws.applied_stale():
        why = "file changed since it was applied" if pid in named else "applied, but patches/series no longer names it"
        problems.append(Problem(f"patches/{_name(ws, pid)}", f"patch {pid}: {why}; run `forktool apply`"))
    applied_ids = [a["id"] for a in ws.state.applied]
    if applied_ids != [p.id for p in ws.patches[:len(applied_ids)]]:
        problems.append(Problem(".opencoti/state.json", f"applied patches {applied_ids} are not a prefix of the series"))
    n = len(applied_ids)
    exported = 0
    reexports = Cache(cache_root, "reexport")
    acc = Applied()
    final: Applied | None = None
    try:
        # the top patch is exported from the tree on disk, the ones below it from the computed series
        for k, patch, before, read in steps(ws, n, top_from_disk=True, acc=acc):
            exported += 1
            if not _reexports_same(ws, reexports, patch, before, read, from_disk=k == n - 1):
                problems.append(Problem(f"patches/{patch.name}",
                                        f"patch {patch.id}: exporting it from the tree does not reproduce "
                                        f"patches/{patch.name} byte for byte (run `forktool refresh {patch.id}` "
                                        "to see the canonical form)"))
        for patch in ws.patches[n:]:
            apply_patch(patch, ws.base_bytes, acc)
        final = acc
    except ApplyError as e:
        problems.append(Problem(e.where, f"does not apply: {e.what}"))
    full = n == len(ws.patches) and n > 0
    sd = series_digest(ws.patches)
    if full:
        rec = vendor.load_lock(ws.project).get("patched", {})
        if rec.get("series_digest") != sd:
            problems.append(Problem(lock_where, "vendor.lock records no patched digest for this series; "
                                                "run `forktool apply` to record it"))
        elif rec.get("tree_digest") != tree_digest:
            problems.append(Problem(lock_where, f"patched tree digest {tree_digest[:12]} differs from vendor.lock "
                                                f"({rec.get('tree_digest', '')[:12]})"))
    reg = registry_problems(ws, final, cache_root)
    registry: dict[str, Any] | None = None
    advisories: list[str] = []
    if reg is not None:
        reg_problems, advisories, registry = reg
        problems += reg_problems
    return Verdict(not problems, problems, tree_digest, sd, applied_ids, exported, full, registry, advisories)


def _pristine_problems(ws: Workspace, cache_root: Path | None, store_sig: str) -> list[str]:
    """vendor.verify_pristine_cache, remembered by the lock's pin, vendor.yaml, the manifest and the objects' stat
    fields."""
    p = ws.project
    if cache_root is None:
        return vendor.verify_pristine_cache(p, use_cache=False)
    cache = Cache(cache_root, "pristine-check")
    lock = vendor.load_lock(p)
    pin = {k: lock.get(k) for k in ("components", "pristine_digest", "pristine_files")}  # not the patched record
    key = key_of("pristine-check", pin, _file_digest(p.vendor_yaml),
                 _file_digest(vendor.pristine_path(p, ws.pristine_digest)), store_sig)
    hit = cache.get(key)
    if isinstance(hit, list) and all(isinstance(x, str) for x in hit):
        return hit
    found = vendor.verify_pristine_cache(p)
    cache.put(key, found)
    return found


def _name(ws: Workspace, pid: str) -> str:
    return next((a["name"] for a in ws.state.applied if a["id"] == pid), pid)


def _reexports_same(ws: Workspace, cache: Cache, patch, before: Applied, read, *, from_disk: bool) -> bool:
    """Does exporting the patch from (before, after) give its bytes? Keyed by the patch bytes and the digests of
    its files before and after it."""
    cur = ws.current() if from_disk else {}
    pre, post = [], []
    for rel in patch.paths:
        b = before.files[rel] if rel in before.files else None
        if rel in before.files:
            pre.append(sha256_bytes(b) if b is not None else None)
        else:
            e = ws.pristine.get(rel)
            pre.append(e.sha256 if e else None)
        if from_disk:
            e2 = cur.get(rel)
            post.append(e2.sha256 if e2 else None)
        else:
            a = read(rel)
            post.append(sha256_bytes(a) if a is not None else None)
    modes = [ws.pristine[rel].mode if rel in ws.pristine else None for rel in patch.paths]
    key = key_of("reexport", patch.sha256, patch.paths, pre, post, modes)
    hit = cache.get(key)
    if isinstance(hit, bool):
        return hit
    same = export(ws, patch, before, read).raw == patch.raw
    cache.put(key, same)
    return same

