"""The payload's one debug variable, OPENCOTI_KV_DEBUG, as the series ships it: every flag the code reads is in the
flag list that llama-kv-cache.cpp carries and in docs/manual.md, and the list names no flag that nothing reads (a
comparison switch taken out of the code must leave the docs too)."""

from __future__ import annotations

import re

from tests.helpers.project import REPO

PATCHES = sorted((REPO / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch"))
READ = re.compile(r'opencoti_(?:fattn|kv)_debug\("([a-z0-9-]+)"\)')
# the list: "//   flag  what it does", its lines added by a patch, after the line that introduces the variable
LIST_HEAD = "the one debug variable of the KV window"
LIST_ITEM = re.compile(r"^\+//   ([a-z0-9]+(?:-[a-z0-9]+)*)\s")


def added_lines() -> list[str]:
    return [line for p in PATCHES for line in p.read_text().splitlines() if line.startswith("+")]


def flags_read() -> set[str]:
    return {m.group(1) for line in added_lines() for m in READ.finditer(line)}


def flags_listed() -> set[str]:
    lines = added_lines()
    start = next(i for i, line in enumerate(lines) if LIST_HEAD in line)
    out = set()
    for line in lines[start + 1:]:
        if not line.startswith("+//"):
            break
        m = LIST_ITEM.match(line)
        if m:
            out.add(m.group(1))
    return out


def test_the_series_reads_flags_of_the_debug_variable():
    # the check below means something only if it finds what it compares
    assert {"no-tail-segments", "no-tail-ring", "no-tail-combine", "copy-tail"} <= flags_read()


def test_every_flag_read_is_in_the_librarys_list_and_every_listed_flag_is_read():
    read, listed = flags_read(), flags_listed()
    assert read - listed == set(), f"read by the code, missing from llama-kv-cache.cpp's list: {sorted(read - listed)}"
    assert listed - read == set(), f"listed in llama-kv-cache.cpp, read by nothing: {sorted(listed - read)}"


def test_every_flag_read_is_named_in_the_manual():
    manual = (REPO / "docs" / "manual.md").read_text()
    section = manual[manual.index("One debug variable, `OPENCOTI_KV_DEBUG`"):]
    missing = sorted(f for f in flags_read() if f"`{f}`" not in section)
    assert missing == [], f"OPENCOTI_KV_DEBUG flags docs/manual.md does not name: {missing}"
