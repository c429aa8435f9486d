"""Enclosing C/C++ symbols by line, from a real parse (tree-sitter with the tree-sitter-cpp grammar).

Hook sites name the function or class a marker sits in. The parse handles what a brace-counting scanner gets
wrong: digit separators (1'000), raw strings, templates, macros before a function head, nested namespaces
and classes. Scopes are cached per file digest; the parser loads only when a file is not in the cache.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from forktool.cache import Cache, key_of, parser_fingerprint
from forktool.tree import sha256_bytes


@dataclass(frozen=True)
class Scope:
    kind: str  # function, class, namespace
    name: str
    start: int  # 1-based line where the definition starts (its template<...> line, if any)
    end: int  # 1-based line of the closing brace


PARSER = "tree-sitter-cpp-2"

_CLASSES = {"class_specifier", "struct_specifier", "union_specifier"}
_NAMESPACES = {"namespace_definition", "linkage_specification"}
# nodes that may hold definitions further down (in a function body, only its own statements are searched)
_CONTAINERS = {"translation_unit", "compound_statement", "declaration_list", "field_declaration_list", "template_declaration",
               "declaration", "field_declaration", "type_definition", "preproc_if", "preproc_ifdef",
               "preproc_else", "preproc_elif", "preproc_elifdef", "ERROR", "access_specifier",
               "friend_declaration", "export_declaration"}
_DECLARATORS = {"pointer_declarator", "reference_declarator", "parenthesized_declarator", "attributed_declarator"}

@functools.cache
def _parser() -> Any:
    """The C++ parser, made on first use (tree-sitter loads only when a scope or a declaration is asked for)."""
    import tree_sitter_cpp
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_cpp.language()))


def _parse(data: bytes) -> Any:
    return _parser().parse(_unwrap_macros(data))


# macros a parser cannot see through, blanked before parsing (same length, so lines and columns stay):
# export/attribute macros (LLAMA_API, GGML_API, or defined in the file as empty or as an attribute), and
# wrappers defined in the file as `#define NAME(decl, ...) ... decl ...`, whose uses keep only `decl`
_API_RE = re.compile(rb"\b[A-Z][A-Z0-9_]*_API\b")
_DEFINE_RE = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(\(([^)]*)\))?[ \t]*(.*)$", re.M)
_ATTRIBUTE_BODY = re.compile(rb"^(__attribute__|__declspec|\[\[|$)")


def _unwrap_macros(data: bytes) -> bytes:
    attrs: set[bytes] = set()
    wrappers: set[bytes] = set()
    for m in _DEFINE_RE.finditer(data):
        name, params, body = m.group(1), m.group(3), m.group(4).strip()
        if params is None:
            if _ATTRIBUTE_BODY.match(body):
                attrs.add(name)
        else:
            first = params.split(b",")[0].strip()
            if first and re.search(rb"\b" + re.escape(first) + rb"\b", body):
                wrappers.add(name)
    out = bytearray(data)

    def blank(a: int, b: int) -> None:
        out[a:b] = bytes(c if c == 0x0A else 0x20 for c in out[a:b])

    for m in _API_RE.finditer(data):
        blank(m.start(), m.end())
    if attrs:
        for m in re.finditer(rb"\b(" + b"|".join(re.escape(a) for a in sorted(attrs)) + rb")\b", data):
            if not _in_directive(data, m.start()):
                blank(m.start(), m.end())
    if wrappers:
        for m in re.finditer(rb"\b(" + b"|".join(re.escape(w) for w in sorted(wrappers)) + rb")\s*\(", data):
            if _in_directive(data, m.start()):
                continue
            comma, close = _first_argument(data, m.end())
            if close is None:
                continue
            blank(m.start(), m.end())  # NAME(
            blank(comma, close + 1)  # , rest)
    return bytes(out)


def _in_directive(data: bytes, at: int) -> bool:
    line = data[data.rfind(b"\n", 0, at) + 1:at]
    return line.lstrip().startswith(b"#")


def _first_argument(data: bytes, i: int) -> tuple[int, int | None]:
    """(end of the first argument, position of the closing parenthesis) of a call whose '(' ends before i."""
    depth, comma, n = 0, -1, len(data)
    while i < n:
        c = data[i]
        if c in b"\"'":
            j = i + 1
            while j < n and data[j] != c:
                j += 2 if data[j] == 0x5C else 1
            i = j + 1
            continue
        if c in b"([{":
            depth += 1
        elif c in b")]}":
            if depth == 0:
                return (comma if comma >= 0 else i), i
            depth -= 1
        elif c == 0x2C and depth == 0 and comma < 0:
            comma = i
        i += 1
    return comma, None


def _text(node: Any) -> str:
    return re.sub(r"\s+", "", node.text.decode("utf-8", "replace"))


def _start(node: Any) -> int:
    while node.parent is not None and node.parent.type == "template_declaration":
        node = node.parent
    return int(node.start_point.row) + 1


def _function_name(fn: Any) -> str | None:
    d = fn.child_by_field_name("declarator")
    while d is not None and d.type in _DECLARATORS:
        d = d.child_by_field_name("declarator") or next((c for c in d.named_children if c.type != "attribute"), None)
    if d is None or d.type != "function_declarator":
        return None
    name = d.child_by_field_name("declarator")
    return _text(name) if name is not None else None


def _walk(root: Any) -> list[Scope]:
    out: list[Scope] = []
    stack: list[tuple[Any, tuple[str, ...]]] = [(root, ())]
    while stack:
        node, owners = stack.pop()
        for child in node.named_children:
            t = child.type
            if t == "function_definition":
                name = _function_name(child)
                if name is None:
                    continue
                if "::" not in name:
                    if owners:
                        name = "::".join((*owners, name))
                    elif child.child_by_field_name("type") is None:
                        continue  # no return type, unqualified, outside a class: a macro invocation with a block
                out.append(Scope("function", name, _start(child), int(child.end_point.row) + 1))
                body = child.child_by_field_name("body")
                if body is not None:
                    stack.append((body, owners))  # classes local to the function
            elif t in _CLASSES:
                body = child.child_by_field_name("body")
                nm = child.child_by_field_name("name")
                if body is None:
                    continue
                name = _text(nm) if nm is not None else ""
                if name:
                    out.append(Scope("class", name, _start(child), int(child.end_point.row) + 1))
                stack.append((body, (*owners, name) if name else owners))
            elif t in _NAMESPACES:
                body = child.child_by_field_name("body")
                nm = child.child_by_field_name("name")
                out.append(Scope("namespace", _text(nm) if nm is not None else "", _start(child),
                                 int(child.end_point.row) + 1))
                if body is not None:
                    stack.append((body, owners))
            elif t in _CONTAINERS:
                stack.append((child, owners))
    return sorted(out, key=lambda s: (s.start, -s.end))


def scopes(text: bytes | str, cache: Cache | None = None) -> list[Scope]:
    """Function, class and namespace scopes of a C/C++ text, sorted by start; cached by the text's digest."""
    data = text if isinstance(text, bytes) else text.encode()
    return _scopes(_scopes_key(data), data, cache)


