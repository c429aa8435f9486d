"""Vendor backups: a manifest of the whole tree plus only the files that differ from pristine."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from forktool.errors import ForktoolError
from forktool.store import ObjectStore
from forktool.tree import Manifest, atomic_write, digest, manifest_from_json, manifest_to_json, sha256_bytes

SLUG_OK = "abcdefghijklmnopqrstuvwxyz0123456789-"


@dataclass
class Backup:
    name: str
    path: Path
    created: str
    reason: str
    files: int
    stored: int
    tree_digest: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "path": str(self.path), "created": self.created, "reason": self.reason,
                "files": self.files, "stored": self.stored, "tree_digest": self.tree_digest}


def slugify(text: str) -> str:
    s = "".join(c if c in SLUG_OK else "-" for c in text.lower())
    return "-".join(p for p in s.split("-") if p)[:60] or "backup"


def create(backups_dir: Path, tree: Path, slug: str, reason: str, current: Manifest, pristine: Manifest,
           state: dict) -> Backup:
    """Back up the tree as `current` describes it, storing only files that differ from pristine."""
    backups_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = f"{stamp}-{slugify(slug)}"
    name, n = base, 2
    while (backups_dir / name).exists():
        name, n = f"{base}-{n}", n + 1
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=backups_dir))
    try:
        stored = []
        for rel, e in sorted(current.items()):
            if pristine.get(rel) == e:
                continue
            p = tree / rel
            data = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
            if sha256_bytes(data) != e.sha256:
                raise ForktoolError(f"{rel} changed while it was being backed up", where=str(p),
                                    hint="stop whatever is writing to the vendored tree and retry")
            ObjectStore(tmp / "objects").put(data)
            stored.append(rel)
        meta: dict = {"name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reason": reason,
                "tree_digest": digest(current), "files": manifest_to_json(current), "stored": stored,
                "state": state}
        atomic_write(tmp / "manifest.json", json.dumps(meta, indent=1, sort_keys=True).encode())
        tmp.rename(backups_dir / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Backup(name, backups_dir / name, meta["created"], reason, len(current), len(stored), meta["tree_digest"])


def _load(path: Path) -> dict:
    try:
        return json.loads((path / "manifest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError) as e:
        raise ForktoolError(f"backup {path.name} has no readable manifest.json", where=str(path),
                            hint="the backup is damaged; pick another one (`forktool backup list`)") from e


def list_backups(backups_dir: Path) -> list[Backup]:
    out: list[Backup] = []
    if not backups_dir.is_dir():
        return out
    for p in sorted(backups_dir.iterdir()):
        if p.name.startswith(".") or not p.is_dir():
            continue
        try:
            m = _load(p)
        except ForktoolError:
            out.append(Backup(p.name, p, "?", "damaged: no manifest", 0, 0, ""))
            continue
        out.append(Backup(p.name, p, m["created"], m["reason"], len(m["files"]), len(m["stored"]), m["tree_digest"]))
    return out


def find(backups_dir: Path, name: str) -> Path:
    p = backups_dir / name
    if not name or "/" in name or not p.is_dir():
        names = [b.name for b in list_backups(backups_dir)]
        raise ForktoolError(f"no backup named {name!r}", where=str(backups_dir),
                            hint="`forktool backup list` shows them" + (f"; newest: {names[-1]}" if names else ""))
    return p


def load_for_restore(path: Path, pristine_get) -> tuple[Manifest, dict[str, bytes], dict]:
    """The backed-up manifest, every file's bytes (checked against it), and the saved state."""
    m = _load(path)
    manifest = manifest_from_json(m["files"])
    if digest(manifest) != m["tree_digest"]:
        raise ForktoolError(f"backup {path.name}: manifest does not match its recorded digest", where=str(path),
                            hint="the backup was tampered with; pick another one")
    store = ObjectStore(path / "objects")
    stored = set(m["stored"])
    contents: dict[str, bytes] = {}
    for rel, e in manifest.items():
        data = store.get(e.sha256) if rel in stored else pristine_get(e.sha256)
        if sha256_bytes(data) != e.sha256:
            raise ForktoolError(f"backup {path.name}: {rel} does not match its sha256", where=str(path))
        contents[rel] = data
    return manifest, contents, m.get("state", {})


def prune(backups_dir: Path, keep: int) -> list[str]:
    if keep < 0:
        raise ForktoolError("--keep must be zero or more")
    backups = list_backups(backups_dir)
    doomed = backups[: max(0, len(backups) - keep)]
    for b in doomed:
        shutil.rmtree(b.path)
    return [b.name for b in doomed]
