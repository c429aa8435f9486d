"""The errors forktool raises; the CLI maps them to exit codes."""

from __future__ import annotations


class ForktoolError(Exception):
    """An expected failure: bad input, mismatch, conflict. Exit code 1.

    `what` says what failed, `where` names the place (patch, file, hunk, line),
    `hint` says what to do next.
    """

    exit_code = 1

    def __init__(self, what: str, where: str = "", hint: str = "", details: list[str] | None = None):
        super().__init__(what)
        self.what = what
        self.where = where
        self.hint = hint
        self.details = list(details or [])

    def __str__(self) -> str:
        parts = [self.what]
        if self.where:
            parts.append(f"  where: {self.where}")
        parts.extend(f"  - {d}" for d in self.details)
        if self.hint:
            parts.append(f"  next: {self.hint}")
        return "\n".join(parts)

    def to_json(self) -> dict[str, object]:
        return {"error": self.what, "where": self.where, "hint": self.hint, "details": self.details,
                "kind": type(self).__name__}


class UsageError(ForktoolError):
    """The command line itself is wrong. Exit code 2."""

    exit_code = 2


class ConfigError(ForktoolError):
    """A configuration file (vendor.yaml, registry, profiles) is invalid."""


class PatchFormatError(ForktoolError):
    """A patch file is not in canonical form or is malformed."""


class ApplyError(ForktoolError):
    """A hunk does not apply at its place or at any offset."""


class DirtyTreeError(ForktoolError):
    """The vendored tree holds changes no patch explains."""


class UnsafePathError(ForktoolError):
    """A path would write outside the vendored root."""


class VerifyError(ForktoolError):
    """verify found differences."""
