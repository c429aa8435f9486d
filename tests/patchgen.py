"""Build canonical patches for tests from before/after texts, with forktool's own formatter."""

from __future__ import annotations

from forktool.series import Patch, diff_file, format_patch, make_header


def make_patch(name: str, changes: dict[str, tuple[str | None, str | None]], title: str = "test patch",
               hooks: str = "") -> str:
    files = []
    for rel, (old, new) in sorted(changes.items()):
        fd = diff_file(rel, old.encode() if old is not None else None, new.encode() if new is not None else None,
                       "100644" if old is not None else None, "100644" if new is not None else None)
        assert fd is not None
        files.append(fd)
    trailers = {"Opencoti-Hooks": hooks} if hooks else {}
    header = make_header(title, author="t <t@t>", date="Wed, 1 Jul 2026 12:30:44 +0000", trailers=trailers)
    p = Patch(name[:4], name, header, files)
    return format_patch(p).decode()
