"""Content-addressed caches under .opencoti/cache/: values keyed by the digests they were derived from.

A cache is only an optimisation. An entry records its full key and a checksum of its value; an entry whose
key or checksum does not match (stale, corrupt, truncated, from another version) is ignored, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from forktool.tree import atomic_write

if TYPE_CHECKING:
    from typing import Any

CACHE_VERSION = 1


def key_of(*parts: object) -> str:
    """One digest for an ordered list of JSON-able key parts."""
    return hashlib.sha256(json.dumps([CACHE_VERSION, *parts], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _checksum(value_json: str) -> str:
    return hashlib.sha256(value_json.encode()).hexdigest()


class Cache:
    """One kind of derived value (e.g. "reexport", "scopes", "verdict") stored by key digest."""

    def __init__(self, root: Path | None, kind: str):
        self.root = root / kind if root is not None else None
        self.kind = kind
        self.hits = 0
        self.misses = 0

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key[2:]}.json"

    def get(self, key: str) -> Any | None:
        """The stored value for key, or None when absent or not provably the value stored for this key."""
        if self.root is None:
            return None
        try:
            raw = json.loads(self._path(key).read_bytes())
            value_json = json.dumps(raw["value"], sort_keys=True, separators=(",", ":"))
            if raw.get("kind") != self.kind or raw.get("key") != key or raw.get("sha256") != _checksum(value_json):
                self.misses += 1
                return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.misses += 1
            return None
        self.hits += 1
        return raw["value"]

    def put(self, key: str, value: Any) -> None:
        if self.root is None:
            return
        value_json = json.dumps(value, sort_keys=True, separators=(",", ":"))
        entry = {"kind": self.kind, "key": key, "sha256": _checksum(value_json), "value": value}
        try:
            # unsorted: a hit gives back every mapping in the order it was stored (the checksum ignores order)
            atomic_write(self._path(key), json.dumps(entry, separators=(",", ":")).encode(), durable=False)
        except OSError:
            pass  # a cache that cannot be written only costs speed


_tool_fp: list[str] = []


def tool_fingerprint() -> str:
    """The tool version plus the stat fields of its own files, so a changed forktool never reuses a verdict."""
    if not _tool_fp:
        _tool_fp.append(_tool_fingerprint())
    return _tool_fp[0]


def _tool_fingerprint() -> str:
    import forktool

    pkg = Path(forktool.__file__).parent
    parts: list[object] = [forktool.__version__]
    for d in (pkg, pkg / "commands", pkg / "templates"):
        try:
            with os.scandir(d) as it:
                for e in sorted(it, key=lambda x: x.name):
                    if e.is_file():
                        st = e.stat()
                        parts.append([d.name, e.name, st.st_size, st.st_mtime_ns])
        except OSError:
            parts.append([d.name, None])
    parts.append(parser_fingerprint())
    return key_of("tool", parts)


_parser_fp: list[str] = []


def parser_fingerprint() -> str:
    """The installed C++ parser (tree-sitter and its grammar) by the stat fields of their files, not imported."""
    if not _parser_fp:
        import importlib.util

        parts: list[object] = []
        for mod in ("tree_sitter", "tree_sitter_cpp"):
            spec = importlib.util.find_spec(mod)
            locs = list(spec.submodule_search_locations or []) if spec else []
            for d in locs:
                try:
                    with os.scandir(d) as it:
                        parts += sorted([mod, e.name, e.stat().st_size, e.stat().st_mtime_ns] for e in it if e.is_file())
                except OSError:
                    parts.append([mod, d, None])
            if not locs:
                parts.append([mod, None])
        _parser_fp.append(key_of("parser", parts))
    return _parser_fp[0]


def caches_root(state_dir: Path, enabled: bool = True) -> Path | None:
    return state_dir / "cache" if enabled else None


def user_cache_dir() -> Path:
    """The per-user cache (FORKTOOL_CACHE, else $XDG_CACHE_HOME/forktool, else ~/.cache/forktool)."""
    env = os.environ.get("FORKTOOL_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "forktool"


def _yaml_fingerprint() -> str:
    """forktool's own files (the loader's rules live in schema.py) and the YAML parser's, by their stat fields."""
    import importlib.util

    spec = importlib.util.find_spec("yaml")
    parts: list[object] = [tool_fingerprint()]
    for loc in ([spec.origin] if spec and spec.origin else []) + list(spec.submodule_search_locations or [] if spec
                                                                         else []):
        try:
            st = os.stat(loc)
            parts.append([loc, st.st_size, st.st_mtime_ns])
        except OSError:
            parts.append([loc, None])
    return key_of("yaml-parser", parts)


