"""Generated documents run through a schema shortcut and through jsonschema itself, which must agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema

from forktool import cache, schema, schemas
from forktool.errors import ConfigError


def valid(doc: Any, name: str) -> bool:
    """What jsonschema itself says of doc against the schema called name."""
    return jsonschema.Draft202012Validator(schemas.SCHEMAS[name]).is_valid(doc)


def shortcut_agrees(memo: cache.Checks, docs: list[dict], name: str, where: str, key: str,
                    shape_of: Callable[[dict], dict | None], shown: Callable[[dict], Any] = lambda d: d) -> int:
    """For every document: a shape remembered under key is known valid only where jsonschema accepts the document,
    and schema.check(doc, name, where) accepts exactly what jsonschema accepts (a failure shows shown(doc)).
    Returns how many documents took the shortcut."""
    fast = 0
    for doc in docs:
        shape = shape_of(doc)
        if shape is not None and memo.known_valid(key, schemas.SCHEMAS[name], shape):
            fast += 1
            assert valid(doc, name), shown(doc)  # never accepts what jsonschema refuses
        try:
            schema.check(doc, name, where)
            ok = True
        except ConfigError:
            ok = False
        assert ok == valid(doc, name), shown(doc)
    return fast
