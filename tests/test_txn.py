"""The journal's commit: staged files made durable together, the plan checked before anything is staged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from forktool import txn
from forktool.errors import ForktoolError
from forktool.tree import REGULAR, SYMLINK, digest, scan


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    tree, state = tmp_path / "tree", tmp_path / "state"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "a.c").write_bytes(b"a\n")
    (tree / "b.c").write_bytes(b"b\n")
    return tree, state


def test_fsync_all_syncs_every_descriptor_and_raises_a_failure(tmp_path: Path) -> None:
    fds = [os.open(tmp_path / str(i), os.O_WRONLY | os.O_CREAT, 0o644) for i in range(11)]
    try:
        txn.fsync_all(fds)
        txn.fsync_all([])
        closed = os.open(tmp_path / "x", os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(closed)
        with pytest.raises(OSError):
            txn.fsync_all([*fds[:5], closed, *fds[5:]])
    finally:
        for fd in fds:
            os.close(fd)


def test_commit_writes_deletes_and_records_state(tmp_path: Path) -> None:
    tree, state = _tree(tmp_path)
    writes = [txn.Write(f"n/{i}.c", b"%d\n" % i, REGULAR) for i in range(20)] + [txn.Write("b.c", None, REGULAR)]
    txn.commit(tree, state, writes, {"k": 1})
    assert (tree / "n" / "19.c").read_bytes() == b"19\n" and not (tree / "b.c").exists()
    assert (state / "state.json").read_text().replace(" ", "").replace("\n", "") == '{"k":1}'
    assert not (state / "txn").exists()


@pytest.mark.parametrize("writes", [
    [txn.Write("d/a.c", b"x", REGULAR), txn.Write("d/a.c", b"y", REGULAR)],
    [txn.Write("b.c", b"x", REGULAR), txn.Write("d/l", b"../../outside", SYMLINK)],
])
def test_a_bad_plan_is_refused_before_anything_is_staged(tmp_path: Path, writes: list[txn.Write]) -> None:
    tree, state = _tree(tmp_path)
    before = digest(scan(tree))
    with pytest.raises(ForktoolError):
        txn.commit(tree, state, writes, {})
    assert digest(scan(tree)) == before
    assert not (state / "txn").exists() and not (state / "state.json").exists()


def test_commit_in_batches_of_descriptors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree, state = _tree(tmp_path)
    monkeypatch.setattr(txn, "FSYNC_BATCH", 3)
    txn.commit(tree, state, [txn.Write(f"m/{i}.c", b"%d" % i, REGULAR) for i in range(10)], {})
    assert sorted(p.name for p in (tree / "m").iterdir()) == sorted(f"{i}.c" for i in range(10))
    assert (tree / "m" / "7.c").read_bytes() == b"7"


def test_write_many_writes_every_file_or_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from forktool import tree as ftree
    monkeypatch.setattr(ftree, "FSYNC_BATCH", 3)
    items = [(tmp_path / "o" / f"{i % 4}" / str(i), b"x%d" % i) for i in range(10)]
    ftree.write_many(items)
    assert all(p.read_bytes() == d for p, d in items)
    (tmp_path / "f").write_bytes(b"a file")
    with pytest.raises(OSError):
        ftree.write_many([(tmp_path / "p" / "ok", b"1"), (tmp_path / "f" / "under-a-file", b"2")])
    assert not (tmp_path / "p" / "ok").exists()
    assert not [p for p in tmp_path.rglob("*.tmp")]
