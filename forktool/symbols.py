"""Enclosing C/C++ symbols by line: a small brace-and-header scanner, good enough to anchor hook sites."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from forktool.cache import Cache, key_of
from forktool.tree import sha256_bytes

_CONTROL = {"if", "for", "while", "switch", "catch", "do", "else", "try", "return", "sizeof", "decltype",
            "static_assert", "alignas", "defined"}
_CLASS_RE = re.compile(r"^(?:template\s*<.*>\s*)?(?:typedef\s+)?(struct|class|union)\s+(?:\w+\s+)*?"
                       r"([A-Za-z_]\w*)\s*(?:final\s*)?(?::[^{]*)?$")
_NAME_RE = re.compile(r"((?:[A-Za-z_~][A-Za-z0-9_]*\s*(?:<[^<>()]*>)?\s*::\s*)*~?[A-Za-z_][A-Za-z0-9_]*|operator\s*[^\s(]+)\s*$")


@dataclass(frozen=True)
class Scope:
    kind: str  # function, class, namespace, block
    name: str
    start: int  # 1-based line of the header
    end: int  # 1-based line of the closing brace


def _strip(text: str) -> str:
    """Blank out comments, string and char literals and preprocessor lines, keeping every newline."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n and text[j] != "\n":
                j = j + 2 if text[j] == "\\" and j + 1 < n else j + 1
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        if c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if m:
                end = text.find(")" + m.group(1) + '"', i)
                j = n if end < 0 else end + len(m.group(1)) + 2
                out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
                i = j
                continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " " * (j - i))
            i = j
            continue
        out.append(c)
        line_start = c == "\n" or (line_start and c in " \t")
        i += 1
    return "".join(out)


def _classify(header: str) -> tuple[str, str]:
    h = " ".join(header.split())
    if not h:
        return "block", ""
    m = _CLASS_RE.match(h)
    if m:
        return "class", m.group(2)
    m = re.match(r"^(?:inline\s+)?namespace\s*([A-Za-z_][\w:]*)?$", h)
    if m:
        return "namespace", m.group(1) or ""
    if re.match(r'^extern\s+"C"$', h) or h.startswith("extern"):
        return "namespace", ""
    if h.startswith("enum"):
        return "block", ""
    if h.count("(") != h.count(")"):
        return "block", ""  # a brace inside a call's arguments: an initializer, not a definition
    # a function definition: NAME(args) [qualifiers] [: init-list]
    depth = 0
    for i, ch in enumerate(h):
        if ch == "(":
            if depth == 0:
                before = h[:i]
                if "=" in before.replace("==", "").replace("operator=", "") or before.rstrip().endswith(("]", ")")):
                    return "block", ""
                nm = _NAME_RE.search(before)
                if not nm:
                    return "block", ""
                name = re.sub(r"\s+", "", nm.group(1))
                if before[: nm.start()].rstrip().endswith((".", "->")):
                    return "block", ""  # a member call, e.g. v.push_back({...})
                if name.split("::")[-1] in _CONTROL:
                    return "block", ""
                if before.strip() == name and "::" not in name:
                    return "block", ""  # no return type and unqualified: a macro invocation
                return "function", name
            depth += 1
        elif ch == ")":
            depth -= 1
    return "block", ""


PARSER = "brace-scanner-1"


def scopes(text: bytes | str, cache: Cache | None = None) -> list[Scope]:
    """Function, class and namespace scopes of a C/C++ text, sorted by start; cached by the text's digest."""
    data = text if isinstance(text, bytes) else text.encode()
    key = key_of("scopes", PARSER, sha256_bytes(data))
    if key in _memo:
        return _memo[key]
    out: list[Scope] | None = None
    hit = cache.get(key) if cache is not None else None
    if isinstance(hit, list):
        try:
            out = [Scope(str(k), str(n), int(a), int(b)) for k, n, a, b in hit]
        except (TypeError, ValueError):
            out = None
    if out is None:
        out = list(_scopes(data.decode("utf-8", "replace")))
        if cache is not None:
            cache.put(key, [[sc.kind, sc.name, sc.start, sc.end] for sc in out])
    if len(_memo) > 64:
        _memo.clear()
    _memo[key] = out
    return out


_memo: dict[str, list[Scope]] = {}


@functools.lru_cache(maxsize=64)
def _scopes(text: str) -> tuple[Scope, ...]:
    src = _strip(text)
    out: list[Scope] = []
    stack: list[tuple[str, str, int]] = []
    header_start = 0
    line = 1
    header_line = 1
    header_seen = False  # has the current header a non-space character yet?
    pdepth = 0  # braces and semicolons inside parentheses (lambdas in calls, init lists) are not boundaries
    for i, ch in enumerate(src):
        if ch == "\n":
            line += 1
            continue
        if ch == "(":
            pdepth += 1
        elif ch == ")":
            pdepth = max(0, pdepth - 1)
        if ch in ";}{" and pdepth == 0:
            if ch == "{":
                header = src[header_start:i]
                kind, name = _classify(header)
                if kind == "function" and "::" not in name:
                    owner = [n for k, n, _ in stack if k == "class"]
                    if owner:
                        name = "::".join(owner + [name])
                if kind == "block" and stack and stack[-1][0] == "function":
                    name = stack[-1][1]
                stack.append((kind, name, header_line))
            elif ch == "}" and stack:
                kind, name, start = stack.pop()
                if kind in ("function", "class", "namespace"):
                    out.append(Scope(kind, name, start, line))
            header_start = i + 1
            header_line = line
            header_seen = False
        elif not header_seen and not ch.isspace():
            header_line = line
            header_seen = True
    return tuple(sorted(out, key=lambda s: (s.start, -s.end)))


FILE_SCOPE = "<file scope>"


def site_symbol(text: bytes | str, line: int, cache: Cache | None = None) -> str:
    """The symbol a hook site names: the enclosing function or class, else a definition starting within
    the next three lines (a marker comment placed above a new function), else FILE_SCOPE."""
    sym = enclosing_symbol(text, line, cache)
    if sym is not None:
        return sym
    following = [s for s in scopes(text, cache) if s.kind in ("function", "class") and line < s.start <= line + 3]
    return min(following, key=lambda s: s.start).name if following else FILE_SCOPE


def enclosing_symbol(text: bytes | str, line: int, cache: Cache | None = None) -> str | None:
    """The innermost function (else class) whose braces contain the 1-based line."""
    best: Scope | None = None
    for s in scopes(text, cache):
        if s.kind in ("function", "class") and s.start <= line <= s.end:
            if best is None or (s.kind == "function" and best.kind != "function") or (
                    s.kind == best.kind and s.start >= best.start):
                best = s
    return best.name if best else None


def find_symbol(text: bytes | str, symbol: str, cache: Cache | None = None) -> int | None:
    """1-based line where the named function or class is defined (first definition)."""
    for s in scopes(text, cache):
        if s.name == symbol and s.kind in ("function", "class"):
            return s.start
    return None
