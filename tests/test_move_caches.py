"""What makes `unapply && apply` fast is an optimisation only: every remembered value that is damaged, stale or
forged in shape is ignored, and the tree, the state and the report come out the same as without it."""

from __future__ import annotations

import hashlib
import json
import marshal
import os
from pathlib import Path

import pytest

from forktool import cache, index, series, workspace
from forktool.tree import make_temp, make_temp_dir, remove_tree, scan
from tests.helpers.patches import make_patch
from tests.helpers.project import Proj
from tests.helpers.series import A1, B1, B, drifting_patches


def _outcome(p: Proj) -> tuple[str, str, list]:
    """The tree, the recorded state and the drift apply reports: what must not depend on any cache."""
    res = p.json("apply")
    return p.digest(), (p.root / ".opencoti" / "state.json").read_text(), res["drift"]


def _entries(p: Proj, kind: str) -> list[Path]:
    return sorted(q for q in (p.root / ".opencoti" / "cache" / kind).rglob("*") if q.is_file())


def _reference(p: Proj) -> tuple[str, str, list]:
    first = _outcome(p)
    assert first[2] == [{"file": "up/src/a.c", "hunk": 1, "offset": -3, "patch": "0070"}]
    assert len(_entries(p, "series-result")) == 1
    return first


def _rewrite_entry(path: Path, edit) -> None:
    """Change the value of a JSON cache entry and give it the checksum of the new value (a forged shape)."""
    raw = json.loads(path.read_text())
    raw["value"] = edit(raw["value"])
    value_json = json.dumps(raw["value"], sort_keys=True, separators=(",", ":"))
    raw["sha256"] = hashlib.sha256(value_json.encode()).hexdigest()
    path.write_text(json.dumps(raw))


def _damage(kind: str, p: Proj) -> None:
    entry = _entries(p, "series-result")[0]
    objects = _entries(p, "objects")
    if kind == "truncated entry":
        entry.write_bytes(entry.read_bytes()[:40])
    elif kind == "edited entry":
        entry.write_text(entry.read_text().replace('"offset":-3', '"offset":-2'))
    elif kind == "object changed":
        for o in objects:
            o.write_bytes(o.read_bytes().replace(b"return 2", b"return 7"))
    elif kind == "object missing":
        for o in objects:
            o.unlink()
    elif kind == "extra path":
        _rewrite_entry(entry, lambda v: {**v, "files": {**v["files"], "up/src/other.c": None}})
    elif kind == "bad drift":
        _rewrite_entry(entry, lambda v: {**v, "drift": {**v["drift"], "0070": [{"patch": "0070", "hunk": "1"}]}})
    elif kind == "wrong object":
        def swap(v: dict) -> dict:
            files = dict(v["files"])
            files["up/src/a.c"] = "ab" * 32  # no such object
            return {**v, "files": files}
        _rewrite_entry(entry, swap)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["truncated entry", "edited entry", "object changed", "object missing",
                                  "extra path", "bad drift", "wrong object"])
def test_a_damaged_series_result_is_ignored(proj: Proj, kind: str, monkeypatch: pytest.MonkeyPatch):
    drifting_patches(proj)
    first = _reference(proj)
    calls = []
    real = workspace.apply_series
    monkeypatch.setattr(workspace, "apply_series", lambda *a: calls.append(1) or real(*a))
    proj.run("unapply")
    assert _outcome(proj) == first and calls == []  # remembered: read back, nothing applied, same outcome
    proj.run("unapply")
    _damage(kind, proj)
    assert _outcome(proj) == first and calls == [1]  # applied again from the patches
    assert (proj.tree / "up/src/a.c").read_text() == A1


def test_a_series_result_is_remembered_per_pristine_and_patch_bytes(proj: Proj):
    drifting_patches(proj)
    _reference(proj)
    proj.run("unapply")
    p = proj.root / "patches" / "0071-two.patch"
    p.write_text(make_patch("0071-two.patch", {"up/src/b.c": (B, B1.replace("two", "2"))}, "two", "two"))
    proj.run("apply")
    assert len(_entries(proj, "series-result")) == 2  # new patch bytes: a new result, the old one not reused
    assert "opencoti-hook: 2" in (proj.tree / "up/src/b.c").read_text()
    assert not (proj.tree / "up/src/new.c").exists()


def test_unapply_links_the_objects_an_earlier_backup_holds(proj: Proj):
    drifting_patches(proj)
    proj.run("apply")
    first = proj.json("unapply")["backup"]
    proj.run("apply")
    second = proj.json("unapply")["backup"]
    bdir = proj.root / ".opencoti" / "vendor-backups"
    objs = sorted(q.relative_to(bdir / second) for q in (bdir / second / "objects").rglob("*") if q.is_file())
    assert len(objs) == 3  # a.c, b.c and new.c as the series left them
    for rel in objs:
        assert os.path.samefile(bdir / first / rel, bdir / second / rel)
    proj.run("backup", "restore", second)
    assert (proj.tree / "up/src/a.c").read_text() == A1 and (proj.tree / "up/src/new.c").read_text() == "int n;\n"


