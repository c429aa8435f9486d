"""Every file forktool reads, read safely and checked against its JSON Schema (forktool/schemas.py).

Why JSON Schema checked with `jsonschema` rather than typed models: the files are YAML and JSON
documents written by people and by other tools, so their contract is best stated as data that
anyone can read, diff and reuse outside Python; one generic checker then reports every file's
errors the same way (file, key path, what was expected, what to do). What a schema cannot say
(cross-references, inheritance loops, paths that must stay inside a root) is checked in code
right after, by the module that owns the file.

Reading is as strict as checking: only regular files (a FIFO, device, directory or symlink out
of its root is refused before it is opened), a size cap, UTF-8 only, YAML through a safe loader
with a depth limit and without anchors, duplicate keys or non-finite numbers, JSON without NaN,
Infinity or duplicate keys.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from forktool.errors import ConfigError, ForktoolError, UnsafePathError
from forktool.tree import file_kind as _kind

if TYPE_CHECKING:
    from typing import Any

CONFIG_LIMIT = 4 << 20  # a YAML config or a JSON record
STATE_LIMIT = 256 << 20  # manifests of whole trees
PATCH_LIMIT = 32 << 20  # one patch file
MAX_DEPTH = 64  # nesting of mappings and lists in any document
MAX_NODES = 2_000_000  # values in one document once YAML aliases are expanded
_UNREADABLE = "give your user read access to it (the error says what stopped it) and run the command again"
_MOVING = "something changed the file while forktool read it; run the command again once nothing writes to it"


# ---------------------------------------------------------------- reading bytes


def check_no_symlink_out(path: Path, root: Path, what: str, label: str = "") -> None:
    """Refuse when path, or a directory between root and path, is a symlink (nothing is followed out)."""
    try:
        rel = path.relative_to(root)
    except ValueError:
        return
    cur = root
    for part in rel.parts:
        cur = cur / part
        try:
            link = stat.S_ISLNK(os.lstat(cur).st_mode)
        except FileNotFoundError:
            return
        except OSError as e:
            raise ConfigError(f"{label or path.name}: {path} cannot be read: {e.strerror}", where=str(path),
                              hint=_UNREADABLE) from None
        if link:
            raise UnsafePathError(f"{cur} is a symlink; forktool does not follow links in {what}",
                                  where=str(cur), hint=f"replace the link with the real {'file' if cur == path else 'directory'}")


def read_regular(path: Path, what: str = "", limit: int = CONFIG_LIMIT, root: Path | None = None,
                 missing_hint: str = "", where: str = "") -> bytes:
    """The bytes of a regular file; anything else (FIFO, device, directory, link out of root, too big) is refused."""
    label = what or path.name
    if root is not None:
        check_no_symlink_out(path, root, str(root.name), label)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{label}: {path} not found", where=where or str(path), hint=missing_hint) from None
    except OSError as e:
        raise ConfigError(f"{label}: {path} cannot be read: {e.strerror}", where=str(path),
                          hint=_UNREADABLE) from None
    if not stat.S_ISREG(st.st_mode):
        kind = _kind(st.st_mode)
        raise ConfigError(f"{label}: {path} is a {kind}, not a regular file", where=str(path),
                        hint=f"replace it with the regular file forktool expects{'; ' + missing_hint if missing_hint else ''}")
    if st.st_size > limit:
        raise ConfigError(f"{label}: {path} is {st.st_size} bytes, more than the {limit >> 20} MiB limit", where=str(path),
                        hint="this is not a file forktool wrote or expects; check what replaced it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) * (root is not None))
    except OSError as e:
        raise ConfigError(f"{label}: {path} cannot be opened: {e.strerror}", where=str(path),
                          hint=_UNREADABLE) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped for something else since the stat
            raise ConfigError(f"{label}: {path} is not a regular file", where=str(path), hint=_MOVING)
        # read what the stat promised (asking for limit + 1 bytes at once makes Python allocate that much first),
        # then, only for a file that grew since, on up to the limit
        data = f.read(min(limit, st.st_size) + 1)
        if len(data) > st.st_size:
            data += f.read(limit + 1 - len(data))
    if len(data) > limit:
        raise ConfigError(f"{label}: {path} grew past the {limit >> 20} MiB limit while being read", where=str(path),
                          hint=_MOVING)
    return data


def decode(data: bytes, path: Path | str, label: str = "") -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"{label or Path(path).name} is not valid UTF-8 (byte {e.start}, line {line})",
                          where=f"{path}:{line}", hint="save the file as UTF-8") from None


# ---------------------------------------------------------------- YAML and JSON


@cache
def _loader() -> Any:
    """The YAML loader class, built on first use so commands that read no YAML never import yaml."""
    import yaml

    class _Loader(yaml.SafeLoader):
        """yaml.SafeLoader without duplicate keys, non-finite floats or deep nesting (aliases are measured after)."""

        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise yaml.constructor.ConstructorError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                                        self.peek_event().start_mark)
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # type: ignore[override]
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    hashable = key in seen
                except TypeError:
                    raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a plain value",
                                                            key_node.start_mark) from None
                if hashable:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_float(self, node: Any) -> float:
            value = super().construct_yaml_float(node)
            if not math.isfinite(value):
                raise yaml.constructor.ConstructorError(None, None, f"{node.value!r}: infinite or NaN numbers are not "
                                                        "allowed", node.start_mark)
            return value

    _Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
    return _Loader


def parse_yaml(text: str, where: str) -> Any:
    from forktool import cache

    # the same bytes parse to the same value; measured before it is remembered (aliases can expand a document)
    data = cache.checks().parsed_yaml(text, lambda t: _measured(_parse_yaml(t, where), where))
    measure(data, where)
    return data


def _measured(data: Any, where: str) -> Any:
    measure(data, where)
    return data


def _parse_yaml(text: str, where: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # noqa: S506 - the loader is a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{Path(where).name} is not valid YAML: {problem}", where=f"{where}{at}",
                          hint="fix the YAML (plain mappings, lists and scalars only)") from None
    except RecursionError:
        raise ConfigError(f"{Path(where).name} is nested too deeply", where=where) from None


def measure(data: Any, where: str) -> None:
    """Refuse documents nested too deeply or too large once aliases are expanded (a 'billion laughs')."""
    stack = [(data, 1)]
    nodes = 0
    while stack:
        obj, d = stack.pop()
        nodes += 1
        if d > MAX_DEPTH:
            raise ConfigError(f"{Path(where).name} is nested more than {MAX_DEPTH} levels deep", where=where)
        if nodes > MAX_NODES:
            raise ConfigError(f"{Path(where).name} expands to more than {MAX_NODES} values (anchors and aliases?)",
                              where=where, hint="write the values out; forktool's files are small")
        if isinstance(obj, dict):
            stack.extend((v, d + 1) for v in obj.values())
        elif isinstance(obj, list):
            stack.extend((v, d + 1) for v in obj)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def parse_json(text: str, where: str) -> Any:
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_pairs)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{Path(where).name} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                          where=f"{where}:{e.lineno}") from None
    except ValueError as e:
        raise ConfigError(f"{Path(where).name} is not valid JSON: {e}", where=where) from None
    except RecursionError:
        raise ConfigError(f"{Path(where).name} is nested too deeply", where=where) from None
    measure(data, where)
    return data


# ---------------------------------------------------------------- checking against a schema


@cache
def _validator(name: str) -> Any:
    import jsonschema

    from forktool import schemas
    schema = schemas.SCHEMAS[name]
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=None)


def where_of(path: Any) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# A top-level object of a document whose values change on every run (vendor.lock's recorded digests) while the
# rest stays the same. When every value there is a string that passes its property's pattern, and those are all
# the property's schema asks of it, the document is valid exactly when any document with the same keys and the
# same everything else is: the check of the rest is remembered under the document with those values blanked.
_VOLATILE = {"vendor-lock": "patched"}
_OBJECT_WORDS = {"type", "properties", "required", "additionalProperties", "dependentRequired"}
_STRING_WORDS = {"type", "pattern", "x-error"}


def volatile_shape(data: Any, name: str) -> Any:
    """data with its volatile object's values blanked, or None when the hand check cannot stand for the schema."""
    from forktool import schemas
    key = _VOLATILE.get(name)
    if key is None or not isinstance(data, dict) or not isinstance(data.get(key), dict):
        return None
    sub = schemas.SCHEMAS[name].get("properties", {}).get(key, {})
    if set(sub) - _OBJECT_WORDS or sub.get("type") != "object" or sub.get("additionalProperties") is not False:
        return None
    for k, value in data[key].items():
        prop = sub["properties"].get(k)
        if prop is None or set(prop) - _STRING_WORDS or prop.get("type") != "string" or "pattern" not in prop:
            return None
        if not isinstance(value, str) or re.search(prop["pattern"], value) is None:  # as jsonschema matches
            return None
    return {**data, key: dict.fromkeys(data[key])}