@functools.lru_cache(maxsize=64)
def _scopes_key(data: bytes) -> str:
    # a check asks about many lines of one text: hash it once
    return key_of("scopes", PARSER, parser_fingerprint(), sha256_bytes(data))


@functools.lru_cache(maxsize=64)
def _scopes(key: str, data: bytes, cache: Cache | None) -> list[Scope]:
    """scopes() of data (whose key this is), from the disk cache or parsed."""
    hit = cache.get(key) if cache is not None else None
    if isinstance(hit, list):
        try:
            return [Scope(str(k), str(n), int(a), int(b)) for k, n, a, b in hit]
        except (TypeError, ValueError):
            pass
    out = _walk(_parse(data).root_node)
    if cache is not None:
        cache.put(key, [[sc.kind, sc.name, sc.start, sc.end] for sc in out])
    return out


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


# ---------------------------------------------------------------- declarations (what upstream API drift compares)


@dataclass(frozen=True)
class Decl:
    """One upstream declaration a patch may use, in a form that compares across versions: whitespace and
    comments dropped, parameter names left out of signatures."""

    kind: str  # struct, union, class, enum, function, macro, typedef
    name: str
    text: str  # the normalised declaration (a function: its signature; a macro: its definition)
    members: tuple[tuple[str, str], ...] = ()  # (member name, normalised member declaration), in order
    line: int = 0


