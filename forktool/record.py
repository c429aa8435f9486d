"""Plain records for the everyday commands: equality, repr and replace() over the fields a class names.

What the commands' own classes need of dataclasses, without its cost at every start: the dataclasses module
(which imports inspect, ast, dis and tokenize) and the code it generates per class took about 12 ms of each
`apply`, `unapply` and `status`. Immutable records are typing.NamedTuple; mutable ones derive from Record
and write their own __init__.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self


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