# documents whose sha256 values change with every write (state.json after each apply or refresh)
_DIGEST_SHAPED = {"state"}
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_ZEROS = "0" * 64


@cache
def _schema_strings(name: str) -> tuple[tuple[str, ...], bool]:
    """Every pattern in the schema `name`, and whether a const or enum in it names a 64-character string."""
    from forktool import schemas
    patterns: list[str] = []
    fixed = False
    stack: list[Any] = [schemas.SCHEMAS[name]]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                patterns.append(node["pattern"])
            for k in ("const", "enum"):
                if k in node:
                    vals = node[k] if k == "enum" and isinstance(node[k], list) else [node[k]]
                    fixed = fixed or any(isinstance(x, str) and len(x) == 64 for x in vals)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return tuple(patterns), fixed


def digest_shape(data: Any, name: str) -> Any:
    """data with every sha256-like string value (64 lowercase hex digits; never a key) replaced by 64 zeros, or
    None when the schema could tell two such strings apart.

    The schema cannot tell them apart when no const or enum in it names a 64-character string and every pattern
    in it matches each replaced value exactly when it matches the zeros: every keyword that looks at a string
    (pattern, const, enum, length) then gives the same answer for both, so the document passes exactly when
    its shape does (uniqueItems can only fail more often on the shape, never less).
    """
    if name not in _DIGEST_SHAPED:
        return None
    patterns, fixed = _schema_strings(name)
    if fixed:
        return None
    seen: set[str] = set()

    def blank(o: Any) -> Any:
        if isinstance(o, str):
            if len(o) == 64 and _HEX64.match(o):
                seen.add(o)
                return _ZEROS
            return o
        if isinstance(o, dict):
            return {k: blank(v) for k, v in o.items()}
        if isinstance(o, list):
            return [blank(v) for v in o]
        return o

    shape = blank(data)
    if not seen:
        return None
    for p in patterns:
        want = re.search(p, _ZEROS) is not None
        if any((re.search(p, v) is not None) != want for v in seen):
            return None
    return shape