_RECORDS = {"struct_specifier": "struct", "union_specifier": "union", "class_specifier": "class",
            "enum_specifier": "enum"}
_DECL_CONTAINERS = {"translation_unit", "declaration_list", "linkage_specification", "namespace_definition",
                    "preproc_if", "preproc_ifdef", "preproc_else", "preproc_elif", "preproc_elifdef",
                    "template_declaration", "declaration", "type_definition", "field_declaration", "ERROR",
                    "export_declaration"}


Comments = list[tuple[int, int]]  # the comment byte ranges of one parsed text, sorted


@functools.cache
def _comment_query() -> Any:
    from tree_sitter import Query

    return Query(_parser().language, "(comment) @c")


def _comment_ranges(root: Any) -> Comments:
    from tree_sitter import QueryCursor

    found = QueryCursor(_comment_query()).captures(root).get("c", [])
    return sorted((c.start_byte, c.end_byte) for c in found)


def _norm(node: Any, comments: Comments, drop: list[Any] | None = None) -> str:
    """node's text with comments (the ranges of its parse) and the nodes in drop removed, and whitespace collapsed
    to single spaces."""
    import bisect

    src = node.text
    lo = bisect.bisect_left(comments, (node.start_byte, -1))
    hi = bisect.bisect_left(comments, (node.end_byte, -1))
    cut = sorted([c for c in comments[lo:hi] if c[1] <= node.end_byte]
                 + [(d.start_byte, d.end_byte) for d in drop or []])
    out, at = [], node.start_byte
    for a, b in cut:
        if a >= at:
            out.append(src[at - node.start_byte:a - node.start_byte])
            at = b
    out.append(src[at - node.start_byte:])
    return " ".join(b" ".join(out).decode("utf-8", "replace").split())


def _descendants(node: Any) -> list[Any]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children)
    return out


def _signature(node: Any, fn_decl: Any, comments: Comments) -> str:
    """A function's declaration without its body and without its parameter names."""
    drop = []
    params = fn_decl.child_by_field_name("parameters")
    for p in params.named_children if params is not None else []:
        d = p.child_by_field_name("declarator")
        while d is not None and d.type != "identifier":
            d = d.child_by_field_name("declarator") or next((c for c in d.named_children if c.type == "identifier"),
                                                            None)
        if d is not None:
            drop.append(d)
    body = node.child_by_field_name("body")
    if body is not None:
        drop.append(body)
    return _norm(node, comments, drop).rstrip(" ;")


def _function_declarator(node: Any) -> Any:
    d = node.child_by_field_name("declarator")
    while d is not None and d.type in _DECLARATORS:
        d = d.child_by_field_name("declarator") or next((c for c in d.named_children if c.type != "attribute"), None)
    return d if d is not None and d.type == "function_declarator" else None


def _member_names(field: Any) -> list[str]:
    """The names a field declaration declares (field identifiers outside its type and parameter lists)."""
    names = []
    stack = [c for c in field.children if c != field.child_by_field_name("type")]
    while stack:
        n = stack.pop(0)
        if n.type == "field_identifier":
            names.append(n.text.decode("utf-8", "replace"))
        elif n.type not in ("parameter_list", "field_declaration_list", "initializer_list", "bitfield_clause",
                            "default_value"):
            stack[0:0] = list(n.children)
    return names


