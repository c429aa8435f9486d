"""`sync --undo` killed for real (SIGKILL) inside its journal's steps: the next `--undo` finishes it, and leaves
nothing behind (docs/safety.md "No temporary files left behind"; docs/sync.md, `--undo`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.project import REPO, Proj
from tests.helpers.sync import everything, loop_series, new_upstream, resolve

# a SIGKILL after the journal's state.json (.opencoti/sync/state.json) is written to its temporary file and fsynced,
# before the rename: os._exit(137) in place of that one os.replace is what a kill -9 at that moment leaves
KILL_BEFORE_STATE_RENAME = """
import os, sys
real = os.replace
def replace(src, dst, *a, **k):
    if os.fspath(dst).endswith(os.path.join(".opencoti", "sync", "state.json")):
        os._exit(137)
    return real(src, dst, *a, **k)
os.replace = replace
sys.argv = ["forktool", "sync", "--undo"]
from forktool.cli import entry
entry()
"""


@pytest.fixture
def finished(proj: Proj) -> tuple[Proj, dict[str, str]]:
    loop_series(proj)
    before = everything(proj)
    commit = new_upstream(proj)
    proj.run("sync", "--to", commit, "--start", expect=1)
    resolve(proj)
    proj.run("sync", "--continue")
    return proj, before


def _temps(proj: Proj) -> list[str]:
    """Files under .opencoti/sync that are neither the sync's records nor its rerere memory: what a killed write left."""
    sync = proj.root / ".opencoti" / "sync"
    return sorted(p.relative_to(proj.root).as_posix() for p in sync.rglob("*")
                  if p.is_file() and ("tmp" in p.name or ".new" in p.name or "txn" in p.relative_to(sync).parts))


def test_an_undo_killed_while_the_journal_writes_its_state_leaves_no_temporary_file(finished):
    proj, before = finished
    r = subprocess.run([sys.executable, "-c", KILL_BEFORE_STATE_RENAME], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, FORKTOOL_ROOT=str(proj.root)))
    assert r.returncode == 137, r.stderr
    left = _temps(proj)  # what a real kill -9 leaves: the journal, with the state's temporary file inside it
    assert ".opencoti/sync/txn/plan.json" in left, left
    assert [p for p in left if p.startswith(".opencoti/sync/txn/.forktool-") and p.endswith(".tmp")], left
    assert not [p for p in left if not p.startswith(".opencoti/sync/txn/")], left  # nothing beside state.json
    r = proj.sub("sync", "--undo")
    assert r.returncode == 0, r.stderr
    assert "finished an interrupted update" in r.stderr, r.stderr
    assert everything(proj) == before
    assert _temps(proj) == [], "left behind after the next --undo finished the killed one"


def test_a_journal_half_removed_by_a_kill_is_carried_out_again_not_called_untouched(finished):
    # a kill inside the journal's own removal (its staged files gone, plan.json not yet): the next command carries
    # the plan out again (every entry idempotent) and says so, not "had not started writing (tree untouched)"
    proj, before = finished
    r = proj.sub("sync", "--undo", env={"FORKTOOL_FAULT": "dropping"})
    assert r.returncode == 137, r.stderr
    assert _temps(proj) == [".opencoti/sync/txn/plan.json"]
    r = proj.sub("sync", "--undo")
    assert r.returncode == 0, r.stderr
    assert "finished an interrupted update" in r.stderr and "tree untouched" not in r.stderr, r.stderr
    assert everything(proj) == before
    assert _temps(proj) == []