def check(data: Any, name: str, where: str, hint: str = "") -> Any:
    """data checked against the schema `name`; the first error becomes a ConfigError naming file and key."""
    from forktool import cache, schemas
    memo = cache.checks()
    if memo.known_valid(name, schemas.SCHEMAS[name], data):  # the same bytes passed before: skip loading jsonschema
        return data
    shape = volatile_shape(data, name)
    if shape is not None and memo.known_valid(f"{name}#shape", schemas.SCHEMAS[name], shape):
        return data
    digests = digest_shape(data, name)
    if digests is not None and memo.known_valid(f"{name}#digests", schemas.SCHEMAS[name], digests):
        return data
    v = _validator(name)
    import jsonschema
    err = jsonschema.exceptions.best_match(v.iter_errors(data), key=_relevance)
    if err is None:
        memo.remember_valid(name, schemas.SCHEMAS[name], data)
        if shape is not None:
            memo.remember_valid(f"{name}#shape", schemas.SCHEMAS[name], shape)
        if digests is not None:
            memo.remember_valid(f"{name}#digests", schemas.SCHEMAS[name], digests)
        return data
    # report the deepest error of a oneOf/anyOf when it names a concrete key
    while err.context:
        err = min(err.context, key=lambda e: -len(e.absolute_path))
    at = where_of(err.absolute_path)
    msg = _message(err)
    raise ConfigError(msg, where=f"{where}: {at}" if at else where, hint=hint or _hint(err, name))


