"""Content-addressed caches: an entry counts only under its exact key; failed commands leave no memo."""

from __future__ import annotations

from pathlib import Path

from forktool import cache as fcache
from forktool.cache import Cache, key_of
from tests.helpers.project import Proj


def test_cache_entry_is_used_only_under_its_key(tmp_path: Path):
    c = Cache(tmp_path, "kind")
    k1, k2 = key_of("a", 1), key_of("a", 2)
    c.put(k1, {"v": 1})
    assert c.get(k1) == {"v": 1} and c.get(k2) is None
    path = next(tmp_path.rglob("*.json"))
    path.write_text(path.read_text().replace('"v":1', '"v":2'))  # value edited: checksum no longer matches
    assert c.get(k1) is None
    assert Cache(None, "kind").get(k1) is None  # disabled (--no-cache)


def test_schema_memo_only_for_the_same_document_and_schema(cache: Path):
    schema = {"type": "object"}
    cache_mod = fcache
    cache_mod.forget_valid()
    cache_mod.remember_valid("x", schema, {"a": 1})
    assert not cache_mod.known_valid("x", schema, {"a": 1})  # not written until the command succeeds
    cache_mod.flush_valid()
    assert cache_mod.known_valid("x", schema, {"a": 1})
    assert not cache_mod.known_valid("x", schema, {"a": 2})
    assert not cache_mod.known_valid("x", {"type": "array"}, {"a": 1})
    entry = next((cache / "validated").rglob("*"))
    while entry.is_dir():
        entry = next(entry.iterdir())
    entry.write_text("forged")
    assert not cache_mod.known_valid("x", schema, {"a": 1})


def test_a_bad_config_is_refused_every_time(proj: Proj):
    y = proj.root / "vendor" / "vendor.yaml"
    proj.run("vendor", "status")  # the good file passes and is remembered
    good = y.read_text()
    y.write_text(good + "bogus_key: 1\n")
    for _ in range(2):
        code, out, err = proj.run("vendor", "status", expect=None)
        assert code == 1 and "bogus_key" in err
    y.write_text(good)
    proj.run("vendor", "status")