def _record(node: Any, kind: str, name: str, comments: Comments) -> Decl:
    body = node.child_by_field_name("body")
    members: list[tuple[str, str]] = []
    for c in body.named_children if body is not None else []:
        if c.type == "field_declaration":
            for m in _member_names(c) or [_norm(c, comments)]:
                members.append((m, _norm(c, comments)))
        elif c.type == "enumerator":
            nm = c.child_by_field_name("name")
            text = _norm(c, comments)
            members.append((nm.text.decode("utf-8", "replace") if nm is not None else text, text))
        elif c.type in ("function_definition", "declaration") and _function_declarator(c) is not None:
            fname = _function_declarator(c).child_by_field_name("declarator")
            members.append((_norm(fname if fname is not None else c, comments),
                            _signature(c, _function_declarator(c), comments)))
    return Decl(kind, name, _norm(node, comments), tuple(members), int(node.start_point.row) + 1)


def declarations(text: bytes | str, cache: Cache | None = None) -> dict[str, Decl]:
    """The named top-level declarations of a C/C++ text (inside namespaces, extern "C" and #if blocks too):
    structs, unions, classes and enums with a body, functions (declared or defined), macros, typedefs. The
    first declaration of a name wins, except that a record's body beats a bare mention. Cached by the text's
    digest and the parser's."""
    data = text if isinstance(text, bytes) else text.encode()
    return _declarations_of(key_of("declarations", PARSER, parser_fingerprint(), sha256_bytes(data)), data, cache)


@functools.lru_cache(maxsize=256)
def _declarations_of(key: str, data: bytes, cache: Cache | None) -> dict[str, Decl]:
    hit = cache.get(key) if cache is not None else None
    if isinstance(hit, list):
        try:
            return {str(n): Decl(str(k), str(n), str(t), tuple((str(a), str(b)) for a, b in m), int(ln))
                    for k, n, t, m, ln in hit}
        except (TypeError, ValueError):
            pass
    out = _declarations(data)
    if cache is not None:
        cache.put(key, [[d.kind, d.name, d.text, [list(m) for m in d.members], d.line] for d in out.values()])
    return out


def _declarations(data: bytes) -> dict[str, Decl]:
    out: dict[str, Decl] = {}

    def add(d: Decl) -> None:
        if d.name and (d.name not in out or (d.members and not out[d.name].members)):
            out[d.name] = d

    root = _parse(data).root_node
    comments = _comment_ranges(root)
    stack = [root]
    while stack:
        node = stack.pop()
        for child in reversed(node.named_children):
            t = child.type
            if t in _RECORDS:
                nm = child.child_by_field_name("name")
                if child.child_by_field_name("body") is not None and nm is not None:
                    add(_record(child, _RECORDS[t], _norm(nm, comments), comments))
            elif t in ("function_definition", "declaration", "field_declaration") and \
                    (fd := _function_declarator(child)) is not None and node.type != "field_declaration_list":
                nm = fd.child_by_field_name("declarator")
                if nm is not None:
                    add(Decl("function", _norm(nm, comments), _signature(child, fd, comments), (),
                             int(child.start_point.row) + 1))
                continue
            elif t in ("preproc_def", "preproc_function_def"):
                nm = child.child_by_field_name("name")
                if nm is not None:
                    add(Decl("macro", _norm(nm, comments), _norm(child, comments), (), int(child.start_point.row) + 1))
                continue
            elif t == "type_definition":
                for d in child.children_by_field_name("declarator"):
                    ids = [n for n in _descendants(d) if n.type == "type_identifier"]
                    if ids:
                        add(Decl("typedef", _norm(ids[0], comments), _norm(child, comments), (), int(child.start_point.row) + 1))
            if t in _DECL_CONTAINERS or t in _RECORDS:
                stack.append(child)
    return out


