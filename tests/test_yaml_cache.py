"""Parsed YAML remembered by the text's digest in the project's own cache: the same value as parsing, never trusted
blindly, never read from the shared user cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forktool import cache, schema
from forktool.errors import ConfigError
from tests import corpus

TEXT = "a: 1\nb: [x, 2.5, true, null]\nc: {d: e}\n"


def _entries(root: Path) -> list[Path]:
    return sorted((root / "cache" / "yaml").rglob("*.json"))


def test_a_parse_is_remembered_and_gives_the_same_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with cache.remembering(tmp_path):
        first = schema.parse_yaml(TEXT, "f.yaml")
        assert _entries(tmp_path) == []  # written when the command ends without an error
    with cache.remembering(tmp_path):
        [entry] = _entries(tmp_path)
        calls: list[str] = []
        monkeypatch.setattr(schema, "_parse_yaml", lambda t, w: calls.append(t) or {"wrong": 1})
        assert schema.parse_yaml(TEXT, "f.yaml") == first == {"a": 1, "b": ["x", 2.5, True, None], "c": {"d": "e"}}
        assert calls == []  # served from the cache
        raw = json.loads(entry.read_bytes())
        entry.write_text(json.dumps(dict(raw, value={"value": {"a": 2}})))  # value edited, checksum kept
        assert schema.parse_yaml(TEXT, "f.yaml") == {"wrong": 1} and calls == [TEXT]  # ignored: parsed again


def test_outside_a_command_or_without_cache_nothing_is_read_or_written(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_CACHE", str(tmp_path / "user"))
    with cache.remembering(tmp_path):
        schema.parse_yaml(TEXT, "f.yaml")
    assert len(_entries(tmp_path)) == 1
    calls: list[str] = []
    real = schema._parse_yaml
    monkeypatch.setattr(schema, "_parse_yaml", lambda t, w: calls.append(t) or real(t, w))
    schema.parse_yaml(TEXT, "f.yaml")  # no command: no project cache
    with cache.remembering(tmp_path), cache.remembering(None):  # --no-cache inside a command
        schema.parse_yaml(TEXT, "f.yaml")
    assert calls == [TEXT, TEXT]
    assert not (tmp_path / "user").exists()  # the shared cache holds no parse


def test_a_refused_command_remembers_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError), cache.remembering(tmp_path):
        schema.parse_yaml(TEXT, "f.yaml")
        schema.parse_yaml("a: [1\n", "bad.yaml")
    assert _entries(tmp_path) == []


def test_values_json_cannot_carry_and_bad_documents_are_not_remembered(tmp_path: Path) -> None:
    with cache.remembering(tmp_path):
        assert schema.parse_yaml("when: 2026-01-01\n1: one\n", "f.yaml")["when"].year == 2026  # a date, an int key
        with pytest.raises(ConfigError):
            schema.parse_yaml("a: [1\n", "bad.yaml")
        with pytest.raises(ConfigError):
            schema.parse_yaml(corpus._billion_laughs().decode(), "bomb.yaml")  # measured before it is remembered
    assert _entries(tmp_path) == []


def test_a_remembered_parse_keeps_the_order_of_every_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers that write a file back in its own order (the registry's hooks) get the document's order from a hit."""
    text = "z: 1\na: {y: 1, b: [{q: 1, c: 2}]}\nm: 3\n"
    with cache.remembering(tmp_path):
        first = schema.parse_yaml(text, "f.yaml")
    with cache.remembering(tmp_path):
        monkeypatch.setattr(schema, "_parse_yaml", lambda t, w: pytest.fail("parsed again"))
        again = schema.parse_yaml(text, "f.yaml")
    assert json.dumps(again) == json.dumps(first) == '{"z": 1, "a": {"y": 1, "b": [{"q": 1, "c": 2}]}, "m": 3}'
