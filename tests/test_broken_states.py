"""Every command of `forktool --help` on each broken project state: a refusal naming what, where and what next, or
the report the docs describe; never an exit 0 over a check it did not make, and the project left as it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests import corpus
from tests.helpers.cli import run_cli
from tests.helpers.project import UPSTREAM, git, make_project
from tests.helpers.series import three_patches


def _absent(r: Path) -> None:
    shutil.rmtree(r / "vendor" / "llamafile")


def _a_file(r: Path) -> None:
    shutil.rmtree(r / "vendor" / "llamafile")
    (r / "vendor" / "llamafile").write_text("not a tree\n")


def _bad_yaml(r: Path) -> None:
    (r / "vendor" / "vendor.yaml").write_text("components: [\n  - name: up\n")


def _unknown_key(r: Path) -> None:
    with open(r / "vendor" / "vendor.yaml", "a") as f:
        f.write("colour: blue\n")


def _lock_truncated(r: Path) -> None:
    p = r / "vendor" / "vendor.lock"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _no_state(r: Path) -> None:
    (r / ".opencoti" / "state.json").unlink()


def _garbage_state(r: Path) -> None:
    (r / ".opencoti" / "state.json").write_text("{garbage\n")


def _missing_patch(r: Path) -> None:
    with open(r / "patches" / "series", "a") as f:
        f.write("0099-missing.patch\n")


def _stopped_sync(r: Path) -> None:
    """Nothing to spoil: the cell starts from the template's stopped sync."""


STATES: dict[str, Callable[[Path], None]] = {
    "tree-absent": _absent, "tree-a-file": _a_file, "yaml-invalid": _bad_yaml, "yaml-unknown-key": _unknown_key,
    "lock-truncated": _lock_truncated, "state-absent": _no_state, "state-garbage": _garbage_state,
    "series-missing-patch": _missing_patch, "sync-stopped": _stopped_sync,
}

COMMANDS: dict[str, list[str]] = {
    "status": ["status"], "verify": ["verify"], "verify-no-cache": ["verify", "--no-cache"], "apply": ["apply"],
    "unapply": ["unapply"], "refresh": ["refresh", "@ID@"], "new": ["new", "slug-x"], "markers": ["markers"],
    "registry-check": ["registry", "check"], "vendor-status": ["vendor", "status"], "vendor-fetch": ["vendor", "fetch"],
    "backup-list": ["backup", "list"], "backup-create": ["backup", "create"], "build-plan": ["build", "--plan"],
    "gates-list": ["gates", "--list"], "package": ["package", "--out", "@OUT@/dist"],
    "sync-trial": ["sync", "--to", "@TO@", "--out", "@OUT@/sync"], "recover": ["recover"],
}

# the exit code of each cell: one column a state, in the order of STATES. 0 is a report the docs describe (REPORTS
# says what it must say) or a command that does not read what is broken; R: the command's job is to make the tree,
# and it leaves a clean project; x before the code: a known defect, expected to fail until it is fixed (strict)
MATRIX = {
    #                 absent a-file yaml  key  lock  no-st garb  series sync
    "status":          "0     1     1     1     1     0     1     1     0",
    "verify":          "1     1     1     1     1     1     1     1     1",
    "verify-no-cache": "1     1     1     1     1     1     1     1     1",
    "apply":           "R     1     1     1     1     1     1     1     1",
    "unapply":         "R     1     1     1     1     1     1     1     1",
    "refresh":         "1     1     1     1     1     2     1     1     1",
    "new":             "1     1     1     1     1     1     1     1     1",
    "markers":         "1     1     1     1     1     0     1     1     1",
    "registry-check":  "0     1     1     1     1     0     1     1     1",
    "vendor-status":   "0     1     1     1     1     0     0     0     0",
    "vendor-fetch":    "R     1     1     1     1     0     0     0     0",
    "backup-list":     "0     0     0     0     0     0     0     0     0",
    "backup-create":   "1     1     1     1     1     0     1     1     1",
    "build-plan":      "1     1     1     1     1     0     1     1     1",
    "gates-list":      "0     0     0     0     0     0     0     0     0",
    "package":         "1     1     1     1     1     1     1     1     1",
    "sync-trial":      "0     0     1     1     1     0     0     1     1",
    "recover":         "0     0     0     0     0     0     0     0     0",
}

