"""API drift: the upstream declarations a patch's added lines use whose declaration changed between two upstreams."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from forktool.cache import Cache
from forktool.series import Patch
from forktool.symbols import Decl, declarations

SOURCE_EXTS = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".cu", ".cuh", ".inc")
# how far #include is followed from a file the patch touches: far enough for a backend's impl headers
INCLUDE_DEPTH = 3
_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMENT_RE = re.compile(r"//.*$|/\*.*?\*/")
_STRING_RE = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')
# a name the standard library qualifies (std::string, std::vector<T>::size_type): never upstream's own
# declaration, even where upstream declares a type of the same last name (llama.cpp's jinja `struct string`)
_STD_RE = re.compile(r"(?<![A-Za-z0-9_:])(?:::\s*)?std\s*::\s*(?:[A-Za-z_][A-Za-z0-9_]*\s*::\s*)*[A-Za-z_][A-Za-z0-9_]*")
KEYWORDS = frozenset("""alignas alignof auto bool break case catch char char16_t char32_t char8_t class const
constexpr consteval constinit const_cast continue decltype default delete do double dynamic_cast else enum
explicit export extern false float for friend goto if inline int long mutable namespace new noexcept nullptr
operator private protected public register reinterpret_cast return short signed sizeof static static_assert
static_cast struct switch template this thread_local throw true try typedef typeid typename union unsigned
using virtual void volatile wchar_t while define include ifdef ifndef endif elif pragma once defined
size_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t std""".split())


@dataclass(frozen=True)
class Upstream:
    """One upstream tree as the trial sees it: its file list and a reader of its files."""

    paths: frozenset[str]
    read: Callable[[str], bytes | None]


@dataclass
class ApiDrift:
    """One upstream name a patch uses whose declaration changed."""

    patch: str
    name: str
    kind: str  # struct, union, class, enum, function, macro, typedef, member
    change: str  # changed, removed
    detail: str  # what changed, in words
    old_file: str
    new_file: str | None
    added: list[str] = field(default_factory=list)  # members added (records)
    removed: list[str] = field(default_factory=list)  # members removed (records)
    changed: list[str] = field(default_factory=list)  # members whose declaration changed (records)
    old: str = ""  # the declarations compared (signatures, definitions); empty for records
    new: str = ""

    @property
    def line(self) -> str:
        return f"{self.patch} uses `{self.name}`: {self.detail}"

    def to_json(self) -> dict:
        return {"patch": self.patch, "name": self.name, "kind": self.kind, "change": self.change,
                "detail": self.detail, "old_file": self.old_file, "new_file": self.new_file, "added": self.added,
                "removed": self.removed, "changed": self.changed, "old": self.old, "new": self.new,
                "line": self.line}


def used_names(patch: Patch) -> set[str]:
    """The identifiers in the C/C++ lines a patch adds, comments, string literals and std::-qualified names left
    out."""
    out: set[str] = set()
    for fd in patch.files:
        if not fd.path.endswith(SOURCE_EXTS):
            continue
        for h in fd.hunks:
            for op, t in h.lines:
                if op != b"+":
                    continue
                line = _STD_RE.sub(" ", _STRING_RE.sub(" ", _COMMENT_RE.sub(" ", t.decode("utf-8", "replace"))))
                out.update(n for n in _IDENT_RE.findall(line) if n not in KEYWORDS)
    return out


def _include_index(paths: Iterable[str]) -> dict[str, list[str]]:
    """basename -> the source files of that name (an #include is resolved by its last components)."""
    idx: dict[str, list[str]] = {}
    for p in paths:
        if p.endswith(SOURCE_EXTS):
            idx.setdefault(p.rsplit("/", 1)[-1], []).append(p)
    return idx


def closure(up: Upstream, start: Iterable[str], depth: int = INCLUDE_DEPTH) -> list[str]:
    """start's files and what they #include (to depth), in breadth-first order; an include names the file whose
    path ends with it (the nearest to the includer when several do)."""
    idx = _include_index(up.paths)
    seen: list[str] = []
    frontier = [p for p in start if p in up.paths and p.endswith(SOURCE_EXTS)]
    for _ in range(depth + 1):
        nxt = []
        for rel in frontier:
            if rel in seen:
                continue
            seen.append(rel)
            data = up.read(rel) or b""
            here = rel.rsplit("/", 1)[0] if "/" in rel else ""
            for m in _INCLUDE_RE.finditer(data):
                inc = m.group(1).decode("utf-8", "replace")
                beside = posixpath.normpath(posixpath.join(here, inc))
                if beside in up.paths:
                    nxt.append(beside)
                    continue
                tail = "/".join(x for x in inc.split("/") if x not in ("..", "."))
                cands = [c for c in idx.get(inc.rsplit("/", 1)[-1], []) if c == tail or c.endswith("/" + tail)]
                if cands:
                    nxt.append(max(cands, key=lambda c: (len(_common(c, here)), -len(c))))
        frontier = nxt
    return seen


def _common(a: str, b: str) -> list[str]:
    out = []
    for x, y in zip(a.split("/"), b.split("/"), strict=False):
        if x != y:
            break
        out.append(x)
    return out


def _decls(up: Upstream, files: list[str], cache: Cache | None) -> dict[str, tuple[Decl, str]]:
    out: dict[str, tuple[Decl, str]] = {}
    for rel in files:
        data = up.read(rel)
        if data is None:
            continue
        for name, d in declarations(data, cache).items():
            if name not in out or (d.members and not out[name][0].members):
                out[name] = (d, rel)
    return out


def _find_elsewhere(up: Upstream, name: str, cache: Cache | None) -> tuple[Decl, str] | None:
    """name's declaration anywhere in the tree (only files that mention it are parsed)."""
    needle = name.encode()
    for rel in sorted(up.paths):
        if not rel.endswith(SOURCE_EXTS):
            continue
        data = up.read(rel)
        if data is None or needle not in data:
            continue
        d = declarations(data, cache).get(name)
        if d is not None:
            return d, rel
    return None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _members(d: Decl) -> dict[str, tuple[str, ...]]:
    """member name -> its declarations (overloads have several)."""
    out: dict[str, tuple[str, ...]] = {}
    for m, t in d.members:
        out[m] = (*out.get(m, ()), t)
    return out


def _record_change(d_old: Decl, d_new: Decl, names: set[str]) -> tuple[list[str], list[str], list[str], str]:
    old_m, new_m = _members(d_old), _members(d_new)
    added = [m for m in new_m if m not in old_m]
    removed = [m for m in old_m if m not in new_m]
    changed = [m for m in new_m if m in old_m and old_m[m] != new_m[m]]
    words = []
    if added:
        words.append(f"upstream added {_plural(len(added), 'member')} ({', '.join(added)})")
    if removed:
        words.append(f"removed {_plural(len(removed), 'member')} ({', '.join(removed)})")
    if changed:
        words.append(f"changed {', '.join(changed)}")
    kept_old = [m for m, _ in d_old.members if m in new_m]
    kept_new = [m for m, _ in d_new.members if m in old_m]
    if not words and kept_old != kept_new:
        words.append("upstream reordered its members")
    if not words:
        words.append("upstream changed its declaration")
    elif not words[0].startswith("upstream"):
        words[0] = "upstream " + words[0]
    named = [m for m in removed + changed if m in names]
    if named:
        words.append(f"the patch's lines name {', '.join(named)}")
    return added, removed, changed, "; ".join(words)


def api_drift(old: Upstream, new: Upstream, patch: Patch, cache: Cache | None = None) -> list[ApiDrift]:
    """Each upstream declaration (type, struct member, function, macro) that the patch's added lines name and
    that differs between old and new: looked up in the files the patch touches and what they include, on each
    side (a name gone from the new side's files is looked for in the whole new tree before it is called
    removed). Names the patch declares itself are upstream only where old already declared them."""
    names = used_names(patch)
    if not names:
        return []
    touched = [fd.path for fd in patch.files]
    old_files = closure(old, touched)
    new_files = closure(new, [p for p in old_files if p in new.paths] + touched)
    d_old, d_new = _decls(old, old_files, cache), _decls(new, new_files, cache)
    out: list[ApiDrift] = []
    for name in sorted(names & d_old.keys()):
        (a, a_file) = d_old[name]
        hit = d_new.get(name) or _find_elsewhere(new, name, cache)
        if hit is None:
            out.append(ApiDrift(patch.id, name, a.kind, "removed", f"upstream removed this {a.kind} "
                                f"(declared in {a_file} before)", a_file, None, old=a.text))
            continue
        b, b_file = hit
        moved = "" if b_file == a_file else f" (now declared in {b_file})"
        if a.kind in ("struct", "union", "class", "enum") and b.kind == a.kind:
            if a.members == b.members:
                continue
            added, removed, changed, words = _record_change(a, b, names)
            out.append(ApiDrift(patch.id, name, a.kind, "changed", words + moved, a_file, b_file, added, removed,
                                changed))
        elif a.text != b.text:
            what = {"function": "its signature", "macro": "its definition"}.get(a.kind, "its declaration")
            out.append(ApiDrift(patch.id, name, a.kind, "changed", f"upstream changed {what}: `{a.text}` -> "
                                f"`{b.text}`{moved}", a_file, b_file, old=a.text, new=b.text))
    # a member the added lines name that a record in these files lost or changed (x->member, .member = ...)
    reported = {d.name for d in out}
    for rname, (a, a_file) in sorted(d_old.items()):
        if not a.members or rname in reported or rname not in d_new:
            continue
        b, b_file = d_new[rname]
        old_m, new_m = _members(a), _members(b)
        for m, t in old_m.items():
            if m in names and m not in d_old and new_m.get(m) != t:
                gone = m not in new_m
                was, now = " / ".join(t), " / ".join(new_m.get(m, ()))
                out.append(ApiDrift(patch.id, f"{rname}::{m}", "member", "removed" if gone else "changed",
                                    f"upstream {'removed' if gone else 'changed'} this member of {a.kind} {rname}"
                                    + ("" if gone else f": `{was}` -> `{now}`"), a_file, b_file, old=was, new=now))
    return out
