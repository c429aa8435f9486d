"""A move in progress (a sync, or `apply --reanchor`): where its files are, its recorded state, the two bases."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forktool import schema, series, txn, vendor
from forktool.errors import ConfigError, ForktoolError
from forktool.project import Component, Project
from forktool.series import Patch
from forktool.state import sync_state_path
from forktool.sync.accept import accept_journal
from forktool.sync.rerere import Memory
from forktool.tree import (
    REGULAR,
    Entry,
    Manifest,
    atomic_write,
    sha256_bytes,
)

STATE_VERSION = 1
TREE = "vendor/llamafile"
# what the loop keeps of the project besides the tree: restored byte for byte by --abort
PROJECT_FILES = ("vendor/vendor.yaml", "vendor/vendor.lock", ".opencoti/state.json",
                 "registry/UPSTREAM_SYNC.yaml", "registry/UPSTREAM_SYNC.md")
DROPPED = ("skipped", "upstreamed")
Progress = Callable[[str], None]


def sync_dir(project: Project) -> Path:
    """Beside the apply journal: the loop's state file and its own journal (txn/)."""
    return sync_state_path(project.state_dir).parent


def state_path(project: Project) -> Path:
    return sync_state_path(project.state_dir)


def undo_path(project: Project) -> Path:
    """The last finished sync, with what it left behind: `--undo` puts the project back until the next start."""
    return sync_dir(project) / "undo.json"


def ended_path(project: Project) -> Path:
    """How the last sync ended when nothing is left to undo (undone, aborted): the next start removes it."""
    return sync_dir(project) / "ended.json"


def report_path(project: Project) -> Path:
    """Every detail of the last finish (patches, hook sites, registry diff, verify, build plan)."""
    return sync_dir(project) / "report.md"


def write_report(project: Project, text: str) -> None:
    atomic_write(report_path(project), text.encode())


def memory(project: Project) -> Memory:
    return Memory(sync_dir(project) / "rerere")


def preimage_path(project: Project, rel: str) -> Path:
    """The conflicted text a stop wrote into the tree, kept to learn the resolution from later."""
    return sync_dir(project) / "preimage" / sha256_bytes(rel.encode())


def read_state(project: Project) -> dict | None:
    """The recorded sync, checked against its schema (forktool/schemas.py) before anything uses it."""
    st = schema.load_sync_state(state_path(project), project.state_dir)
    if st is None or st["stage"] == "aborted":
        return None
    if st["component"] not in {c.name for c in project.vendor.components}:
        raise ConfigError(f"the recorded sync moves component {st['component']!r}, which vendor/vendor.yaml does "
                          "not name", where=f"{state_path(project)}: component",
                          hint=schema.sync_state_hint(state_path(project)))
    return st


def has_backups(project: Project, st: dict) -> bool:
    """False for a stop recorded elsewhere (a CI branch): this checkout has none of its backups."""
    return bool(st.get("backups")) and not missing_backups(project, st)[0]


def missing_backups(project: Project, st: dict) -> tuple[list[str], bool]:
    """(the start's backup directories this checkout lacks, True when it has the other one: it made them itself and
    lost one since, rather than the sync being recorded elsewhere)."""
    b = st.get("backups") or {}  # both names or neither (the sync-state schema)
    dirs = [project.backups_dir / b["tree"], project.state_dir / "sync-backups" / b["project"]] if b else []
    gone = [d.relative_to(project.root).as_posix() for d in dirs if not d.is_dir()]
    return gone, 0 < len(gone) < len(dirs)


@dataclass
class Context:
    project: Project
    st: dict
    new_manifest: Manifest
    original: list[Patch]  # the series as it was at start, on the pinned upstream
    new: Component

    def new_read(self, rel: str) -> bytes | None:
        e = self.new_manifest.get(rel)
        return None if e is None else vendor.objects(self.project).get(e.sha256)

    def old_read(self, rel: str) -> bytes | None:
        return vendor.pristine_bytes(self.project, self._old, rel)

    def mode_of(self, rel: str) -> str:
        e = self.new_manifest.get(rel)
        return e.mode if e is not None else REGULAR

    def __post_init__(self) -> None:
        self._old = _pristine(self.project, self.st["old_pristine_digest"])


