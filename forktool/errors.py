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
        self.extra: dict[str, object] = {}  # more keys for --json, where an error says more than what failed

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
                "kind": type(self).__name__, **self.extra}


class UsageError(ForktoolError):
    """The command line itself is wrong. Exit code 2."""

    exit_code = 2


class ConfigError(ForktoolError):
    """A configuration file (vendor.yaml, registry, profiles) is invalid."""


class PatchFormatError(ForktoolError):
    """A patch file is not in canonical form or is malformed."""


class ApplyError(ForktoolError):
    """A patch does not apply: a hunk's context is not found, or a file it changes is missing or already there."""


class ContextError(ApplyError):
    """A hunk's context is found neither at its place nor at any offset (the text it was written against changed).

    `patch` and `path` name the patch file and the file; `below`: the patches before it in the series that change
    that file (filled in by the command that knows the series)."""

    patch = ""
    path = ""
    below: tuple[str, ...] = ()


class DirtyTreeError(ForktoolError):
    """The vendored tree holds changes no patch explains."""


class UnsafePathError(ForktoolError):
    """A path would write outside the vendored root."""


class VerifyError(ForktoolError):
    """verify found differences."""


class OutputError(Exception):
    """stdout could not take the command's output (closed, full, a closed pipe). Not a ForktoolError: the
    command itself ran to its end with `exit_code`; the CLI decides how the process leaves."""

    def __init__(self, error: OSError | ValueError, exit_code: int):
        import errno

        # ValueError: the stream object itself was closed, which reads as a closed descriptor
        self.errno = getattr(error, "errno", None) or errno.EBADF
        self.reason = getattr(error, "strerror", None) or "stdout is closed"
        self.exit_code = exit_code
        super().__init__(f"cannot write the output to stdout: {self.reason}")


def check_id(value: str | None, option: str) -> str | None:
    """A patch id given on the command line: None (not given) or four digits; '' never means "all"."""
    if value is None:
        return None
    if len(value) != 4 or not value.isascii() or not value.isdigit():
        raise UsageError(f"{option} {value!r}: a patch id is four digits, e.g. 0072", where=option,
                         hint="`forktool status` lists the ids of the series")
    return value


def check_line(value: str, option: str) -> str:
    """Text that goes into one header line of a patch: no newline, carriage return or NUL (no header injection),
    and UTF-8 only: returns the text to use (bytes the locale could not decode are read as UTF-8, or refused)."""
    if any(ch in value for ch in "\n\r\0") or any(ord(ch) < 32 and ch != "\t" for ch in value):
        raise UsageError(f"{option} must be a single line of text (no newline or control character)", where=option,
                         hint="put longer text in the patch message after creating it")
    if any("\udc80" <= ch <= "\udcff" for ch in value):  # bytes the locale could not decode (surrogateescape)
        import os

        raw = os.fsencode(value)
        try:
            return raw.decode("utf-8")  # UTF-8 given in a locale that is not (LC_ALL=C with PYTHONUTF8=0)
        except UnicodeDecodeError as e:
            raise UsageError(f"{option} is not UTF-8 text (byte 0x{raw[e.start]:02x}); a patch header is UTF-8",
                             where=option, hint="give the text as UTF-8") from None
    return value