# what a refusal must name: the broken state, not a consequence of it (a tree read as every file removed)
NAMES = {
    "tree-absent": "the vendored tree is absent", "tree-a-file": "is not a directory",
    "yaml-invalid": "vendor.yaml is not valid YAML", "yaml-unknown-key": "unknown key(s): colour",
    "lock-truncated": "vendor.lock is not valid JSON", "state-absent": "there is no .opencoti/state.json",
    "state-garbage": "state.json is not valid JSON", "series-missing-patch": "0099-missing.patch",
    "sync-stopped": "is in progress (stopped)",
}

# what an exit-0 cell must say: the broken state named, or the report of a command that does not read it
REPORTS = {
    ("tree-absent", "status"): "tree: absent",
    ("tree-absent", "registry-check"): "not checked: the vendored tree, which is absent",
    ("tree-absent", "vendor-status"): "tree absent",
    ("state-absent", "status"): "tree: dirty",
    ("state-absent", "markers"): "up/src/b.c:11:two",
    ("state-absent", "registry-check"): "not checked: the sites of the markers in the 3 file(s)",
    ("state-absent", "backup-create"): "(the rest are pristine)",
    ("state-absent", "build-plan"): "the stamp says .dirty",
    ("sync-stopped", "status"): ": stopped",
    ("sync-stopped", "gates-list"): "no gates: registry/UPSTREAM_SYNC.yaml records none",
}
BY_COMMAND = {  # an exit 0 of these commands, in any state, reads none of what is broken
    "vendor-status": "pristine digest", "vendor-fetch": "vendored tree already present",
    "backup-list": "before apply", "gates-list": "(needs cpu)", "recover": "no interrupted update",
    "sync-trial": "counts:",
}

CELLS = [pytest.param(s, c, id=f"{s}-{c}", marks=[pytest.mark.xfail(strict=True, reason="a known defect")]
                       if MATRIX[c].split()[i].startswith("x") else [])
         for c in COMMANDS for i, s in enumerate(STATES)]


def _make(base: Path) -> tuple[Path, Path, str, str]:
    """(applied project, stopped-sync project, a newer commit of the first one's upstream, the second one's target),
    both with a registry and build config, and a backup; FORKTOOL_CACHE must be set."""
    proj = make_project(base / "t", UPSTREAM)
    (proj.root / "registry" / "build.yaml").write_text(corpus.BUILD_YAML)
    three_patches(proj)
    proj.run("apply")
    (proj.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(corpus.registry_doc(), sort_keys=False))
    proj.run("registry", "render")
    proj.run("verify")
    proj.run("backup", "create", "matrix")
    (proj.upstream / "docs" / "skip.md").write_text("newer, and not vendored\n")
    git(proj.upstream, "commit", "-qam", "newer")
    newer = git(proj.upstream, "rev-parse", "HEAD")
    stopped = corpus.stopped_sync(base / "s")
    # a registry the stopped project can load, so that its commands reach the sync rather than a missing file
    (stopped / "registry" / "UPSTREAM_SYNC.yaml").write_text("schema: 1\npatches: []\nhooks: {}\n")
    target = json.loads((stopped / ".opencoti" / "sync" / "state.json").read_text())["to"]["commit"]
    return proj.root, stopped, newer, target


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str, str, Path]]:
    base = tmp_path_factory.mktemp("broken")
    cache = base / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORKTOOL_CACHE", str(cache))
        yield (*_make(base), cache)


def _digest(root: Path) -> dict[str, str]:
    """sha256 of every file of the tree, patches, vendor files, registry and .opencoti/state.json (links by target)."""
    out = {}
    for top in ("vendor", "patches", "registry"):
        p = root / top
        for f in sorted([p, *p.rglob("*")]) if p.is_dir() else [p]:
            if f.is_symlink():
                out[str(f.relative_to(root))] = "link:" + os.readlink(f)
            elif f.is_file():
                out[str(f.relative_to(root))] = hashlib.sha256(f.read_bytes()).hexdigest()
    st = root / ".opencoti" / "state.json"
    out["state"] = hashlib.sha256(st.read_bytes()).hexdigest() if st.exists() else "absent"
    return out


def _backups(root: Path) -> list[str]:
    return sorted(f"{d}/{p.name}" for d in ("vendor-backups", "sync-backups")
                  for p in (root / ".opencoti" / d).glob("*"))


