"""vendor.lock's recorded digests change on every run: a check remembered for the rest of the document stands
for any valid values there, and the shortcut agrees with jsonschema on generated documents."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from forktool import cache, schema
from forktool.errors import ConfigError
from tests.helpers.schema import shortcut_agrees

REPO = Path(__file__).resolve().parent.parent
VALUES = ["0" * 64, "a" * 64, "f0" * 32, "A" * 64, "0" * 63, "0" * 65, "g" * 64, "0" * 64 + "\n", "", "0070", "070",
          "00700", "٠٠٧٠", "0070\n", " 0070", 70, None, ["0" * 64], "x"]
KEYS = ["series_digest", "tree_digest", "top", "other"]


def _docs(n: int) -> list[dict]:
    base = json.loads((REPO / "vendor" / "vendor.lock").read_text())
    rnd = random.Random(12)
    out = []
    for _ in range(n):
        doc = copy.deepcopy(base)
        doc["patched"] = {k: rnd.choice(VALUES) for k in rnd.sample(KEYS, rnd.randint(0, 4))}
        if rnd.random() < 0.15:
            doc["pristine_files"] = rnd.choice([-1, 5, "5"])
        out.append(doc)
    return out


def test_the_shape_shortcut_agrees_with_jsonschema(memo: cache.Checks, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs(400)
    for doc in docs:
        shape = schema.volatile_shape(doc, "vendor-lock")
        if shape is not None:
            assert all(v is None for v in shape["patched"].values())
    fast = shortcut_agrees(memo, docs, "vendor-lock", "vendor.lock", "vendor-lock#shape",
                           lambda doc: schema.volatile_shape(doc, "vendor-lock"), shown=lambda doc: doc["patched"])
    assert fast > 20  # the shortcut was taken, for documents jsonschema also accepts


def test_a_changed_digest_is_checked_without_jsonschema(memo: cache.Checks, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = json.loads((REPO / "vendor" / "vendor.lock").read_text())
    doc["patched"] = {"series_digest": "1" * 64, "tree_digest": "2" * 64, "top": "0089"}
    schema.check(doc, "vendor-lock", "vendor.lock")
    calls = []
    monkeypatch.setattr(schema, "_validator", lambda name: calls.append(name))
    doc["patched"]["tree_digest"] = "3" * 64
    assert schema.check(doc, "vendor-lock", "vendor.lock") is doc
    assert calls == []
    doc["patched"]["tree_digest"] = "3" * 63  # a bad value still gets jsonschema's error
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="tree_digest"):
        schema.check(doc, "vendor-lock", "vendor.lock")
