"""The registry kept by the tool: derived keys brought up to date, written in place with comments and quoting kept."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from forktool import registry as rg
from forktool.errors import ForktoolError
from forktool.project import Project
from forktool.series import Patch
from forktool.tree import atomic_write

if TYPE_CHECKING:
    from typing import Any

    from forktool.cache import Cache

# what a person decides; everything else in an entry is derived from the series and the tree
HUMAN_KEYS = ("title", "bug", "status", "shipped", "description", "gates")


# ---------------------------------------------------------------- the writer


def _dump(data: object) -> list[str]:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def digits_quoted(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        # a patch id such as 0090 reads back as a string here, but as a number to a YAML 1.2 reader
        style = "'" if value.isdigit() else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, digits_quoted)
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, width=110, allow_unicode=True).rstrip("\n").split("\n")


def _last_line(node: object) -> int:
    """0-based line of the last character a node's text takes (trailing comments and blank lines excluded)."""
    import yaml

    if isinstance(node, yaml.ScalarNode):
        end = node.end_mark
        # a block scalar (| or >) ends at column 0 of the line after its text
        return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line
    if isinstance(node, yaml.SequenceNode):
        return _last_line(node.value[-1]) if node.value and not node.flow_style else node.end_mark.line
    assert isinstance(node, yaml.MappingNode)
    return _last_line(node.value[-1][1]) if node.value and not node.flow_style else node.end_mark.line


def _pairs(node: Any) -> dict[str, tuple[Any, Any]]:
    return {k.value: (k, v) for k, v in node.value}  # type: ignore[attr-defined]


class _Edits:
    """Line edits on one text, applied from the bottom so earlier line numbers stay valid."""

    def __init__(self, text: str):
        self.lines = text.split("\n")
        self.edits: list[tuple[int, int, list[str]]] = []  # (first, last inclusive, replacement); last < first: insert

    def replace_key(self, key: object, value: object, new_value: object) -> None:
        """`key: value` (from the key's line to the value's last) written again as `key: new_value`."""
        first = key.start_mark.line  # type: ignore[attr-defined]
        col = key.start_mark.column  # type: ignore[attr-defined]
        self._block(first, _last_line(value), col, _dump({key.value: new_value}))  # type: ignore[attr-defined]

    def remove(self, first: int, last: int) -> None:
        self.edits.append((first, last, []))

    def insert_after(self, line: int, col: int, data: object) -> None:
        self.edits.append((line + 1, line, [" " * col + d for d in _dump(data)]))

    def _block(self, first: int, last: int, col: int, dumped: list[str]) -> None:
        prefix = self.lines[first][:col]  # spaces, or the '- ' of the item this key opens
        self.edits.append((first, last, [prefix + dumped[0]] + [" " * col + d for d in dumped[1:]]))

    def text(self) -> str:
        out = list(self.lines)
        # from the bottom; of two inserts at one place the later-made goes in first, so it ends up below
        order = sorted(range(len(self.edits)), key=lambda i: (self.edits[i][0], self.edits[i][1], i), reverse=True)
        for i in order:
            first, last, repl = self.edits[i]
            out[first:last + 1] = repl
        return "\n".join(out)


