"""state.json's sha256 values change with every apply and refresh: a check remembered for the document with them
blanked stands for any sha256 values there, and the shortcut agrees with jsonschema on generated documents."""

from __future__ import annotations

import copy
import random

import pytest

from forktool import cache, schema
from forktool.errors import ConfigError
from tests.helpers.schema import shortcut_agrees

HEX = ["0" * 64, "a" * 64, "f0" * 32, "0123456789abcdef" * 4]
ODD = ["A" * 64, "0" * 63, "0" * 65, "g" * 64, "0" * 64 + "\n", "", "0070", 70, None, "x" * 64, "100644"]


def _base(rnd: random.Random) -> dict:
    applied = [{"id": f"{n:04d}", "name": f"{n:04d}-p{n}.patch", "sha256": rnd.choice(HEX),
                "diff_sha256": rnd.choice(HEX),
                "drift": [{"patch": f"{n:04d}", "file": "src/a.c", "hunk": 1, "offset": 2}]} for n in (10, 20)]
    files = {f"src/{k}.c": [rnd.choice(HEX), "100644"] for k in range(4)}
    files["gone.c"] = None
    return {"version": 1, "pristine_digest": rnd.choice(HEX), "applied": applied, "files": files}


def _docs(n: int) -> list[dict]:
    rnd = random.Random(9)
    out = []
    for _ in range(n):
        doc = _base(rnd)
        for _ in range(rnd.randint(0, 3)):  # put a value where a digest, an id, a name, a mode or a path goes
            value = rnd.choice(HEX + ODD)
            spot = rnd.randrange(7)
            a = doc["applied"][rnd.randrange(2)]
            f = doc["files"][f"src/{rnd.randrange(4)}.c"]
            if spot == 0:
                a["sha256"] = value
            elif spot == 1:
                a["diff_sha256"] = value
            elif spot == 2:
                f[0] = value
            elif spot == 3:
                f[1] = value
            elif spot == 4:
                a["id"] = value
            elif spot == 5:
                a["drift"][0]["file"] = value
            else:
                doc["pristine_digest"] = value
        if rnd.random() < 0.1:
            doc["files"]["0" * 64] = [rnd.choice(HEX), "100644"]  # a digest-like name stays as it is
        if rnd.random() < 0.1:
            doc["version"] = 2
        out.append(copy.deepcopy(doc))
    return out


def test_the_digest_shortcut_agrees_with_jsonschema(memo: cache.Checks, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = shortcut_agrees(memo, _docs(400), "state", "state.json", "state#digests",
                           lambda doc: schema.digest_shape(doc, "state"))
    assert fast > 50  # the shortcut was taken, for documents jsonschema also accepts


def test_the_shape_blanks_values_only_and_refuses_when_the_schema_could_tell_digests_apart() -> None:
    doc = {"version": 1, "pristine_digest": "a" * 64, "applied": [], "files": {"b" * 64: ["c" * 64, "100644"]}}
    shape = schema.digest_shape(doc, "state")
    assert shape == {"version": 1, "pristine_digest": "0" * 64, "applied": [],
                     "files": {"b" * 64: ["0" * 64, "100644"]}}
    assert schema.digest_shape({"version": 1, "applied": [], "files": {}}, "state") is None  # nothing to blank
    assert schema.digest_shape(doc, "vendor-lock") is None  # only the documents named for it


def test_a_bad_digest_still_gets_jsonschemas_error(memo: cache.Checks, monkeypatch: pytest.MonkeyPatch) -> None:
    good = {"version": 1, "pristine_digest": "a" * 64, "applied": [], "files": {"x.c": ["b" * 64, "100644"]}}
    schema.check(good, "state", "state.json")
    bad = copy.deepcopy(good)
    bad["files"]["x.c"][0] = "B" * 64
    with pytest.raises(ConfigError) as e:
        schema.check(bad, "state", "state.json")
    assert "files" in (e.value.where or "")
    other = copy.deepcopy(good)
    other["files"]["x.c"][0] = "d" * 64
    assert schema.check(other, "state", "state.json") == other  # passes through the remembered shape
