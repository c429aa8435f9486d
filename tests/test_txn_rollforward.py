"""The roll-forward renames independent files concurrently: any subset of entries carried out before a crash rolls
forward to the same tree, and a failure in one lane is raised after every lane has run."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from forktool import tree as ftree
from forktool import txn
from forktool.tree import EXECUTABLE, REGULAR, SYMLINK, scan, sha256_bytes


class Crash(Exception):
    pass


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    tree, state = tmp_path / "tree", tmp_path / "state"
    for i in range(30):
        (tree / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 4}" / f"f{i}.c").write_bytes(b"old %d\n" % i)
    (tree / "gone").write_bytes(b"a file a later write needs as a directory\n")
    return tree, state


def _writes() -> list[txn.Write]:
    out = [txn.Write(f"d{i % 4}/f{i}.c", b"new %d\n" % i, EXECUTABLE if i == 7 else REGULAR) for i in range(30)]
    out += [txn.Write("gone", None, REGULAR), txn.Write("gone/now-a-dir.c", b"x\n", REGULAR),
            txn.Write("d0/link", b"f0.c", SYMLINK), txn.Write("fresh/deep/new.c", b"n\n", REGULAR)]
    return sorted(out, key=lambda w: w.path)


def _want(writes: list[txn.Write]) -> dict[str, tuple[str, str]]:
    return {w.path: (sha256_bytes(w.data), w.mode) for w in writes if w.data is not None}


@pytest.mark.parametrize("seed", range(6))
def test_any_subset_moved_before_a_crash_rolls_forward_to_the_same_tree(tmp_path: Path, seed: int,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tree, state = _tree(tmp_path)
    writes = _writes()

    def crash(point: str) -> None:
        if point == "committed":
            raise Crash

    monkeypatch.setattr(txn, "_fault", crash)
    with pytest.raises(Crash):
        txn.commit(tree, state, writes, {"k": seed})
    monkeypatch.undo()
    plan = json.loads((state / "txn" / "plan.json").read_text())
    rnd = random.Random(seed)
    entries = plan["entries"]
    ordered = [e for n, e in enumerate(entries) if n == 0 or e["staged"] is None or e["mode"] == SYMLINK]
    rest = [e for e in entries if not any(e is o for o in ordered)]
    if seed % 2:  # a crash among the entries carried out in the plan's order: a prefix of them done
        done = ordered[:rnd.randrange(len(ordered))]
    else:  # a crash among the concurrent renames: all ordered entries done, then any subset in any order
        done = ordered + rnd.sample(rest, rnd.randrange(len(rest)))
    for e in done:
        txn._move(tree, state / "txn", e)  # as the roll-forward carries each one out
    assert "rolled forward" in (txn.recover(tree, state) or "")
    got = {p: (e.sha256, e.mode) for p, e in scan(tree).items()}
    want = _want(writes)
    assert {p: v for p, v in got.items() if p in want} == want
    assert set(got) == set(want) and not (state / "txn").exists()
    assert json.loads((state / "state.json").read_text()) == {"k": seed}


def test_a_failing_lane_is_raised_after_all_have_run() -> None:
    done: list[int] = []

    def work(i: int) -> None:
        if i in (3, 11):
            raise OSError(f"item {i}")
        done.append(i)

    with pytest.raises(OSError):
        ftree.run_all(work, list(range(20)))
    assert sorted(done) == [i for i in range(20) if i not in (3, 11)]
    ftree.run_all(work, [])  # nothing to do