def _relevance(err: Any) -> Any:
    import jsonschema
    return jsonschema.exceptions.relevance(err)


_TYPES = {"string": "a string", "integer": "a whole number", "number": "a number", "boolean": "true or false",
          "array": "a list", "object": "a mapping", "null": "null"}


def _pytype(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a number"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _message(err: Any) -> str:
    custom = err.schema.get("x-error") if isinstance(err.schema, dict) else None
    key = next((str(p) for p in reversed(err.absolute_path) if isinstance(p, str)), "")
    if err.validator == "additionalProperties":
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(str(k) for k in err.instance if k not in allowed) if isinstance(err.instance, dict) else []
        return f"unknown key(s): {', '.join(extra)}"
    if err.validator == "dependentRequired":
        missing = sorted({k for v in err.validator_value.values() for k in v} - set(err.instance))
        return f"missing key(s): {', '.join(missing)}"
    if err.validator == "required":
        missing = sorted(k for k in err.validator_value if k not in err.instance)
        return f"missing key(s): {', '.join(missing)}"
    if custom and err.validator == "type":  # the form it names may hold already: say what the value is instead
        quote = " (quote it in YAML)" if err.validator_value == "string" and "quote" not in str(custom) else ""
        return f"{custom}: got {_pytype(err.instance)}{quote}"
    if custom:
        return str(custom)
    if err.validator == "type":
        want = err.validator_value
        wants = " or ".join(_TYPES.get(str(w), str(w)) for w in (want if isinstance(want, list) else [want]))
        quote = " (quote it in YAML)" if want == "string" else ""
        return f"{key or 'value'}: expected {wants}, got {_pytype(err.instance)}{quote}"
    if err.validator == "enum":
        return f"{key or 'value'} must be one of {', '.join(str(x) for x in err.validator_value)}"
    if err.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{key or 'value'} {err.instance!r} is out of range ({err.validator} {err.validator_value})"
    if err.validator == "pattern":
        return f"{key or 'value'} {str(err.instance)[:80]!r} is malformed"
    if err.validator == "propertyNames":
        return f"key {str(err.instance)[:80]!r} is malformed"
    if err.validator in ("minItems", "minProperties"):
        return f"{key or 'value'} must not be empty"
    if err.validator in ("maxItems", "maxProperties", "maxLength"):
        return f"{key or 'value'} is too long"
    if err.validator == "minLength":
        return f"{key or 'value'} must not be empty"
    if err.validator == "const":
        return f"{key or 'value'} must be {err.validator_value!r}"
    return f"{key or 'value'}: {err.message[:200]}"


def _hint(err: Any, name: str) -> str:
    """What to do: the failing key's own advice (the keys allowed, an x-hint), then the document's fix."""
    from forktool import schemas
    own = ""
    if err.validator == "additionalProperties":
        own = f"allowed: {', '.join(sorted(err.schema.get('properties', {})))}"
    elif isinstance(err.schema, dict):
        own = str(err.schema.get("x-hint", ""))
    return "; ".join(h for h in (own, schemas.fix(name)) if h)


# ---------------------------------------------------------------- one call per file


def load_yaml(path: Path, name: str, missing_hint: str = "", limit: int = CONFIG_LIMIT,
              root: Path | None = None) -> Any:
    """A YAML file read safely and checked against the schema `name` (root: no symlink below it is followed)."""
    try:
        text = decode(read_regular(path, path.name, limit, root, missing_hint), path)
        return check(parse_yaml(text, str(path)), name, str(path))
    except ConfigError as e:
        if not e.hint:  # a file that cannot be read or parsed: the same next step as a key the schema refuses
            from forktool import schemas
            e.hint = schemas.fix(name, "the file")
        raise


def load_json(path: Path, name: str, missing_hint: str = "", limit: int = CONFIG_LIMIT, root: Path | None = None,
              hint: str = "") -> Any:
    """A JSON file read safely and checked against the schema `name`."""
    try:
        text = decode(read_regular(path, path.name, limit, root, missing_hint), path)
        return check(parse_json(text, str(path)), name, str(path), hint=hint)
    except ConfigError as e:
        if not e.hint:
            from forktool import schemas
            e.hint = hint or schemas.fix(name, "the file")
        raise


def load_state(path: Path, state_dir: Path) -> dict[str, Any] | None:
    """.opencoti/state.json checked against its schema; None when there is none yet."""
    if not os.path.lexists(path):
        return None
    return load_json(path, "state", root=state_dir, limit=STATE_LIMIT,
                     hint="restore the newest backup (`forktool backup restore NAME`), or, with the tree pristine, "
                          f"delete {path}")


def sync_state_hint(path: Path) -> str:
    """What to do about a sync state forktool cannot use (--abort itself needs a valid one)."""
    return (f"put back the file `forktool sync` wrote if you have it; otherwise move it away (`mv {path} "
            f"{path}.bad`) and put back what the sync changed: the tree with `forktool backup restore NAME` (the "
            "newest sync-start-* in `forktool backup list`), the pin, lock, patches and registry from git (`git "
            "checkout -- vendor/vendor.yaml vendor/vendor.lock patches registry`) or from the same NAME in "
            ".opencoti/sync-backups/ (its manifest.json maps each file to an object by sha256)")


def load_sync_state(path: Path, state_dir: Path) -> dict[str, Any] | None:
    """.opencoti/sync/state.json checked against its schema and its own counts; None when there is none."""
    if not os.path.lexists(path):
        return None
    hint = sync_state_hint(path)
    st = load_json(path, "sync-state", root=state_dir, limit=STATE_LIMIT, hint=hint)
    if st["position"] > len(st["original"]):
        raise ConfigError(f"position {st['position']} is past the {len(st['original'])} patch(es) of original",
                          where=f"{path}: position", hint=hint)
    if st["stage"] == "stopped" and (st["stop"] is None or st["position"] >= len(st["original"])):
        raise ConfigError("a stopped sync must record its stop at one of the original patches",
                          where=f"{path}: stop", hint=hint)
    if st["stage"] != "starting" and st["stage"] != "aborted" and not st["backups"]:
        raise ConfigError(f"a {st['stage']} sync must name its backups", where=f"{path}: backups", hint=hint)
    return st


def load_sync_ended(path: Path, state_dir: Path) -> dict[str, Any] | None:
    """.opencoti/sync/ended.json (how the last sync ended: undone or aborted) checked; None when there is none."""
    if not os.path.lexists(path):
        return None
    return load_json(path, "sync-ended", root=state_dir, limit=STATE_LIMIT,
                     hint=f"it only tells `forktool sync --undo` how the last sync ended: delete {path}")


def check_state_covers(path: Path, applied: list[dict], files: dict[str, Any], patches: dict[str, Any]) -> None:
    """Every file an applied (unchanged) patch touches is recorded in the state: a cut state is refused, not
    mistaken for local edits."""
    for a in applied:
        p = patches.get(a["id"])
        if p is None or p.sha256 != a["sha256"]:
            continue
        missing = [r for r in p.paths if r not in files]
        if missing:
            raise ConfigError(f"{path.name} does not record {missing[0]}, which applied patch {a['id']} changes",
                              where=f"{path}: files", hint="restore the newest backup (`forktool backup restore NAME`)")


def no_space(e: OSError, where: str) -> ForktoolError:
    """The error to raise for a write that failed because the disk is full (ENOSPC/EDQUOT)."""
    return ForktoolError(f"no space left on the device while writing {where}", where=where,
                         hint="free some space and run the command again; nothing was changed")


def is_no_space(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
