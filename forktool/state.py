"""The recorded state of the vendored tree (.opencoti/state.json): one load and one save."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from forktool import schema, schemas
from forktool.errors import ForktoolError
from forktool.tree import Entry, atomic_write, read_file

if TYPE_CHECKING:
    from forktool.project import Project

STATE_VERSION = 1
STATE_FILE = "state.json"


class State:
    __slots__ = ("pristine_digest", "applied", "files")

    def __init__(self, pristine_digest: str = "", applied: list[dict] | None = None,
                 files: dict[str, Entry | None] | None = None):
        self.pristine_digest = pristine_digest
        self.applied: list[dict] = [] if applied is None else applied  # {id, name, sha256, diff_sha256, drift}
        # touched paths after the applied patches
        self.files: dict[str, Entry | None] = {} if files is None else files

    def to_json(self) -> dict:
        return {"version": STATE_VERSION, "pristine_digest": self.pristine_digest, "applied": self.applied,
                "files": {p: (e.to_json() if e else None) for p, e in sorted(self.files.items())}}

    @classmethod
    def from_json(cls, raw: dict) -> State:
        return cls(raw.get("pristine_digest", ""), list(raw.get("applied", [])),
                   {p: (Entry(v[0], v[1]) if v else None) for p, v in raw.get("files", {}).items()})

    @property
    def top(self) -> str | None:
        return self.applied[-1]["id"] if self.applied else None


def load_state(state_dir: Path, pristine_digest: str, tree: Path) -> State:
    """The recorded state, or an empty one on pristine_digest when none is recorded yet."""
    p = state_dir / STATE_FILE
    raw = schema.load_state(p, state_dir)
    if raw is None:
        return State(pristine_digest)
    st = State.from_json(raw)
    if st.pristine_digest != pristine_digest and tree.exists():
        raise ForktoolError("the vendored tree was made from another upstream than vendor.lock pins",
                            where=str(tree), hint="run `forktool unapply` on the old pin, or remove "
                            "vendor/llamafile and run `forktool apply` to start from the new pin")
    return st


def sync_state_path(state_dir: Path) -> Path:
    """Where `forktool sync` (and `apply --reanchor`) records a move in progress, beside the apply journal."""
    return state_dir / "sync" / "state.json"


def state_bytes(state: State) -> bytes:
    """The bytes save_state writes: a transaction that moves the tree writes the same bytes through its journal."""
    return json.dumps(state.to_json(), indent=1, sort_keys=True).encode()


def save_state(state_dir: Path, state: State) -> None:
    atomic_write(state_dir / STATE_FILE, state_bytes(state))


def applied_stamp(project: Project) -> str:
    """The build stamp (LLAMA_BUILD_COMMIT) of the series prefix the state records as applied."""
    from forktool.build import stamp

    try:
        st = State.from_json(json.loads(read_file(project.state_dir / STATE_FILE)))
    except FileNotFoundError:
        st = State()
    except (json.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise ForktoolError(f"{project.state_dir / STATE_FILE} is unreadable: {e}",
                            where=str(project.state_dir / STATE_FILE), hint=schemas.fix("state")) from e
    comps = project.vendor.components
    commit = comps[0].upstream_commit if comps else ""
    return stamp(commit, [(a["id"], a["name"], a["sha256"]) for a in st.applied], False)[0]
