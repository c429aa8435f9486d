"""Plain records for the everyday commands: equality, repr and replace() over the fields a class names, and a
NamedTuple that does not compile annotations.

What the commands' own classes need of dataclasses and typing, without their cost at every start: the
dataclasses module (which imports inspect, ast, dis and tokenize) and the code it generates per class took
about 12 ms of each `apply`, `unapply` and `status`, and typing.NamedTuple compiles every field's annotation
string (postponed annotations) into a ForwardRef, about 1 ms for the commands' records. Immutable records are
`NamedTuple`s from here (typing's own for the type checker, the stand-in below at run time); mutable ones
derive from Record and write their own __init__.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, ClassVar, Self
    from typing import NamedTuple as NamedTuple
else:
    # names typing.NamedTuple keeps for itself, and those every class namespace has
    _RESERVED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                           "_make", "_replace", "_asdict", "_source"})
    _SKIP = frozenset({"__module__", "__qualname__", "__annotations__", "__orig_bases__"})

    class _NamedTupleMeta(type):
        """`class X(NamedTuple): a: int; b: str = ""` at run time: a collections.namedtuple with those fields
        and defaults, and the class body's methods, properties and docstring, as typing.NamedTuple makes it
        (the annotations are kept as written, never evaluated)."""

        def __new__(mcls, name: str, bases: tuple, ns: dict) -> type:
            if not bases:  # NamedTuple itself
                return super().__new__(mcls, name, bases, ns)
            annotations = ns.get("__annotations__", {})
            fields = list(annotations)
            defaults = [ns[f] for f in fields if f in ns]
            if any(f not in ns for f in fields[len(fields) - len(defaults):]):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            nt = collections.namedtuple(name, fields, defaults=defaults or None, module=ns.get("__module__"))
            nt.__annotations__ = dict(annotations)
            nt.__qualname__ = ns.get("__qualname__", name)
            for key, value in ns.items():
                if key in _RESERVED:
                    raise AttributeError(f"cannot overwrite NamedTuple attribute {key}")
                if key not in _SKIP and key not in annotations:
                    setattr(nt, key, value)
            return nt

    NamedTuple = _NamedTupleMeta("NamedTuple", (), {})


class Record:
    """A mutable record: __eq__ and __repr__ over FIELDS (in order), replace() builds a copy with changes."""

    FIELDS: ClassVar[tuple[str, ...]] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as a dataclass with eq

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS)
        return f"{type(self).__name__}({shown})"

    def replace(self, **changes: Any) -> Self:
        """A new record with the same fields but `changes` (as dataclasses.replace; unknown names are refused)."""
        unknown = set(changes) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field(s) {', '.join(sorted(unknown))}")
        return type(self)(**{f: changes[f] if f in changes else getattr(self, f) for f in self.FIELDS})