def update_text(text: str, want: rg.Registry, where: str = "registry/UPSTREAM_SYNC.yaml") -> str:
    """The registry text changed to hold `want`: only the values that differ are written again (a patch's or a
    hook's changed keys, entries added after the last one of their list, removed entries' lines dropped), so
    every comment, quoting style and line elsewhere stays as it was. Checked by reading the result back."""
    import yaml

    if not text.strip():
        return rg.dump(want)
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    have = rg.from_data(yaml.safe_load(text), Path(where))
    top = _pairs(root)
    ed = _Edits(text)
    want_patches = {p.id: p for p in want.patches}
    have_patches = {p.id: p for p in have.patches}
    pk, pv = top["patches"]
    items = {_pairs(item)["id"][1].value: item for item in pv.value}
    if pv.flow_style or not pv.value or not want.patches:  # an emptied list is written as []
        if [rg.patch_data(p) for p in want.patches] != [rg.patch_data(p) for p in have.patches]:
            ed.replace_key(pk, pv, [rg.patch_data(p) for p in want.patches])
    else:
        first = pv.value[0].start_mark
        col = len(ed.lines[first.line][:first.column].rstrip()) - 1  # the column of the item's '-'
        anchor = pv.value[0].start_mark.line - 1  # a new entry goes after the entry before it in `want`
        for pid, p in want_patches.items():
            old = have_patches.get(pid)
            if old is None:
                ed.insert_after(anchor, col, [rg.patch_data(p)])
                continue
            anchor = _last_line(items[pid])
            new_data, old_data = rg.patch_data(p), rg.patch_data(old)
            pairs = _pairs(items[pid])
            for k in new_data:
                if new_data[k] != old_data.get(k):
                    if k not in pairs:
                        raise ForktoolError(f"cannot add key {k!r} to patch {pid} in place", where=where,
                                            hint=f"add `{k}:` to that entry by hand (any value) and run the "
                                                 "command again")
                    ed.replace_key(*pairs[k], new_data[k])
            for k in set(old_data) - set(new_data):
                key, value = pairs[k]
                ed.remove(key.start_mark.line, _last_line(value))
        for pid in have_patches.keys() - want_patches.keys():
            ed.remove(items[pid].start_mark.line, _last_line(items[pid]))
    hk, hv = top["hooks"]
    if hv.flow_style or not hv.value or not want.hooks:  # an emptied mapping is written as {}
        if {h.id: rg.hook_data(h) for h in want.hooks.values()} != {h.id: rg.hook_data(h) for h in have.hooks.values()}:
            ed.replace_key(hk, hv, {h.id: rg.hook_data(h) for h in want.hooks.values()})
    else:
        hooks = _pairs(hv)
        col = hv.value[0][0].start_mark.column
        last = _last_line(hv)
        for hid, h in want.hooks.items():
            old_h = have.hooks.get(hid)
            if old_h is None:
                ed.insert_after(last, col, {hid: rg.hook_data(h)})
                continue
            new_data, old_data = rg.hook_data(h), rg.hook_data(old_h)
            pairs = _pairs(hooks[hid][1])
            for k in new_data:
                if new_data[k] != old_data.get(k):
                    if k not in pairs:
                        raise ForktoolError(f"cannot add key {k!r} to hook {hid} in place", where=where,
                                            hint=f"add `{k}:` to that entry by hand (any value) and run the "
                                                 "command again")
                    ed.replace_key(*pairs[k], new_data[k])
        for hid in have.hooks.keys() - want.hooks.keys():
            key, value = hooks[hid]
            ed.remove(key.start_mark.line, _last_line(value))
    out = ed.text()
    again = rg.from_data(yaml.safe_load(out), Path(where))
    if rg.dump(again) != rg.dump(want):
        raise ForktoolError("editing the registry in place did not give the intended entries", where=where,
                            hint="this is a bug in forktool; the registry was not written")
    return out


def write(path: Path, want: rg.Registry) -> bool:
    """Write `want` into the registry file in place (and its rendered UPSTREAM_SYNC.md); False when nothing
    changed."""
    files = planned(path, want)
    for target, data in files:
        atomic_write(target, data)
    return bool(files)


def planned(path: Path, want: rg.Registry) -> list[tuple[Path, bytes]]:
    """The files `write` would write for `want` (the registry and its rendered UPSTREAM_SYNC.md), with their bytes;
    empty when both already hold them."""
    from forktool.regcheck import render_md

    text = path.read_text(encoding="utf-8")
    new = update_text(text, want, str(path))
    md = path.with_suffix(".md")
    md_text = render_md(want)
    if new == text and md.is_file() and md.read_text(encoding="utf-8") == md_text:
        return []
    return [(path, new.encode()), (md, md_text.encode())]


# ---------------------------------------------------------------- what the tool keeps


def new_entry(patch: Patch) -> rg.PatchEntry:
    """The entry `forktool new` registers: the person's title, status dev, nothing derived yet."""
    return rg.PatchEntry(patch.id, patch.name, patch.title, "", "dev", "", (), (), (), ())


def held_sites(final: dict[str, bytes | None], rels: Iterable[str], cache: Cache | None = None,
               ) -> dict[str, dict[tuple[str, str], int]]:
    """hook -> (file, symbol) -> advisory line, for the markers in the files rels of `final`: the symbol's
    definition line, or the marker's own line at file scope."""
    from forktool import symbols
    from forktool.markers import scan_file

    held: dict[str, dict[tuple[str, str], int]] = {}
    for rel in sorted(rels):
        data = final.get(rel)
        for m in scan_file(rel, data or b""):
            sym = symbols.site_symbol(data or b"", m.line, cache)
            line = m.line if sym == symbols.FILE_SCOPE else (symbols.find_symbol(data or b"", sym, cache) or m.line)
            held.setdefault(m.hook, {}).setdefault((rel, sym), line)
    return held