def parsed_yaml(text: str, parse: Callable[[str], Any]) -> Any:
    """parse(text), remembered in the user cache under the text's digest and the parser's fingerprint.

    Only a document that parsed without error and comes back from JSON as the very same value is remembered (a
    date, a set or a non-string key is parsed every time); an entry whose key or checksum does not match is
    ignored, so a remembered value is always what the parser gave for these exact bytes. Like a passed check,
    it is written by flush_valid when the command succeeds: a refused command leaves the user cache as it was.
    """
    store = Cache(user_cache_dir(), "yaml")
    key = key_of("yaml", _yaml_fingerprint(), hashlib.sha256(text.encode()).hexdigest())
    hit = store.get(key)
    if isinstance(hit, dict) and set(hit) == {"value"}:
        return hit["value"]
    data = parse(text)
    try:
        same = json.loads(json.dumps(data)) == data
    except (TypeError, ValueError):
        same = False
    if same:
        _pending_yaml.append((key, {"value": data}))
    return data


_pending_yaml: list[tuple[str, Any]] = []


def _validated_path(schema_name: str, schema: Any, data: Any) -> Path | None:
    try:
        doc = json.dumps([schema_name, schema, data], sort_keys=True, separators=(",", ":"),
                         default=lambda o: f"<{type(o).__name__}:{o}>")
    except (TypeError, ValueError):
        return None
    key = hashlib.sha256(doc.encode()).hexdigest()
    return user_cache_dir() / "validated" / key[:2] / key[2:]


def known_valid(schema_name: str, schema: Any, data: Any) -> bool:
    """Has exactly this document already passed exactly this schema? (keyed by both; an entry says only that)"""
    p = _validated_path(schema_name, schema, data)
    try:
        return p is not None and p.read_bytes() == p.name.encode()
    except OSError:
        return False


def remember_valid(schema_name: str, schema: Any, data: Any) -> None:
    """Note a passed check; written by flush_valid when the command succeeds (a refused command writes nothing)."""
    p = _validated_path(schema_name, schema, data)
    if p is not None:
        _pending_valid.append(p)


_pending_valid: list[Path] = []


def flush_valid() -> None:
    if _pending_yaml:
        store = Cache(user_cache_dir(), "yaml")
        for key, value in _pending_yaml:
            store.put(key, value)
        _pending_yaml.clear()
    while _pending_valid:
        p = _pending_valid.pop()
        try:
            if not p.is_file():
                atomic_write(p, p.name.encode(), durable=False)
        except OSError:
            pass


def forget_valid() -> None:
    _pending_valid.clear()
    _pending_yaml.clear()


def code_stamp(*modules: Any) -> list[object]:
    """The source files of modules by their stat fields (size, mtime_ns): a value derived by their code is never
    reused by a changed forktool."""
    parts: list[object] = []
    for mod in modules:
        try:
            st = os.stat(mod.__file__ or "")
            parts.append([st.st_size, st.st_mtime_ns])
        except OSError:
            parts.append(None)
    return parts


def seal(value: Any) -> bytes:
    """value in marshal form behind its checksum: the sha256 (hex) of the body, a newline, the body."""
    import marshal

    body = marshal.dumps(value)
    return hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def unseal(data: bytes | memoryview) -> Any | None:
    """What seal() wrote, or None for a torn, damaged or foreign blob: the checksum is verified before
    marshal.loads sees the body."""
    import marshal

    body = memoryview(data)[65:]
    if bytes(data[64:65]) != b"\n" or hashlib.sha256(body).hexdigest().encode() != bytes(data[:64]):
        return None
    try:
        return marshal.loads(body)
    except (ValueError, EOFError, TypeError):
        return None


class Memo:
    """Values derived from exact input bytes (a parsed patch, a checked manifest), kept in marshal form.

    marshal of plain tuples, lists, dicts, strings and bytes loads several times faster than JSON, or than
    parsing and checking the input again. An entry is a sha256 of its body, a newline and the body, marshal of
    (kind, key, value); the checksum is verified before marshal.loads sees the body, and the kind and key must
    be the ones asked for, so a torn, damaged or foreign entry is ignored (the caller derives the value again).
    The key must name everything the value depends on: the input's digest and the code_stamp of the code.
    """

    def __init__(self, root: Path | None, kind: str):
        self.root = root / kind if root is not None else None
        self.kind = kind

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / key[2:]

    def get(self, key: str) -> Any | None:
        if self.root is None:
            return None
        try:
            kind, got, value = unseal(self._path(key).read_bytes())  # type: ignore[misc]
        except (OSError, ValueError, TypeError):  # no file, or not a sealed (kind, key, value)
            return None
        return value if kind == self.kind and got == key else None

    def put(self, key: str, value: Any) -> None:
        if self.root is None:
            return
        try:
            atomic_write(self._path(key), seal((self.kind, key, value)), durable=False)
        except (OSError, ValueError):
            pass  # a cache that cannot be written (or a value marshal cannot hold) only costs speed