def test_a_damaged_earlier_object_is_not_linked(proj: Proj):
    drifting_patches(proj)
    proj.run("apply")
    first = proj.json("unapply")["backup"]
    bdir = proj.root / ".opencoti" / "vendor-backups"
    for q in (bdir / first / "objects").rglob("*"):
        if q.is_file():
            q.write_bytes(q.read_bytes() + b"damage")
    proj.run("apply")
    second = proj.json("unapply")["backup"]
    for q in (bdir / second / "objects").rglob("*"):
        if q.is_file():
            assert q.stat().st_nlink == 1 and hashlib.sha256(q.read_bytes()).hexdigest() == q.parent.name + q.name
    proj.run("backup", "restore", second)
    assert (proj.tree / "up/src/b.c").read_text() == B1


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "t"
    for i in range(12):
        (root / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 3}" / f"f{i}.c").write_text(f"int f{i};\n")
    (root / "link").symlink_to("d0/f0.c")
    past = 1_000_000_000
    for q in root.rglob("*"):
        os.utime(q, (past, past), follow_symlinks=False)
    return root


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "json of the version before", "forged rows",
                                    "another root"])
def test_a_damaged_stat_index_is_ignored(tmp_path: Path, damage: str):
    root = _tree(tmp_path)
    ix = tmp_path / "index"
    assert index.scan_indexed(root, ix)[1] == 13
    assert index.scan_indexed(root, ix) == (scan(root), 0)  # trusted: nothing hashed
    data = ix.read_bytes()
    if damage == "truncated":
        ix.write_bytes(data[:len(data) // 2])
    elif damage == "flipped byte":
        ix.write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
    elif damage == "json of the version before":
        ix.write_text(json.dumps({"version": 1, "root": str(root), "taken_ns": 0, "entries": {}}))
    elif damage == "forged rows":  # a valid checksum over rows of the wrong shape
        body = marshal.dumps((index.INDEX_VERSION, str(root), 2 ** 62, {"d0/f0.c": ("x",), "link": 5}))
        ix.write_bytes(index.MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    else:
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "f0.c").write_text("int f0;\n")
        assert index.scan_indexed(tmp_path / "other", ix)[1] == 1  # the index now describes another root
    manifest, hashed = index.scan_indexed(root, ix)
    assert manifest == scan(root) and hashed == 13


def test_memo_ignores_damaged_and_foreign_entries(tmp_path: Path):
    m = cache.Memo(tmp_path, "kind")
    key, other = cache.key_of("a", 1), cache.key_of("a", 2)
    m.put(key, {"v": (1, b"x")})
    assert m.get(key) == {"v": (1, b"x")} and m.get(other) is None
    entry = next(q for q in tmp_path.rglob("*") if q.is_file())
    good = entry.read_bytes()
    entry.write_bytes(good[:-3])
    assert m.get(key) is None  # torn
    entry.write_bytes(good[:70] + bytes([good[70] ^ 1]) + good[71:])
    assert m.get(key) is None  # checksum mismatch
    body = marshal.dumps(("kind", other, "forged"))  # a valid checksum, filed under the wrong key
    entry.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    assert m.get(key) is None
    assert cache.Memo(tmp_path, "other-kind").get(key) is None
    assert cache.Memo(None, "kind").get(key) is None  # disabled


def test_a_damaged_patch_memo_parses_again(proj: Proj, monkeypatch: pytest.MonkeyPatch):
    drifting_patches(proj)
    first = _reference(proj)
    memos = _entries(proj, "patch")
    assert len(memos) == 2
    parsed = []
    real = workspace.parse_patch
    monkeypatch.setattr(workspace, "parse_patch", lambda *a: parsed.append(a[1]) or real(*a))
    proj.run("status")
    assert parsed == []  # both from their memo
    for q in memos:  # a valid checksum over a value of the wrong shape
        body = marshal.dumps(("patch", q.parent.name + q.name, ("0070", "x", b"", [1])))
        q.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    proj.run("unapply")
    for q in _entries(proj, "series-result"):
        q.unlink()
    assert _outcome(proj) == first
    assert parsed == ["0070-one.patch", "0071-two.patch"]  # parsed again (once: then remembered anew)
    st = proj.json("status")
    assert [r["title"] for r in st["patches"]] == ["one", "two"]


def test_a_patch_from_its_memo_is_the_parsed_patch(proj: Proj):
    drifting_patches(proj)
    data = (proj.root / "patches" / "0071-two.patch").read_bytes()
    parsed = series.parse_patch(data, "0071-two.patch")
    again = series.from_plain(marshal.loads(marshal.dumps(series.to_plain(parsed))), data)
    assert again == parsed and again.sha256 == parsed.sha256 and again.diff_sha256 == parsed.diff_sha256
    with pytest.raises((TypeError, ValueError)):
        series.from_plain(("0071", "n", b"", [1]), data)


def test_a_damaged_pristine_manifest_memo_is_ignored_and_a_bad_manifest_still_refused(proj: Proj, cache: Path):
    drifting_patches(proj)
    first = _reference(proj)
    memos = [q for q in (cache / "pristine-manifest").rglob("*") if q.is_file()]
    assert len(memos) == 1
    memos[0].write_bytes(memos[0].read_bytes()[:-10])
    proj.run("unapply")
    assert _outcome(proj) == first
    manifest = next((cache / "pristine").glob("*.json"))
    before = proj.state_digest()
    manifest.write_text(manifest.read_text().replace('"100644"', '"100600"', 1))  # new bytes: checked again
    code, out, err = proj.run("unapply", expect=1)
    assert "pristine" in err and proj.state_digest() == before


def test_remove_tree_never_follows_a_link(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.c").write_text("keep\n")
    d = make_temp_dir(tmp_path, ".tmp-")
    assert d.stat().st_mode & 0o777 == 0o700
    (d / "a" / "b").mkdir(parents=True)
    (d / "a" / "b" / "f").write_text("x")
    (d / "dirlink").symlink_to(outside)
    (d / "a" / "filelink").symlink_to(outside / "keep.c")
    (d / "dangling").symlink_to(tmp_path / "nowhere")
    fd, name = make_temp(d)
    os.close(fd)
    assert Path(name).parent == d and os.stat(name).st_mode & 0o777 == 0o600
    remove_tree(d)
    assert not d.exists() and (outside / "keep.c").read_text() == "keep\n"
    with pytest.raises(OSError):
        remove_tree(d)


def test_the_patch_model_compares_by_value_and_refuses_unknown_attributes():
    h = series.Hunk(1, 1, 1, 2, [(b" ", b"a\n"), (b"+", b"b\n")])
    fd = series.FileDiff("src/a.c", "100644", "100644", hunks=[h])
    p = series.Patch("0070", "0070-one.patch", b"Subject: one\n", [fd])
    copy = series.Patch("0070", "0070-one.patch", b"Subject: one\n",
                        [series.FileDiff("src/a.c", "100644", "100644", hunks=[series.Hunk(1, 1, 1, 2, list(h.lines))])])
    assert p == copy and p is not copy
    assert p != series.Patch("0070", "0070-one.patch", b"Subject: two\n", [fd])
    assert fd != series.FileDiff("src/a.c", "100644", "100755", hunks=[h])
    assert h != series.Hunk(1, 1, 1, 2, [(b" ", b"a\n"), (b"+", b"c\n")]) and h != (1, 1, 1, 2, h.lines)
    with pytest.raises(TypeError):
        hash(p)  # mutable: unhashable
    with pytest.raises(AttributeError):
        p.headr = b""  # type: ignore[attr-defined]  # a misspelt field is an error, not a new attribute
    q = series.with_files(p, [])
    assert (q.id, q.name, q.header, q.files, p.files) == (p.id, p.name, p.header, [], [fd]) and q.raw


def test_run_all_runs_every_item_on_several_threads_and_leaves_none_behind():
    import threading

    from forktool.tree import run_all

    def lanes() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "forktool-lane"}

    before = lanes()
    for n in (0, 1, 5, 30):
        seen: list[int] = []
        run_all(seen.append, list(range(n)))
        assert sorted(seen) == list(range(n))
    workers: set[str] = set()
    barrier = threading.Barrier(4, timeout=10)

    def meet(i: int) -> None:  # four lanes must run at once, or the barrier times out
        workers.add(threading.current_thread().name)
        barrier.wait()

    run_all(meet, list(range(4)))
    assert workers == {threading.current_thread().name, "forktool-lane"}
    ran: list[int] = []

    def fail_on_odd(i: int) -> None:
        ran.append(i)
        if i % 2:
            raise ValueError(i)

    with pytest.raises(ValueError):
        run_all(fail_on_odd, list(range(20)))
    assert sorted(ran) == list(range(20))  # every item ran before the error was raised
    assert lanes() == before  # every thread it started was joined before it returned


def test_run_all_in_a_forked_child():
    from forktool.tree import run_all

    run_all(lambda i: None, list(range(8)))  # the parent ran lanes before it forked
    pid = os.fork()
    if pid == 0:  # the child starts its own
        seen: list[int] = []
        try:
            run_all(seen.append, list(range(16)))
            os._exit(0 if sorted(seen) == list(range(16)) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