def place_sites(old: tuple[rg.Site, ...], here: dict[tuple[str, str], int], rels: set[str]) -> tuple[rg.Site, ...]:
    """old's sites with those in rels where the markers now stand: found ones keep their place with the line
    of now, gone ones go, new ones go before the first site of their file further down (else after its last).
    The one site placer: the registry the tool keeps and the sync's relocation (sync/relocate.py) both use it."""
    sites = [s if s.file not in rels else dataclasses.replace(s, line=here[(s.file, s.symbol)])
             for s in old if s.file not in rels or (s.file, s.symbol) in here]
    known = {(s.file, s.symbol) for s in sites}
    for (f, sym), line in sorted(here.items()):
        if (f, sym) in known:
            continue
        same = [i for i, x in enumerate(sites) if x.file == f]
        later = [i for i in same if (x := sites[i].line) is not None and x > line]
        at = later[0] if later else (same[-1] + 1 if same else len(sites))
        sites.insert(at, rg.Site(f, sym, line))
    return tuple(sites)


def kept(project: Project, reg: rg.Registry, patches: list[Patch], final: dict[str, bytes | None],
         only: Iterable[str] | None = None, rels: Iterable[str] | None = None, cache: Cache | None = None,
         ) -> rg.Registry:
    """reg with what the tool derives brought up to date: for each patch of `patches` (the series in order, or
    those named by `only`) its entry (registered when missing, after the entry of the patch before it), files,
    build impact and hook list (the hooks its markers name, in the entry's order, new ones last); for every hook
    with markers in `rels` (default: the files those patches touch) of `final` (the series applied), its sites
    and advisory lines. Hooks a patch no longer marks lose their entry unless a person described them (the
    registry check then names them). What a person decides (HUMAN_KEYS, hook names) is never changed."""
    from forktool.impact import impacts_for
    from forktool.markers import hooks_in_patch

    chosen = [p for p in patches if only is None or p.id in set(only)]
    files = set(rels) if rels is not None else {f for p in chosen for f in p.paths}
    entries = {e.id: e for e in reg.patches}
    order = [e.id for e in reg.patches]
    owner: dict[str, str] = {}
    for p in patches:
        for h in hooks_in_patch(p):
            owner.setdefault(h, p.id)
    chosen_ids = {p.id for p in chosen}
    for k, p in enumerate(patches):
        if p.id not in chosen_ids:
            continue
        e = entries.get(p.id) or new_entry(p)
        marked = hooks_in_patch(p)
        hooks = tuple(h for h in e.hooks if h in marked) + tuple(h for h in marked if h not in e.hooks)
        entries[p.id] = dataclasses.replace(e, file=p.name, files=tuple(p.paths),
                                            build_impact=tuple(impacts_for(project, p.paths)), hooks=hooks)
        if p.id not in order:
            before = [q.id for q in patches[:k] if q.id in order]
            order.insert(order.index(before[-1]) + 1 if before else 0, p.id)
    out = rg.Registry(reg.path, [entries[i] for i in order], dict(reg.hooks))
    held = held_sites(final, files, cache)
    for hid, here in held.items():
        hook = out.hooks.get(hid)
        if hook is None:
            if hid in owner:
                out.hooks[hid] = rg.Hook(hid, owner[hid], "", place_sites((), here, files))
            continue
        out.hooks[hid] = dataclasses.replace(hook, sites=place_sites(hook.sites, here, files))
    marked_now = {h for p in patches for h in hooks_in_patch(p)}
    for hid, hook in list(out.hooks.items()):
        if hid in held or hid in marked_now or hook.description:
            continue
        if hook.patch in chosen_ids:
            del out.hooks[hid]
    for hid, hook in list(out.hooks.items()):
        if hid not in held and any(s.file in files for s in hook.sites) and hid in marked_now:
            # markers of this hook left the files just looked at: their sites there go
            out.hooks[hid] = dataclasses.replace(hook, sites=tuple(s for s in hook.sites if s.file not in files)
                                                 or hook.sites)
    return out


def keep(project: Project, patches: list[Patch], final: dict[str, bytes | None], only: Iterable[str] | None = None,
         rels: Iterable[str] | None = None, cache: Cache | None = None) -> str:
    """Bring the registry file up to date (see `kept`) and write it in place: 'updated', 'unchanged', or why it
    was not (no registry, or one that does not load: the registry check names that)."""
    said, files = keep_planned(project, patches, final, only, rels, cache)
    for target, data in files:
        atomic_write(target, data)
    return said


def keep_planned(project: Project, patches: list[Patch], final: dict[str, bytes | None],
                 only: Iterable[str] | None = None, rels: Iterable[str] | None = None, cache: Cache | None = None,
                 ) -> tuple[str, list[tuple[Path, bytes]]]:
    """What `keep` would say and the files it would write, written by the caller (in one journal with its own)."""
    path = project.registry_dir / "UPSTREAM_SYNC.yaml"
    if not path.is_file():
        return "no registry", []
    try:
        reg = rg.load(path)
    except ForktoolError as e:
        return f"not updated: it does not load ({e.what})", []
    files = planned(path, kept(project, reg, patches, final, only, rels, cache))
    return ("updated" if files else "unchanged"), files