@pytest.mark.parametrize(("state", "command"), CELLS)
def test_a_broken_state_is_refused_or_reported_truthfully(templates, tmp_path: Path, monkeypatch, state: str,
                                                          command: str) -> None:
    applied, stopped, newer, target, cache = templates
    monkeypatch.setenv("FORKTOOL_CACHE", str(cache))
    root = tmp_path / "proj"
    shutil.copytree(stopped if state == "sync-stopped" else applied, root, symlinks=True)
    STATES[state](root)
    sub = {"@TO@": target, "@ID@": "0002"} if state == "sync-stopped" else {"@TO@": newer, "@ID@": "0070"}
    argv = [sub.get(a, a).replace("@OUT@", str(tmp_path / "out")) for a in COMMANDS[command]]
    want = MATRIX[command].split()[list(STATES).index(state)].lstrip("x")
    before = _digest(root)
    backups = _backups(root)
    cache_before = sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))
    code, out, err = run_cli(root, argv, expect=None)
    text = out + err
    assert "Traceback" not in text and code != 3, text
    assert code == (0 if want == "R" else int(want)), f"exit {code}, expected {want}:\n{text}"
    # nothing is downloaded: the cache holds what it held (the git upstream is archived into it only by a trial)
    if command != "sync-trial":
        assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) == cache_before
    if want == "R":  # the tree made where there was none, and nothing else moved: the project is clean after it
        assert _digest(root) != before
        code, status, serr = run_cli(root, ["status"], expect=0)
        assert "tree: clean" in status + serr, status + serr
        return
    assert _digest(root) == before, "the project changed"
    if code:
        assert "where:" in err or (command.startswith("verify") and "✗ " in err), err
        assert "next:" in err, err
        assert NAMES[state] in err, err
        assert _backups(root) == backups, "a refusal left a backup behind"
        return
    said = REPORTS.get((state, command)) or BY_COMMAND.get(command)
    assert said is not None, f"exit 0 with no documented report for {state} × {command}:\n{text}"
    assert said in text, text


def test_unapply_that_only_made_the_tree_says_so(templates, tmp_path: Path, monkeypatch) -> None:
    """It said "nothing to do, the tree is already there" of the pristine tree it had just written."""
    applied, _stopped, _newer, _target, cache = templates
    monkeypatch.setenv("FORKTOOL_CACHE", str(cache))
    root = tmp_path / "proj"
    shutil.copytree(applied, root, symlinks=True)
    _absent(root)
    code, out, err = run_cli(root, ["unapply", "--json"])
    assert json.loads(out)["materialised"] is True
    _absent(root)
    code, out, err = run_cli(root, ["unapply"])
    assert "there was no vendored tree: wrote the pristine upstream there, no patch applied" in out + err
    assert "nothing to do" not in out + err


def test_the_sync_trial_during_a_stopped_sync_writes_no_report(templates, tmp_path: Path, monkeypatch) -> None:
    _applied, stopped, _newer, target, cache = templates
    monkeypatch.setenv("FORKTOOL_CACHE", str(cache))
    root = tmp_path / "proj"
    shutil.copytree(stopped, root, symlinks=True)
    code, out, err = run_cli(root, ["sync", "--to", target, "--out", str(tmp_path / "o"), "--json"], expect=1)
    data = json.loads(out)
    assert data["error"].startswith("sync trial refused: a sync to ") and "in progress (stopped)" in data["error"]
    assert data["where"].endswith(".opencoti/sync/state.json") and "--abort" in data["hint"]
    assert not (tmp_path / "o").exists()


def test_accept_during_a_sync_whose_verify_failed_is_refused_before_the_trial(templates, tmp_path: Path,
                                                                              monkeypatch) -> None:
    # stage finished is a sync still in progress (its verify failed; `--continue` checks again, `--abort` goes back):
    # the trial was let through, wrote its report, and only then was --accept refused under the lock
    _applied, stopped, _newer, target, cache = templates
    monkeypatch.setenv("FORKTOOL_CACHE", str(cache))
    root = tmp_path / "proj"
    shutil.copytree(stopped, root, symlinks=True)
    state = root / ".opencoti" / "sync" / "state.json"
    st = json.loads(state.read_text())
    st["stage"], st["stop"] = "finished", None
    state.write_text(json.dumps(st))
    before = _digest(root)
    code, out, err = run_cli(root, ["sync", "--to", target, "--accept", "--out", str(tmp_path / "o"), "--json"],
                             expect=1)
    data = json.loads(out)
    assert data["error"].startswith("--accept refused: a sync to ") and "in progress (finished)" in data["error"]
    assert not (tmp_path / "o").exists()
    assert _digest(root) == before
