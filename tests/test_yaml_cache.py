"""Parsed YAML remembered by the text's digest: the same value as parsing, only after success, never trusted blindly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forktool import cache, schema
from forktool.errors import ConfigError
from tests import corpus

TEXT = "a: 1\nb: [x, 2.5, true, null]\nc: {d: e}\n"


def _entries(root: Path) -> list[Path]:
    return sorted((root / "yaml").rglob("*.json"))


def test_a_parse_is_remembered_after_success_and_gives_the_same_value(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_CACHE", str(tmp_path))
    first = schema.parse_yaml(TEXT, "f.yaml")
    assert _entries(tmp_path) == []  # pending until the command succeeds
    cache.flush_valid()
    [entry] = _entries(tmp_path)
    calls: list[str] = []
    monkeypatch.setattr(schema, "_parse_yaml", lambda t, w: calls.append(t) or {"wrong": 1})
    assert schema.parse_yaml(TEXT, "f.yaml") == first == {"a": 1, "b": ["x", 2.5, True, None], "c": {"d": "e"}}
    assert calls == []  # served from the cache
    raw = json.loads(entry.read_bytes())
    entry.write_text(json.dumps(dict(raw, value={"value": {"a": 2}})))  # value edited, checksum kept
    assert schema.parse_yaml(TEXT, "f.yaml") == {"wrong": 1} and calls == [TEXT]  # ignored: parsed again


def test_a_refused_command_remembers_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_CACHE", str(tmp_path))
    schema.parse_yaml(TEXT, "f.yaml")
    cache.forget_valid()
    cache.flush_valid()
    assert _entries(tmp_path) == []


def test_values_json_cannot_carry_and_bad_documents_are_not_remembered(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKTOOL_CACHE", str(tmp_path))
    assert schema.parse_yaml("when: 2026-01-01\n1: one\n", "f.yaml")["when"].year == 2026  # a date, an int key
    with pytest.raises(ConfigError):
        schema.parse_yaml("a: [1\n", "bad.yaml")
    with pytest.raises(ConfigError):
        schema.parse_yaml(corpus._billion_laughs().decode(), "bomb.yaml")  # measured before it is remembered
    cache.flush_valid()
    assert _entries(tmp_path) == []


def test_a_remembered_parse_keeps_the_order_of_every_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers that write a file back in its own order (the registry's hooks) get the document's order from a hit."""
    monkeypatch.setenv("FORKTOOL_CACHE", str(tmp_path))
    text = "z: 1\na: {y: 1, b: [{q: 1, c: 2}]}\nm: 3\n"
    first = schema.parse_yaml(text, "f.yaml")
    cache.flush_valid()
    monkeypatch.setattr(schema, "_parse_yaml", lambda t, w: pytest.fail("parsed again"))
    again = schema.parse_yaml(text, "f.yaml")
    assert json.dumps(again) == json.dumps(first) == '{"z": 1, "a": {"y": 1, "b": [{"q": 1, "c": 2}]}, "m": 3}'