def _pristine(project: Project, d: str) -> Manifest:
    p = vendor.pristine_path(project, d)
    if not p.is_file():
        raise ForktoolError(f"pristine manifest {d[:12]} is not in the cache", where=str(p),
                            hint="run `forktool sync --abort`, or the start again with the same FORKTOOL_CACHE")
    return vendor.load_pristine_manifest(p)


def context(project: Project, st: dict) -> Context:
    original = [series.parse_patch(text.encode(), name) for name, text in st["original"]]
    return Context(project, st, _pristine(project, st["new_pristine_digest"]), original, component_of(st["to"]))


def component_of(raw: dict[str, Any]) -> Component:
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return Component(**fields)


def disk_patch(project: Project, name: str, pending: dict[str, bytes]) -> Patch:
    if name in pending:
        return series.parse_patch(pending[name], name)
    path = project.patches_dir / name
    if not path.is_file():  # removed (or replaced) during a stop: the sync carries this file
        raise ForktoolError(f"patches/{name} is gone, and the sync in progress carries it", where=f"patches/{name}",
                            hint=f"nothing was changed; put it back, then run the command again (`git checkout -- "
                                 f"patches/{name}` gives it as before the sync); to drop the stopped patch use "
                                 "`forktool sync --skip`; `forktool sync --abort` puts every patch back as before "
                                 "the start")
    return series.parse_patch(path.read_bytes(), name)


def done_patches(ctx: Context, pending: dict[str, bytes]) -> list[Patch]:
    """The patches already carried across, as they now stand in patches/ (dropped ones left out)."""
    return [disk_patch(ctx.project, d["name"], pending) for d in ctx.st["done"] if d["status"] not in DROPPED]


def reanchoring(st: dict) -> bool:
    """True for `apply --reanchor` carrying the series onto its own edited patches (the upstream stays)."""
    return st.get("kind") == "reanchor"


def project_manifest(project: Project) -> Manifest:
    out: Manifest = {}
    rels = [r for r in PROJECT_FILES if (project.root / r).is_file()]
    rels += sorted(f"patches/{p.name}" for p in project.patches_dir.iterdir() if p.is_file())
    for rel in rels:
        out[rel] = Entry(sha256_bytes((project.root / rel).read_bytes()), REGULAR)
    return out


def recover(project: Project) -> list[str]:
    """Finish every interrupted transaction a sync can leave, under the project lock the caller holds: the tree's
    (apply's journal), the loop's (.opencoti/sync/txn) and --accept's (.opencoti/sync-txn)."""
    notes = [txn.recover(project.tree, project.state_dir, "state"),
             txn.recover(project.root, sync_dir(project), "sync-state"),
             txn.recover(project.root, accept_journal(project))]
    gone = vendor.clean_temp(project)  # the temporary directories of a fetch that was killed
    if gone:
        notes.append(f"removed {len(gone)} temporary director(ies) a killed forktool left in .opencoti/{vendor.TMP}/")
    return [n for n in notes if n]


def backups_in_use(project: Project) -> dict[str, list[str]]:
    """Backups that a sync in progress (for --abort) or a finished one (for --undo) needs, by directory: what
    `backup prune` keeps (backup.in_use is the one reading of the sync's state files)."""
    from forktool.backup import in_use

    needed = in_use(project)
    return {"vendor-backups": sorted(p.name for p in needed if p.parent == project.backups_dir),
            "sync-backups": sorted(p.name for p in needed if p.parent != project.backups_dir)}


def component_json(c: Component) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in c._asdict().items()}
