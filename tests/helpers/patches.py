"""Patch files for tests, written from before/after texts without forktool's own diff or formatter."""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping

DATE = "Wed, 1 Jul 2026 12:30:44 +0000"
ZERO = "0" * 40
CONTEXT = 3  # lines of context, as git and the canonical form use
Text = str | bytes | None


def blob_sha1(data: bytes) -> str:
    """git's object id of a blob: what a canonical patch's `index` lines name."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _range(start: int, count: int) -> str:
    # git's hunk header: a one-line range is written without its count, an empty one starts before its place
    if count == 1:
        return str(start)
    return f"{start if count else start - 1},{count}"


def _body_line(op: str, line: bytes) -> bytes:
    if line.endswith(b"\n"):
        return op.encode() + line
    return op.encode() + line + b"\n\\ No newline at end of file\n"


def file_diff(path: str, old: bytes | None, new: bytes | None) -> bytes:
    """One `diff --git` section (mode 100644, full index lines, 3 lines of context, no function names)."""
    a = (old or b"").splitlines(keepends=True)
    b = (new or b"").splitlines(keepends=True)
    old_id = blob_sha1(old) if old is not None else ZERO
    new_id = blob_sha1(new) if new is not None else ZERO
    out = [f"diff --git a/{path} b/{path}\n".encode()]
    if old is None:
        out.append(f"new file mode 100644\nindex {old_id}..{new_id}\n--- /dev/null\n+++ b/{path}\n".encode())
    elif new is None:
        out.append(f"deleted file mode 100644\nindex {old_id}..{new_id}\n--- a/{path}\n+++ /dev/null\n".encode())
    else:
        out.append(f"index {old_id}..{new_id} 100644\n--- a/{path}\n+++ b/{path}\n".encode())
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1 + 1, i2 - i1)} +{_range(j1 + 1, j2 - j1)} @@\n".encode())
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out.extend(_body_line(" ", line) for line in a[x1:x2])
                continue
            out.extend(_body_line("-", line) for line in a[x1:x2])
            out.extend(_body_line("+", line) for line in b[y1:y2])
    return b"".join(out)


def _bytes(t: Text) -> bytes | None:
    return t.encode() if isinstance(t, str) else t


def make_patch(name: str, changes: Mapping[str, tuple[Text, Text]], title: str = "test patch", hooks: str = "", *,
               impact: str = "", author: str = "t <t@t>", date: str = DATE, body: str = "") -> str:
    """The text of a patch in canonical form: `changes` maps a repo-rooted path to (old, new), None for absent.

    Written here, from the canonical form's definition (git format-patch's mailbox layout), so a test compares
    forktool's parser, applier and exporter against bytes that none of them produced. `name` is kept for the
    reader of a failing test: the bytes depend only on the other arguments."""
    head = ["From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n", f"From: {author}\n",
            f"Date: {date}\n", f"Subject: [PATCH] {title}\n", "\n"]
    if body.strip():
        head.append(body.strip() + "\n\n")
    if hooks:
        head.append(f"Opencoti-Hooks: {hooks}\n")
    if impact:
        head.append(f"Build-Impact: {impact}\n")
    head.append("---\n")
    sections = []
    for path in sorted(changes):
        old, new = (_bytes(t) for t in changes[path])
        if old != new:
            sections.append(file_diff(path, old, new))
    return "".join(head) + b"".join(sections).decode("utf-8")
