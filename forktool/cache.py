"""Remembered values keyed by the digests they were derived from: optimisations that cannot vouch (docs/caches.md)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

from forktool.tree import atomic_write, read_file

if TYPE_CHECKING:
    from typing import Any

CACHE_VERSION = 1


def key_of(*parts: object) -> str:
    """One digest for an ordered list of JSON-able key parts."""
    return hashlib.sha256(json.dumps([CACHE_VERSION, *parts], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _checksum(value_json: str) -> str:
    return hashlib.sha256(value_json.encode()).hexdigest()


class Cache:
    """One kind of derived value (e.g. "reexport", "scopes", "verdict") stored by key digest.

    An entry records its full key and a checksum of its value; an entry whose key or checksum does not match
    (stale, corrupt, truncated, from another version) is ignored. A checksum is not a signature: a Cache holds
    verdicts only under .opencoti/, which is trusted like git's index.
    """

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
            raw = json.loads(read_file(self._path(key)))
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


@functools.cache
def tool_fingerprint() -> str:
    """The tool version plus the stat fields of its own files, so a changed forktool never reuses a verdict."""
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


@functools.cache
def parser_fingerprint() -> str:
    """The installed C++ parser (tree-sitter and its grammar) by the stat fields of their files, not imported."""
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
    return key_of("parser", parts)


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


class Checks:
    """Schema passes and YAML parses of one project's files, remembered under its .opencoti/cache/.

    These are verdicts (a remembered pass skips jsonschema, a remembered parse skips the parser), so they are
    kept only where the project's own state is, never in the shared user cache: whoever can write them can
    also write the tree and state.json. root None remembers nothing and reads nothing (--no-cache). What a
    command learns is written by flush() when it ends without an error: a refused command writes nothing.
    """

    def __init__(self, root: Path | None):
        self.root = root
        self._yaml = Cache(root, "yaml")
        self._valid: set[Path] = set()  # passed in this command, written by flush()
        self._parsed: dict[str, Any] = {}

    def _validated_path(self, schema_name: str, schema: Any, data: Any) -> Path | None:
        if self.root is None:
            return None
        try:
            doc = json.dumps([schema_name, schema, data], sort_keys=True, separators=(",", ":"),
                             default=lambda o: f"<{type(o).__name__}:{o}>")
        except (TypeError, ValueError):
            return None
        key = hashlib.sha256(doc.encode()).hexdigest()
        return self.root / "validated" / key[:2] / key[2:]

    def known_valid(self, schema_name: str, schema: Any, data: Any) -> bool:
        """Has exactly this document already passed exactly this schema? (keyed by both; an entry says only that)"""
        p = self._validated_path(schema_name, schema, data)
        if p is None:
            return False
        try:
            return p in self._valid or read_file(p) == p.name.encode()
        except OSError:
            return False

    def remember_valid(self, schema_name: str, schema: Any, data: Any) -> None:
        p = self._validated_path(schema_name, schema, data)
        if p is not None:
            self._valid.add(p)

    def parsed_yaml(self, text: str, parse: Callable[[str], Any]) -> Any:
        """parse(text), remembered under the text's digest and the parser's fingerprint.

        Only a document that parsed without error and comes back from JSON as the very same value is remembered
        (a date, a set or a non-string key is parsed every time); an entry whose key or checksum does not match
        is ignored.
        """
        if self.root is None:
            return parse(text)
        key = key_of("yaml", _yaml_fingerprint(), hashlib.sha256(text.encode()).hexdigest())
        hit = self._yaml.get(key)
        if isinstance(hit, dict) and set(hit) == {"value"}:
            return hit["value"]
        data = parse(text)
        try:
            same = json.loads(json.dumps(data)) == data
        except (TypeError, ValueError):
            same = False
        if same:
            self._parsed[key] = {"value": data}
        return data

    def flush(self) -> None:
        """Write what this command learnt (a cache that cannot be written only costs speed)."""
        for key, value in self._parsed.items():
            self._yaml.put(key, value)
        for p in sorted(self._valid):
            try:
                if not p.is_file():
                    atomic_write(p, p.name.encode(), durable=False)
            except OSError:
                pass
        self._parsed.clear()
        self._valid.clear()


# Which project's Checks a schema check or YAML parse uses: set for the length of one command by remembering(),
# so the readers of every file need not carry it; outside any command, nothing is remembered.
_checks: ContextVar[Checks | None] = ContextVar("forktool_checks", default=None)
_NOTHING = Checks(None)


def checks() -> Checks:
    """The Checks of the command running now (one that remembers nothing outside remembering())."""
    return _checks.get() or _NOTHING


def _own_cache(state_dir: Path) -> Path | None:
    """state_dir/cache, unless state_dir or its cache/ is a link or not a directory: the remembered checks are never
    read or written through a link out of the project."""
    root = state_dir / "cache"
    for d in (state_dir, root):
        try:
            if not stat.S_ISDIR(os.lstat(d).st_mode):  # lstat: a link is not a directory
                return None
        except FileNotFoundError:
            return root  # made by the first write, as a real directory
        except OSError:
            return None
    return root


@contextmanager
def remembering(state_dir: Path | None) -> Iterator[Checks]:
    """Within: schema passes and YAML parses are remembered in state_dir's cache/, written when the block ends
    without an exception (state_dir None: nothing is read or written, as for --no-cache)."""
    memo = Checks(_own_cache(state_dir) if state_dir is not None else None)
    token = _checks.set(memo)
    try:
        yield memo
        memo.flush()
    finally:
        _checks.reset(token)


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
            kind, got, value = unseal(read_file(self._path(key)))  # type: ignore[misc]
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
