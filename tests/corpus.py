"""The bad-input corpus: hundreds of hostile inputs generated at run time, each run through the real CLI.

Every case starts from a fresh copy of a small template project (a real git upstream, a three-patch
series applied, a registry, a backup) or from a crafted sdist, spoils one thing, runs one command
in-process and records what happened. The signals and output families run `python -m forktool` as a process
instead: a real SIGINT at a named moment, or stdout/stderr closed, full or a closed pipe. `python -m
tests.corpus` prints the cases by family and outcome; tests/test_corpus.py asserts that every case is a clean
refusal (or, for those two families, keeps the exit-code contract of docs/manual-cli.md).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import marshal
import os
import shutil
import signal
import stat
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.cli import run_cli
from tests.helpers.patches import make_patch
from tests.helpers.project import REPO, UPSTREAM, bare_project, make_project
from tests.helpers.pypi import sdist_pin
from tests.helpers.series import SERIES, three_patches

TIME_LIMIT = 10.0  # seconds; a case still running then counts as a hang

BUILD_YAML = ("artifacts:\n  - name: lib\n    impact: host\n    paths: ['up/src', 'up/include']\n    targets: [lib]\n"
              "    outputs: [bin/lib.so]\n  - name: tools\n    impact: host\n    paths: ['up/tools']\n"
              "links:\n  tools: [lib]\nstamped: [lib]\n"
              "profiles:\n  cpu:\n    flags: ['-DX=1']\n    targets: [lib]\n"
              "  cuda:\n    inherits: cpu\n    flags: ['-DGGML_CUDA=ON']\n    cuda_architectures: '90'\n")


def registry_doc() -> dict:
    def entry(pid: str, name: str, title: str, files: list[str], hooks: list[str]) -> dict:
        return {"id": pid, "file": name, "title": title, "bug": "", "status": "dev", "build_impact": ["host"],
                "files": files, "hooks": hooks,
                "gates": [{"name": "smoke", "needs": ["cpu"], "command": ["true"], "proves": "it runs",
                           "timeout": 60}]}
    return {
        "schema": 1,
        "patches": [entry("0070", "0070-one.patch", "one", ["up/src/a.c"], ["one"]),
                    entry("0071", "0071-two.patch", "two", ["up/src/b.c"], ["two"]),
                    entry("0089", "0089-three.patch", "three", ["up/src/b.c", "up/src/new.c"], ["three"])],
        "hooks": {"one": {"patch": "0070", "description": "a", "sites": [{"file": "up/src/a.c", "symbol": "a",
                                                                          "line": 3}]},
                  "two": {"patch": "0071", "sites": [{"file": "up/src/b.c", "symbol": "<file scope>"}]},
                  "three": {"patch": "0089", "sites": [{"file": "up/src/b.c", "symbol": "<file scope>"}]}},
    }


# ---------------------------------------------------------------- the template project


@dataclass
class Template:
    root: Path  # the project
    cache: Path  # its FORKTOOL_CACHE
    backup: str  # the name of one backup in it
    stopped: Path  # another project, its `forktool sync` stopped at a conflict (state, backups, journal dir)


_TEMPLATE: Template | None = None


def template(base: Path) -> Template:
    """Made once per process: fetch, a three-patch series applied, registry and build config, one backup."""
    global _TEMPLATE
    if _TEMPLATE is not None:
        return _TEMPLATE
    base.mkdir(parents=True, exist_ok=True)
    cache = base / "cache"
    os.environ["FORKTOOL_CACHE"] = str(cache)
    proj = make_project(base / "t", UPSTREAM)
    (proj.root / "registry" / "build.yaml").write_text(BUILD_YAML)
    three_patches(proj)
    (proj.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(registry_doc(), sort_keys=False))
    run_cli(proj.root, ["apply"])
    run_cli(proj.root, ["registry", "render"])
    run_cli(proj.root, ["verify"])
    # a backup of the patched tree: it stores the three patched files and a state with the series applied
    code, out, err = run_cli(proj.root, ["backup", "create", "corpus", "--json"])
    _TEMPLATE = Template(proj.root, cache, json.loads(out)["name"], stopped_sync(base / "s"))
    return _TEMPLATE


def stopped_sync(base: Path) -> Path:
    """A project whose sync to a newer synthetic upstream stopped at a conflict (as tests/test_sync_loop.py)."""
    from tests.helpers import sync as loop
    proj = make_project(base, UPSTREAM)
    loop.loop_series(proj)
    commit = loop.new_upstream(proj)
    code, out, err = run_cli(proj.root, ["sync", "--to", commit, "--start", "--json"], expect=1)
    assert json.loads(out)["stage"] == "stopped", err
    return proj.root


# ---------------------------------------------------------------- cases


@dataclass
class Ctx:
    """What a case's setup sees: its own project copy, a canary directory outside it, the template."""

    root: Path
    canary: Path
    tpl: Template
    work: Path

    @property
    def tree(self) -> Path:
        return self.root / "vendor" / "llamafile"

    @property
    def state(self) -> Path:
        return self.root / ".opencoti"


@dataclass
class Case:
    family: str
    name: str
    setup: Callable[[Ctx], None]
    argv: list[str]
    must: tuple[str, ...] = ()  # every one of these appears in the message (case-insensitive)
    fresh: bool = False  # no template: setup builds the project itself (crafted sdists)
    recovery: bool = False  # the tree may move as long as `verify` accepts the result
    stopped: bool = False  # start from the template's stopped sync instead of its applied series
    expect: tuple[int, ...] = (1, 2)
    # run as a real process (`python -m forktool`): SIGINT at these moments ("import:<module>" or "open:<path
    # part>", each the first time it happens, in order), or with these standard streams ("stdout=closed|full|pipe",
    # "stderr=closed|full", "plain" for none spoiled); `code` is the command's own exit code with plain streams
    interrupt: tuple[str, ...] = ()
    streams: str = ""
    code: int = 0
    # paths under the project (after setup) that must come out byte-identical: what a sync still needs
    kept: Callable[[Ctx], list[Path]] | None = None
    succeeds: bool = False  # exit 0 is the clean outcome (with `kept` intact), not a refusal

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"


@dataclass
class Outcome:
    case: Case
    code: int | None
    kind: str  # refusal | usage | interrupted | contract | kept | success | traceback | hang | outside |
    #            tree-changed | inputs-changed | lost | unclear | wrong-exit | not-recovered
    seconds: float
    detail: str = ""
    err: str = field(default="", repr=False)


# ------------------------------------------------ value generators


class Raw(str):
    """Text spliced verbatim into a YAML or JSON document (.inf, NaN, deep nesting, huge numbers)."""


DEEP_YAML = Raw("[" * 3000 + "]" * 3000)
DEEP_JSON = Raw("[" * 100000 + "]" * 100000)


def bad_values(original: object, required: bool, json_doc: bool) -> list[tuple[str, object]]:
    """(label, value) pairs of another type or out of range for a value like `original`."""
    inf = Raw("Infinity") if json_doc else Raw(".inf")
    nan = Raw("NaN") if json_doc else Raw(".nan")
    deep = DEEP_JSON if json_doc else DEEP_YAML
    out: list[tuple[str, object]] = []
    if isinstance(original, bool):
        out += [("str", "yes"), ("int", 1), ("list", [True])]
    elif isinstance(original, int):
        out += [("bool", True), ("str", str(original)), ("float", original + 0.5), ("negative", -1),
                ("huge", Raw("1" + "0" * 100)), ("inf", inf), ("nan", nan)]
    elif isinstance(original, str):
        out += [("list", [original]), ("dict", {"k": original}), ("int", 7), ("bool", True), ("inf", inf)]
    elif isinstance(original, list):
        out += [("str", "x"), ("dict", {"k": "x"}), ("int", 3), ("bool", False), ("nested", [[["x"]]])]
        if original and isinstance(original[0], str):
            out += [("int-item", [7]), ("bool-item", [True])]
    elif isinstance(original, dict):
        out += [("list", ["x"]), ("str", "x"), ("int", 1), ("bool", True)]
    if required:
        out.append(("null", None))
    out.append(("deep", deep))
    return out


def walk(doc: object, path: tuple = ()) -> Iterator[tuple[tuple, object]]:
    """(path, value) for every value of doc, lists through their first item only."""
    yield path, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from walk(v, path + (k,))
    elif isinstance(doc, list) and doc:
        yield from walk(doc[0], path + (0,))


def set_at(doc: object, path: tuple, value: object) -> object:
    doc = copy.deepcopy(doc)
    if not path:
        return value
    obj = doc
    for k in path[:-1]:
        obj = obj[k]  # type: ignore[index]
    obj[path[-1]] = value  # type: ignore[index]
    return doc


def del_at(doc: object, path: tuple) -> object:
    doc = copy.deepcopy(doc)
    obj = doc
    for k in path[:-1]:
        obj = obj[k]  # type: ignore[index]
    del obj[path[-1]]  # type: ignore[index]
    return doc


def render(doc: object, json_doc: bool) -> bytes:
    raws: dict[str, str] = {}

    def sub(v: object) -> object:
        if isinstance(v, Raw):
            key = f"RAWVALUE{len(raws)}X"
            raws[key] = str(v)
            return key
        if isinstance(v, dict):
            return {k: sub(x) for k, x in v.items()}
        if isinstance(v, list):
            return [sub(x) for x in v]
        return v
    text = json.dumps(sub(doc), indent=1) if json_doc else yaml.safe_dump(sub(doc), sort_keys=False, width=1 << 20)
    for key, raw in raws.items():
        text = text.replace(f'"{key}"', raw).replace(key, raw)
    return text.encode()


def label(path: tuple) -> str:
    return ".".join(str(p) for p in path) or "<top>"


def last_key(path: tuple) -> str:
    keys = [p for p in path if isinstance(p, str)]
    return keys[-1] if keys else ""


# ------------------------------------------------ families: config and state documents


NAMES = {"up", "tools", "cpu", "cuda", "one", "two", "three"}  # names the template's files choose themselves


def doc_cases(family: str, rel: str, doc_of: Callable[[Ctx], object], json_doc: bool, commands: list[list[str]],
              optional: set[str], skip: Callable[[tuple], bool] = lambda _p: False,
              fname: str | None = None) -> Iterator[Case]:
    """Type confusions at every key, missing required keys, unknown keys, and whole-file damage."""
    shown = fname or Path(rel).name
    proto = doc_of(None)  # type: ignore[arg-type]

    def writer(make: Callable[[object], object]) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            doc = make(doc_of(c))
            (c.root / rel).write_bytes(render(doc, json_doc))
        return setup

    for path, value in walk(proto):
        if skip(path):
            continue
        key = last_key(path)
        required = key not in optional
        for vlabel, bad in bad_values(value, required, json_doc):
            if key == "impact" and vlabel == "list":  # one impact or a list of them: both are right
                continue
            if path[:1] == ("files",) and len(path) == 2 and vlabel == "null":  # null: the patch deletes it
                continue
            for argv in commands:
                yield Case(family, f"{label(path)}={vlabel}:{' '.join(argv)}",
                           writer(lambda d, p=path, b=bad: set_at(d, p, b)), argv, must=(shown,))
        if path and isinstance(path[-1], str) and required:
            # a schema key is named in the message; a name chosen by the user (a component, a hook) may not be
            named = str(path[-1]) not in NAMES and "/" not in str(path[-1])
            yield Case(family, f"{label(path)}=missing:{' '.join(commands[0])}",
                       writer(lambda d, p=path: del_at(d, p)), commands[0],
                       must=(shown, str(path[-1])) if named else (shown,))
        if isinstance(value, dict) and (not path or isinstance(path[-1], str) or path[-1] == 0):
            yield Case(family, f"{label(path)}+unknown:{' '.join(commands[0])}",
                       writer(lambda d, p=path: set_at(d, p + ("colour",), "blue") if p else dict(d, colour="blue")),
                       commands[0], must=(shown, "colour"))
    for wlabel, data in whole_file_damage(json_doc):
        for argv in commands:
            yield Case(family, f"file={wlabel}:{' '.join(argv)}",
                       lambda c, d=data: (c.root / rel).write_bytes(d), argv, must=(shown,))
    for slabel, special in special_files():
        yield Case(family, f"file={slabel}:{' '.join(commands[0])}",
                   lambda c, s=special: s(c, c.root / rel), commands[0], must=(shown,))


def whole_file_damage(json_doc: bool) -> list[tuple[str, bytes]]:
    out = [("empty", b""), ("invalid-utf8", b"\xff\xfe\x00garbage\xc3\x28"), ("top-list", b"[1, 2]\n"),
           ("top-string", b'"just text"\n'), ("top-number", b"42\n"), ("binary", bytes(range(256)) * 4)]
    if json_doc:
        out += [("truncated", b'{"a": [1, 2'), ("nan-top", b"NaN"), ("deep", str(DEEP_JSON).encode()),
                ("trailing-garbage", b'{}\n{}')]
    else:
        out += [("bad-yaml", b"a: [1, 2\nb: }\n"), ("python-tag", b"x: !!python/object/apply:os.system ['true']\n"),
                ("deep", str(DEEP_YAML).encode()), ("anchors-bomb", _billion_laughs()),
                ("tabs", b"a:\n\t- b\n"), ("duplicate-keys", b"a: 1\na: 2\n")]
    return out


def _billion_laughs() -> bytes:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return ("\n".join(lines) + "\n").encode()


def special_files() -> list[tuple[str, Callable[[Ctx, Path], None]]]:
    def fifo(c: Ctx, p: Path) -> None:
        _rm(p)
        os.mkfifo(p)

    def directory(c: Ctx, p: Path) -> None:
        _rm(p)
        p.mkdir()
        (p / "x").write_text("x")

    def link_out(c: Ctx, p: Path) -> None:
        data = p.read_bytes() if p.is_file() else b""
        target = c.canary / ("copy-" + p.name)
        target.write_bytes(data)
        _rm(p)
        p.symlink_to(target)

    def dangling(c: Ctx, p: Path) -> None:
        _rm(p)
        p.symlink_to(c.canary / "nowhere")

    def huge(c: Ctx, p: Path) -> None:
        with open(p, "ab") as f:
            f.write(b"#" + b"x" * (40 << 20) + b"\n")
    return [("fifo", fifo), ("directory", directory), ("symlink-outside", link_out), ("dangling-symlink", dangling),
            ("huge", huge)]


def _rm(p: Path) -> None:
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()


def _json(c: Ctx | None, rel: str) -> object:
    root = c.root if c is not None else _TEMPLATE.root  # type: ignore[union-attr]
    return json.loads((root / rel).read_text())


def _yaml(c: Ctx | None, rel: str) -> object:
    root = c.root if c is not None else _TEMPLATE.root  # type: ignore[union-attr]
    return yaml.safe_load((root / rel).read_text())


def config_families() -> Iterator[Case]:
    yield from doc_cases("vendor.yaml", "vendor/vendor.yaml", lambda c: _yaml(c, "vendor/vendor.yaml"), False,
                         [["vendor", "status"]], {"exclude", "subdir", "upstream_commit"})
    yield from doc_cases("registry", "registry/UPSTREAM_SYNC.yaml", lambda c: _yaml(c, "registry/UPSTREAM_SYNC.yaml"),
                         False, [["registry", "check"]], {"bug", "description", "gates", "line", "timeout", "shipped"})
    yield from doc_cases("build.yaml", "registry/build.yaml", lambda c: _yaml(c, "registry/build.yaml"), False,
                         [["build", "--plan"]], {"links", "stamped", "outputs", "flags", "inherits", "tools", "cuda",
                                                 "cuda_architectures", "paths", "targets", "profiles"},
                         skip=lambda p: p[:2] == ("profiles", "cuda") and len(p) > 2 and p[2] != "cuda_architectures")
    yield from doc_cases("vendor.lock", "vendor/vendor.lock", lambda c: _json(c, "vendor/vendor.lock"), True,
                         [["status"]], set(), skip=lambda p: "include" in p or "exclude" in p)
    yield from doc_cases("state.json", ".opencoti/state.json", lambda c: _json(c, ".opencoti/state.json"), True,
                         [["status"], ["unapply"]], {"drift", "diff_sha256"},
                         skip=lambda p: len(p) > 3 and p[2] == "drift")


# ------------------------------------------------ families: journal and backups


def journal_cases() -> Iterator[Case]:
    """A crash left .opencoti/txn/ behind, and someone (or something) spoiled it."""
    must = ("journal",)

    def plan(entries: object, state: object = None, files: dict[str, bytes] | None = None,
             raw: bytes | None = None) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            tdir = c.state / "txn"
            (tdir / "new").mkdir(parents=True)
            for n, data in (files or {}).items():
                (tdir / "new" / n).write_bytes(data.replace(b"@CANARY@", os.fsencode(c.canary)))
            st = state if state is not None else _json(c, ".opencoti/state.json")
            text = raw if raw is not None else render({"entries": _sub_canary(entries, c), "state": st}, True)
            (tdir / "plan.json").write_bytes(text)
        return setup

    good = {"path": "up/src/a.c", "staged": "0", "mode": "100644"}
    bad_entries: list[tuple[str, object, dict[str, bytes] | None]] = [
        ("path-absolute", [dict(good, path="@CANARY@/victim.txt")], {"0": b"pwned\n"}),
        ("path-dotdot", [dict(good, path="../../../outside.txt")], {"0": b"pwned\n"}),
        ("path-dot", [dict(good, path="./up/src/a.c")], {"0": b"x\n"}),
        ("path-empty", [dict(good, path="")], {"0": b"x\n"}),
        ("path-nul", [dict(good, path="up/src/a\u0000.c")], {"0": b"x\n"}),
        ("path-int", [dict(good, path=5)], {"0": b"x\n"}),
        ("path-list", [dict(good, path=["up/src/a.c"])], {"0": b"x\n"}),
        ("path-missing", [{"staged": "0", "mode": "100644"}], {"0": b"x\n"}),
        ("staged-absolute", [dict(good, staged="@CANARY@/victim.txt")], None),
        ("staged-dotdot", [dict(good, staged="../../../../canary/victim.txt")], None),
        ("staged-subdir", [dict(good, staged="x/0")], None),
        ("staged-int", [dict(good, staged=0)], {"0": b"x\n"}),
        ("staged-list", [dict(good, staged=["0"])], {"0": b"x\n"}),
        ("staged-dict", [dict(good, staged={"0": 1})], {"0": b"x\n"}),
        ("staged-symlink", [dict(good, staged="0")], {"LINK": b""}),
        ("mode-bogus", [dict(good, mode="777")], {"0": b"x\n"}),
        ("mode-int", [dict(good, mode=100644)], {"0": b"x\n"}),
        ("symlink-out", [dict(good, path="up/src/evil", mode="120000")], {"0": b"@CANARY@"}),
        ("symlink-abs", [dict(good, path="up/src/evil", mode="120000")], {"0": b"/etc/passwd"}),
        ("symlink-up", [dict(good, path="up/src/evil", mode="120000")], {"0": b"../../../../.."}),
        ("through-symlink-parent", [dict(good, path="up/lnk/x.c")], {"0": b"x\n"}),
        ("duplicate-path", [good, dict(good, staged="1")], {"0": b"x\n", "1": b"y\n"}),
        ("entries-dict", {"path": "up/src/a.c"}, None),
        ("entries-str", "up/src/a.c", None),
        ("entries-null", None, None),
        ("entry-str", ["up/src/a.c"], None),
        ("entry-extra-key", [dict(good, colour="blue")], {"0": b"x\n"}),
        ("deep", DEEP_JSON, None),
    ]
    for lbl, entries, files in bad_entries:
        setup = plan(entries, files=files)
        if lbl == "staged-symlink":
            def setup(c: Ctx, base=setup) -> None:  # type: ignore[misc]
                base(c)
                link = c.state / "txn" / "new" / "0"
                link.symlink_to(c.canary / "victim.txt")
        if lbl == "through-symlink-parent":
            def setup(c: Ctx, base=setup) -> None:  # type: ignore[misc]
                base(c)
                (c.tree / "up" / "lnk").symlink_to(c.canary)
        yield Case("journal", lbl, setup, ["status"], must=must)
    for lbl, state in [("state-list", [1]), ("state-str", "x"), ("state-bad-files", {"files": {"/etc/x": ["0", "1"]}}),
                       ("state-applied-int", {"applied": 3}), ("state-inf", Raw("Infinity"))]:
        yield Case("journal", lbl, plan([], state=state), ["status"], must=must)
    for lbl, raw in [("invalid-json", b"{"), ("empty", b""), ("invalid-utf8", b"\xff\xfe"), ("top-list", b"[]"),
                     ("nan", b'{"entries": [], "state": NaN}'), ("missing-state", b'{"entries": []}'),
                     ("missing-entries", b'{"state": {}}'), ("unknown-key", b'{"entries": [], "state": {}, "x": 1}')]:
        yield Case("journal", lbl, plan([], raw=raw), ["status"], must=must)

    def special(kind: str) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            tdir = c.state / "txn"
            if kind == "txn-symlink":
                (c.canary / "txn" / "new").mkdir(parents=True)
                (c.canary / "txn" / "plan.json").write_text(json.dumps({"entries": [], "state": {}}))
                tdir.symlink_to(c.canary / "txn")
                return
            (tdir / "new").mkdir(parents=True)
            p = tdir / "plan.json"
            if kind == "plan-fifo":
                os.mkfifo(p)
            elif kind == "plan-dir":
                p.mkdir()
            elif kind == "plan-symlink":
                (c.canary / "plan.json").write_text(json.dumps({"entries": [], "state": {}}))
                p.symlink_to(c.canary / "plan.json")
            elif kind == "new-symlink":
                (tdir / "new").rmdir()
                (tdir / "new").symlink_to(c.canary)
                (c.canary / "0").write_text("pwned\n")
                p.write_bytes(render({"entries": [good], "state": _json(c, ".opencoti/state.json")}, True))
            elif kind == "txn-file":
                shutil.rmtree(tdir)
                tdir.write_text("not a directory\n")
        return setup
    for kind in ("txn-symlink", "plan-fifo", "plan-dir", "plan-symlink", "new-symlink", "txn-file"):
        yield Case("journal", kind, special(kind), ["status"], must=must)
    # the same journals must not block the way out: unapply --force and backup restore refuse just as clearly
    for lbl, entries, files in bad_entries[:6]:
        yield Case("journal", f"{lbl}:unapply-force", plan(entries, files=files), ["unapply", "--force"], must=must)


def _sub_canary(obj: object, c: Ctx) -> object:
    if isinstance(obj, str) and "@CANARY@" in obj:
        return obj.replace("@CANARY@", str(c.canary))
    if isinstance(obj, list):
        return [_sub_canary(x, c) for x in obj]
    if isinstance(obj, dict):
        return {k: _sub_canary(v, c) for k, v in obj.items()}
    return obj


def backup_cases() -> Iterator[Case]:
    def manifest_rel(c: Ctx | None) -> str:
        tpl = c.tpl if c is not None else _TEMPLATE
        return f".opencoti/vendor-backups/{tpl.backup}/manifest.json"  # type: ignore[union-attr]

    def restore(c: Ctx) -> list[str]:
        return ["backup", "restore", c.tpl.backup]
    proto = _json(None, manifest_rel(None))
    for path, value in walk(proto):
        if len(path) > 2 or path == ("state",) or (len(path) == 2 and path[0] == "state"):
            continue
        for vlabel, bad in bad_values(value, True, True):
            def setup(c: Ctx, p=path, b=bad) -> None:
                rel = manifest_rel(c)
                (c.root / rel).write_bytes(render(set_at(_json(c, rel), p, b), True))
            yield Case("backup", f"{label(path)}={vlabel}", setup, ["backup", "restore", "@BACKUP@"],
                       must=("manifest",))

    def tamper(fn: Callable[[dict, Ctx], None]) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            rel = manifest_rel(c)
            m = _json(c, rel)
            fn(m, c)  # type: ignore[arg-type]
            (c.root / rel).write_bytes(render(m, True))
        return setup

    def first_file(m: dict) -> str:
        return sorted(m["files"])[0]
    tampers: list[tuple[str, Callable[[dict, Ctx], None]]] = [
        ("file-absolute", lambda m, c: m["files"].__setitem__(str(c.canary / "victim.txt"), m["files"][first_file(m)])),
        ("file-dotdot", lambda m, c: m["files"].__setitem__("../../../outside.txt", m["files"][first_file(m)])),
        ("extra-symlink", lambda m, c: m["files"].__setitem__("up/src/evil", [hashlib.sha256(str(c.canary).encode())
                                                                               .hexdigest(), "120000"])),
        ("mode-changed", lambda m, c: m["files"][first_file(m)].__setitem__(1, "100755")),
        ("mode-bogus", lambda m, c: m["files"][first_file(m)].__setitem__(1, "777")),
        ("sha-short", lambda m, c: m["files"][first_file(m)].__setitem__(0, "abc")),
        ("entry-long", lambda m, c: m["files"].__setitem__(first_file(m), m["files"][first_file(m)] + ["x"])),
        ("state-cut", lambda m, c: m["state"].__setitem__("applied", m["state"]["applied"][:1])),
        ("state-files-abs", lambda m, c: m["state"]["files"].__setitem__(str(c.canary / "v"), None)),
        ("state-version", lambda m, c: m["state"].__setitem__("version", 99)),
        ("stored-unknown", lambda m, c: m["stored"].append("up/nowhere.c")),
        ("stored-dotdot", lambda m, c: m["stored"].append("../x")),
    ]
    for lbl, fn in tampers:
        yield Case("backup", lbl, tamper(fn), ["backup", "restore", "@BACKUP@"], must=("backup",))

    def objects_gone(c: Ctx) -> None:
        objs = c.root / ".opencoti" / "vendor-backups" / c.tpl.backup / "objects"
        shutil.rmtree(objs, ignore_errors=True)
        (c.root / ".opencoti" / "vendor-backups" / c.tpl.backup / "objects").write_text("not a directory\n")

    def object_changed(c: Ctx) -> None:
        objs = c.root / ".opencoti" / "vendor-backups" / c.tpl.backup / "objects"
        for p in objs.rglob("*"):
            if p.is_file():
                p.chmod(0o644)
                p.write_bytes(b"tampered\n")

    def object_symlink(c: Ctx) -> None:
        objs = c.root / ".opencoti" / "vendor-backups" / c.tpl.backup / "objects"
        for p in objs.rglob("*"):
            if p.is_file():
                (c.canary / "obj").write_bytes(p.read_bytes())
                p.unlink()
                p.symlink_to(c.canary / "obj")

    def manifest_fifo(c: Ctx) -> None:
        p = c.root / manifest_rel(c)
        p.unlink()
        os.mkfifo(p)

    def backups_symlink(c: Ctx) -> None:
        d = c.root / ".opencoti" / "vendor-backups"
        shutil.copytree(d, c.canary / "vb", symlinks=True)
        shutil.rmtree(d)
        d.symlink_to(c.canary / "vb")

    def backup_dir_symlink(c: Ctx) -> None:
        d = c.root / ".opencoti" / "vendor-backups" / c.tpl.backup
        shutil.copytree(d, c.canary / "b", symlinks=True)
        shutil.rmtree(d)
        d.symlink_to(c.canary / "b")
    for lbl, fn in [("objects-gone", objects_gone), ("object-changed", object_changed),
                    ("object-symlink", object_symlink), ("manifest-fifo", manifest_fifo)]:
        yield Case("backup", lbl, fn, ["backup", "restore", "@BACKUP@"], must=("backup",))
    for lbl, fn, argvs in [("backups-dir-symlink", backups_symlink,
                            (["backup", "restore", "@BACKUP@"], ["backup", "create"], ["backup", "prune", "--keep", "0"],
                             ["backup", "list"], ["apply", "--upto", "0070"])),
                           ("backup-symlink", backup_dir_symlink, (["backup", "restore", "@BACKUP@"],))]:
        for argv in argvs:
            yield Case("backup", f"{lbl}:{' '.join(argv[:2])}", fn, argv, must=("symlink",))
    for name in ["", "../t", "/etc", "no-such-backup", "a/b", ".", "..", "x" * 300]:
        yield Case("backup", f"name={name[:20]!r}", lambda c: None, ["backup", "restore", name], must=("backup",))
    for keep in ["-1", "-100", "1e3", "", "x"]:
        yield Case("backup", f"prune-keep={keep!r}", lambda c: None, ["backup", "prune", "--keep", keep])


# ------------------------------------------------ families: patches and the series


def _real_patches() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((REPO / "patches").glob("*.patch"))}


def patch_mutations(data: bytes) -> list[tuple[str, bytes]]:
    """Ways to spoil a canonical patch, each one a refusal for the applier or the parser."""
    lines = data.split(b"\n")
    out: list[tuple[str, bytes]] = []
    diffs = [i for i, ln in enumerate(lines) if ln.startswith(b"diff --git ")]
    hunks = [i for i, ln in enumerate(lines) if ln.startswith(b"@@ ")]
    plus = [i for i, ln in enumerate(lines) if ln.startswith(b"+") and not ln.startswith(b"+++")]

    def at(i: int, new: bytes | list[bytes]) -> bytes:
        ls = list(lines)
        ls[i:i + 1] = new if isinstance(new, list) else [new]
        return b"\n".join(ls)
    h = hunks[0]
    body = [i for i in range(h + 1, len(lines)) if lines[i][:1] in (b" ", b"-", b"+")
            and not lines[i].startswith((b"--- ", b"+++ "))]
    for frac in (0.3, 0.6, 0.9):
        cut = body[min(len(body) - 1, int(len(body) * frac))]  # inside a hunk: its counts can no longer match
        out.append((f"truncated-{int(frac * 100)}", b"\n".join(lines[:cut])))
    hdr = lines[h].decode()
    import re
    m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)", hdr)
    assert m
    o1, o2, n1, n2, rest = int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 1), m[5]
    out += [("hunk-old-count+1", at(h, f"@@ -{o1},{o2 + 1} +{n1},{n2} @@{rest}".encode())),
            ("hunk-new-count-1", at(h, f"@@ -{o1},{o2} +{n1},{max(0, n2 - 1)} @@{rest}".encode())),
            ("hunk-huge-start", at(h, f"@@ -{10 ** 30},{o2} +{n1},{n2} @@{rest}".encode())),
            ("hunk-negative", at(h, f"@@ --5,{o2} +{n1},{n2} @@{rest}".encode())),
            ("hunk-garbage", at(h, b"@@ this is not a hunk header @@")),
            ("hunk-huge-count", at(h, f"@@ -{o1},{10 ** 9} +{n1},{n2} @@{rest}".encode()))]
    d = diffs[0]
    old = lines[d].decode().split(" ")[2][2:]
    for lbl, evil in [("path-dotdot", "../../../outside.txt"), ("path-absolute", "/tmp/forktool-evil.txt"),
                      ("path-dot", "./" + old), ("path-backslash", old.replace("/", "\\")),
                      ("path-nul", old + "\0x"), ("path-newline-name", old + "\\nx"),
                      ("path-long", "/".join(["d" * 200] * 25))]:
        text = data.replace(f"a/{old}".encode(), f"a/{evil}".encode()).replace(f"b/{old}".encode(), f"b/{evil}".encode())
        out.append((lbl, text))
    out.append(("path-invalid-utf8", data.replace(f"b/{old}".encode(), f"b/{old}\xff".encode("latin-1"))))
    if plus:
        mid = plus[0]
        out.append(("newline-marker-after-middle-plus", at(mid, [lines[mid], b"\\ No newline at end of file"])))
        out.append(("newline-marker-misspelled", at(mid, [lines[mid], b"\\ No newline at the end"])))
        out.append(("plus-line-invalid-utf8-crlf", at(mid, lines[mid] + b"\r")))
    # a file section turned into a `new file` whose hunk still carries context and '-' lines
    nf = list(lines)
    idx = next(i for i in range(d, len(nf)) if nf[i].startswith(b"index "))
    nf[idx:idx + 1] = [b"new file mode 100644", b"index " + b"0" * 40 + b".." + b"1" * 40]
    nf = [b"--- /dev/null" if ln.startswith(b"--- a/") and i > d else ln for i, ln in enumerate(nf)]
    out.append(("new-file-with-context", b"\n".join(nf)))
    out += [("empty", b""), ("crlf", data.replace(b"\n", b"\r\n")), ("binary", bytes(range(256)) * 64),
            ("duplicate-section", data + b"\n".join(lines[d:hunks[0] + 3]) + b"\n"),
            ("index-garbage", at(next(i for i in range(d, len(lines)) if lines[i].startswith(b"index ")),
                                 b"index zzzz..yyyy 100644")),
            ("mode-bogus", at(next(i for i in range(d, len(lines)) if lines[i].startswith(b"index ")),
                              lines[next(i for i in range(d, len(lines)) if lines[i].startswith(b"index "))][:-6]
                              + b"999999")),
            ("header-no-from", b"\n".join(lines[1:])),
            ("header-no-subject", data.replace(b"Subject: [PATCH] ", b"Subjekt: ", 1)),
            ("nul-in-body", at(hunks[0] + 1, lines[hunks[0] + 1] + b"\0"))]
    return out


def patch_cases() -> Iterator[Case]:
    # the series shipped with the project, each appended to the synthetic series after its own spoiling
    for pname, data in _real_patches().items():
        for lbl, bad in patch_mutations(data):
            name = "0095-" + pname[5:]

            def setup(c: Ctx, b=bad, n=name) -> None:
                (c.root / "patches" / n).write_bytes(b)
                with open(c.root / "patches" / "series", "a") as f:
                    f.write(n + "\n")
            yield Case("patches", f"real:{pname[:4]}:{lbl}", setup, ["apply"], must=(name,))
    # the synthetic series, spoiled in place while applied
    for pname, text in SERIES.items():
        for lbl, bad in patch_mutations(text.encode()):
            yield Case("patches", f"synthetic:{pname[:4]}:{lbl}",
                       lambda c, b=bad, n=pname: (c.root / "patches" / n).write_bytes(b), ["apply"], must=(pname,))
    for lbl, special in special_files():
        yield Case("patches", f"file={lbl}", lambda c, s=special: s(c, c.root / "patches" / "0089-three.patch"),
                   ["apply"], must=("0089-three.patch",))
    # a new-file section whose parent is a file, or whose path is a directory: refused before the plan is
    # committed, so nothing can block the project afterwards
    for lbl, rel in [("new-file-under-a-file", "up/src/a.c/x.c"), ("new-file-at-a-directory", "up/include")]:
        extra = make_patch("x.patch", {rel: (None, "int x;\n")}).split("\n---\n", 1)[1]

        def setup(c: Ctx, e=extra) -> None:
            p = c.root / "patches" / "0089-three.patch"
            p.write_bytes(p.read_bytes() + e.encode())
        yield Case("patches", lbl, setup, ["apply"], must=(rel,))


def series_cases() -> Iterator[Case]:
    lines = {
        "dotdot": "../vendor/vendor.yaml", "absolute": "/etc/hostname", "subdir": "sub/0090-x.patch",
        "missing": "0090-missing.patch", "duplicate": "0070-one.patch", "no-id": "one.patch",
        "bad-id": "00x0-bad.patch", "long-name": "0090-" + "x" * 300 + ".patch", "space": "0090 x.patch",
        "tab": "0090-x.patch\textra", "nul": "0090-x\0.patch", "backslash": "..\\x.patch", "dot": ".",
        "empty-id": "-x.patch", "five-digit": "00900-x.patch", "not-patch": "0090-x.diff",
        "same-id": "0070-other.patch",
    }
    for lbl, line in lines.items():
        def setup(c: Ctx, ln=line) -> None:
            if ln in ("sub/0090-x.patch", "0070-other.patch", "0090-x.diff"):
                p = c.root / "patches" / ln
                p.parent.mkdir(exist_ok=True)
                p.write_text(SERIES["0070-one.patch"])
            with open(c.root / "patches" / "series", "a") as f:
                f.write(ln + "\n")
        for argv in (["apply"], ["status"]):
            yield Case("series", f"{lbl}:{argv[0]}", setup, argv, must=("series",))

    def symlink_out(c: Ctx) -> None:
        (c.canary / "0090-x.patch").write_text(SERIES["0070-one.patch"].replace("0070", "0090"))
        (c.root / "patches" / "0090-x.patch").symlink_to(c.canary / "0090-x.patch")
        with open(c.root / "patches" / "series", "a") as f:
            f.write("0090-x.patch\n")

    def patches_symlink(c: Ctx) -> None:
        shutil.copytree(c.root / "patches", c.canary / "patches")
        shutil.rmtree(c.root / "patches")
        (c.root / "patches").symlink_to(c.canary / "patches")
    yield Case("series", "entry-symlink-outside:apply", symlink_out, ["apply"], must=("0090-x.patch", "symlink"))
    yield Case("series", "entry-symlink-outside:status", symlink_out, ["status"], must=("0090-x.patch", "symlink"))
    yield Case("series", "patches-dir-symlink:apply", patches_symlink, ["apply"], must=("patches", "symlink"))
    for lbl, data in [("invalid-utf8", b"0070-one.patch\n\xff\xfe\n"), ("binary", bytes(range(256))),
                      ("nul", b"0070-one.patch\0\n")]:
        yield Case("series", f"file={lbl}", lambda c, d=data: (c.root / "patches" / "series").write_bytes(d),
                   ["apply"], must=("series",))
    for lbl, special in special_files():
        yield Case("series", f"file={lbl}", lambda c, s=special: s(c, c.root / "patches" / "series"),
                   ["apply"], must=("series",))


# ------------------------------------------------ families: hand-made trees and .opencoti


def tree_cases() -> Iterator[Case]:
    def add(rel: bytes, make: Callable[[Ctx, bytes], None]) -> Callable[[Ctx], None]:
        return lambda c: make(c, os.path.join(os.fsencode(c.tree), rel))

    def fifo(c: Ctx, p: bytes) -> None:
        os.mkfifo(p)

    def regular(c: Ctx, p: bytes) -> None:
        with open(p, "wb") as f:
            f.write(b"x\n")

    def replace_fifo(c: Ctx, p: bytes) -> None:
        os.unlink(p)
        os.mkfifo(p)

    def replace_link_out(c: Ctx, p: bytes) -> None:
        (c.canary / "victim.c").write_bytes(open(p, "rb").read())
        os.unlink(p)
        os.symlink(c.canary / "victim.c", p)

    def replace_dir(c: Ctx, p: bytes) -> None:
        os.unlink(p)
        os.mkdir(p)

    def parent_link_out(c: Ctx, p: bytes) -> None:
        d = os.fsdecode(os.path.dirname(p))
        shutil.copytree(d, c.canary / "src")
        shutil.rmtree(d)
        os.symlink(c.canary / "src", d)

    def hardlink_out(c: Ctx, p: bytes) -> None:
        (c.canary / "hard.c").write_bytes(open(p, "rb").read() + b"// local edit\n")
        os.unlink(p)
        os.link(c.canary / "hard.c", p)

    def tree_link(c: Ctx, p: bytes) -> None:
        shutil.copytree(c.tree, c.canary / "tree", symlinks=True)
        shutil.rmtree(c.tree)
        c.tree.symlink_to(c.canary / "tree")

    def link_loop(c: Ctx, p: bytes) -> None:
        os.symlink(b"loop", p)

    def dangling(c: Ctx, p: bytes) -> None:
        os.symlink(os.fsencode(c.canary / "nowhere"), p)

    def socket_file(c: Ctx, p: bytes) -> None:
        import socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(p)
        finally:
            s.close()

    def unreadable_dir(c: Ctx, p: bytes) -> None:
        os.mkdir(p)
        with open(os.path.join(p, b"x.c"), "wb") as f:
            f.write(b"x")
        os.chmod(p, 0)

    def deep(c: Ctx, p: bytes) -> None:
        d = p
        for _ in range(60):
            d = os.path.join(d, b"d" * 80)
        os.makedirs(d[:3900], exist_ok=True)
        with open(os.path.join(d[:3900], b"x.c"), "wb") as f:
            f.write(b"deep\n")
    # hostile: every command that reads the tree refuses; dirty: what a user may have (a hard link, an empty or
    # unreadable directory, a link loop inside) is refused only where a dirty tree is (apply, verify, unapply)
    hostile = [["apply"], ["verify"], ["markers"], ["refresh", "0089"], ["backup", "create"], ["apply", "--force"]]
    dirty = [["apply"], ["verify"], ["unapply"]]
    makers: list[tuple[str, Callable[[Ctx], None], tuple[str, ...]]] = [
        ("fifo-new", add(b"up/src/fifo.c", fifo), ("fifo.c",)),
        ("fifo-patched", add(b"up/src/b.c", replace_fifo), ("b.c",)),
        ("fifo-unpatched", add(b"up/include/c.h", replace_fifo), ("c.h",)),
        ("socket", add(b"up/src/sock", socket_file), ("sock",)),
        ("symlink-out-patched", add(b"up/src/b.c", replace_link_out), ("b.c",)),
        ("symlink-out-new", add(b"up/src/new.c", replace_link_out), ("new.c",)),
        ("dir-for-file", add(b"up/src/a.c", replace_dir), ("a.c",)),
        ("parent-symlink-out", add(b"up/src/a.c", parent_link_out), ("up/src",)),
        ("hardlink-out", add(b"up/src/b.c", hardlink_out), ("b.c",)),
        ("tree-symlink", add(b"", tree_link), ("llamafile",)),
        ("symlink-loop", add(b"up/src/loop", link_loop), ("loop",)),
        ("dangling", add(b"up/src/dangling", dangling), ("dangling",)),
        ("name-newline", add(b"up/src/x\ny.c", regular), ("up/src/x",)),
        ("name-invalid-utf8", add(b"up/src/\xff\xfe.c", regular), ("up/src/",)),
        ("name-backslash", add(b"up/src/x\\y.c", regular), ("up/src/x",)),
        ("unreadable-dir", add(b"up/src/locked", unreadable_dir), ("locked",)),
        ("too-deep", add(b"up/src/deep", deep), ("up/src/deep",)),
    ]
    benign = {"dir-for-file", "hardlink-out", "symlink-loop", "unreadable-dir", "too-deep"}
    for lbl, setup, must in makers:
        for argv in dirty if lbl in benign else hostile:
            yield Case("tree", f"{lbl}:{' '.join(argv)}", setup, argv, must=must)


def state_dir_cases() -> Iterator[Case]:
    def lock_link(c: Ctx) -> None:
        (c.canary / "precious").write_text("keep me\n")
        (c.state / "lock").unlink(missing_ok=True)
        (c.state / "lock").symlink_to(c.canary / "precious")

    def lock_fifo(c: Ctx) -> None:
        (c.state / "lock").unlink(missing_ok=True)
        os.mkfifo(c.state / "lock")

    def lock_dir(c: Ctx) -> None:
        (c.state / "lock").unlink(missing_ok=True)
        (c.state / "lock").mkdir()

    def state_link(c: Ctx) -> None:
        shutil.copytree(c.state, c.canary / "st", symlinks=True)
        shutil.rmtree(c.state)
        c.state.symlink_to(c.canary / "st")

    def state_file(c: Ctx) -> None:
        shutil.rmtree(c.state)
        c.state.write_text("not a directory\n")
    for lbl, fn in [("lock-symlink", lock_link), ("lock-fifo", lock_fifo), ("lock-dir", lock_dir),
                    ("opencoti-symlink", state_link), ("opencoti-file", state_file)]:
        for argv in (["status"], ["apply"], ["unapply"], ["verify"], ["backup", "create"]):
            yield Case("opencoti", f"{lbl}:{' '.join(argv)}", fn, argv, must=(".opencoti",))
    for lbl, special in special_files():
        if lbl == "huge":
            continue
        for argv in (["status"], ["unapply"]):
            yield Case("opencoti", f"state.json={lbl}:{argv[0]}",
                       lambda c, s=special: s(c, c.state / "state.json"), argv, must=("state.json",))


# ------------------------------------------------ families: crafted sdists


def _tar(members: list[tuple], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as t:
        for kind, name, *rest in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = rest[0]
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, rest[0]
                t.addfile(info)
            elif kind == "lnk":
                info.type, info.linkname = tarfile.LNKTYPE, rest[0]
                t.addfile(info)
            elif kind in ("chr", "fifo"):
                info.type = tarfile.CHRTYPE if kind == "chr" else tarfile.FIFOTYPE
                t.addfile(info)
    return buf.getvalue()


P = "pkg-1.0/vendor/up/"
OK_FILE = ("file", P + "src/a.c", b"int a;\n")


def sdist_archives() -> list[tuple[str, bytes, tuple[str, ...]]]:
    chain = [OK_FILE, ("dir", P + "src/a/b/c/d/e"), ("sym", P + "src/a/b/c/d/e/l", "../../../.."),
             ("sym", P + "src/y", "a/b/c/d/e/l/../../../../.."), ("file", P + "src/y/escape/pwn.txt", b"pwned\n")]
    out: list[tuple[str, bytes, tuple[str, ...]]] = [
        ("symlink-chain-escape", _tar(chain), ("unsafe",)),
        ("symlink-chain-short", _tar([OK_FILE, ("sym", P + "src/l1", ".."), ("sym", P + "src/l2", "l1/.."),
                                      ("file", P + "src/l2/x/pwn.c", b"x")]), ("unsafe",)),
        ("write-through-symlink-dir", _tar([OK_FILE, ("sym", P + "src/d", "."), ("file", P + "src/d/../../../../pwn.c",
                                                                                 b"x")]), ("unsafe",)),
        ("member-under-symlink", _tar([OK_FILE, ("sym", P + "src/inc", "../include"), ("file", P + "src/inc/x.h", b"x")]),
         ("symlink",)),
        ("absolute-symlink", _tar([OK_FILE, ("sym", P + "src/l", "/etc/passwd")]), ("unsafe",)),
        ("dotdot-symlink", _tar([OK_FILE, ("sym", P + "src/l", "../../../../../../etc/passwd")]), ("unsafe",)),
        ("absolute-member", _tar([OK_FILE, ("file", "/tmp/forktool-pwn.c", b"x")]), ("unsafe",)),
        ("dotdot-member", _tar([OK_FILE, ("file", P + "src/../../../../../pwn.c", b"x")]), ("unsafe",)),
        ("hardlink-outside", _tar([OK_FILE, ("lnk", P + "src/h.c", "/etc/passwd")]), ("unsafe",)),
        ("hardlink-dotdot", _tar([OK_FILE, ("lnk", P + "src/h.c", "../../../x")]), ("unsafe",)),
        ("hardlink-later-member", _tar([("lnk", P + "src/h.c", P + "src/z.c"), OK_FILE,
                                        ("file", P + "src/z.c", b"z")]), ("hard link",)),
        ("hardlink-to-symlink", _tar([OK_FILE, ("sym", P + "src/s", "a.c"), ("lnk", P + "src/h.c", P + "src/s")]),
         ("link",)),
        ("char-device", _tar([OK_FILE, ("chr", P + "src/dev")]), ("device",)),
        ("fifo-member", _tar([OK_FILE, ("fifo", P + "src/fifo")]), ("fifo",)),
        ("file-and-dir-same-name", _tar([OK_FILE, ("file", P + "src/x", b"x"), ("file", P + "src/x/y.c", b"y")]),
         ("src/x",)),
        ("dir-then-file-same-name", _tar([OK_FILE, ("file", P + "src/q/y.c", b"y"), ("file", P + "src/q", b"x")]),
         ("src/q",)),
        ("duplicate-member", _tar([OK_FILE, ("file", P + "src/a.c", b"other\n")]), ("src/a.c",)),
        ("symlink-and-file-same-name", _tar([OK_FILE, ("sym", P + "src/s.c", "a.c"), ("file", P + "src/s.c", b"x")]),
         ("src/s.c",)),
        ("empty-sdist", _tar([]), ("keep no file",)),
        ("only-filtered", _tar([("file", P + "README.md", b"x")]), ("keep no file",)),
        ("not-a-tar", b"this is not an archive at all\n", ("archive",)),
        ("truncated-gzip", _tar([OK_FILE, ("file", P + "src/big.c", os.urandom(50000))])[:2000], ("archive",)),
        ("name-newline", _tar([OK_FILE, ("file", P + "src/x\ny.c", b"x")]), ("src/x",)),
        ("name-nul-ish", _tar([OK_FILE, ("file", P + "src/x\\y.c", b"x")]), ("src/x",)),
        ("name-long", _tar([OK_FILE, ("file", P + "src/" + "/".join(["d" * 250] * 20) + "/x.c", b"x")]), ("src/",)),
        ("symlink-to-dir-outside-filter", _tar([OK_FILE, ("sym", P + "src/l", "../../../setup.py")]), ("unsafe",)),
        ("symlink-self-loop", _tar([OK_FILE, ("sym", P + "src/l", "l"), ("file", P + "src/l/x.c", b"x")]),
         ("src/l",)),
    ]
    return out


def sdist_cases() -> Iterator[Case]:
    for lbl, archive, must in sdist_archives():
        def setup(c: Ctx, a=archive) -> None:
            sd = c.work / "pkg-1.0.tar.gz"
            sd.write_bytes(a)
            bare_project(c.root, sdist_pin(hashlib.sha256(a).hexdigest(), include="[src, '*.c']", exclude="['*.md']"))
        yield Case("sdist", lbl, setup, ["vendor", "fetch", "--sdist", "@SDIST@"], must=must, fresh=True)


# ------------------------------------------------ family: the command line


def cli_cases() -> Iterator[Case]:
    argvs: list[tuple[str, list[str], tuple[str, ...]]] = [
        ("apply-upto-empty", ["apply", "--upto", ""], ("--upto",)),
        ("apply-upto-unknown", ["apply", "--upto", "9999"], ("9999",)),
        ("apply-upto-letters", ["apply", "--upto", "abcd"], ("abcd",)),
        ("apply-upto-short", ["apply", "--upto", "70"], ("70",)),
        ("apply-upto-space", ["apply", "--upto", " "], ("--upto",)),
        ("unapply-to-empty", ["unapply", "--to", ""], ("--to",)),
        ("unapply-to-unknown", ["unapply", "--to", "0001"], ("0001",)),
        ("unapply-to-name", ["unapply", "--to", "0070-one.patch"], ("0070-one.patch",)),
        ("refresh-empty", ["refresh", ""], ("ID",)),
        ("refresh-unknown", ["refresh", "1234"], ("1234",)),
        ("new-empty-slug", ["new", ""], ("slug",)),
        ("new-bad-slug", ["new", "Bad Slug"], ("slug",)),
        ("new-slug-slash", ["new", "../x"], ("slug",)),
        ("new-title-newline", ["new", "x", "--title", "one\ntwo"], ("--title",)),
        ("new-title-diff", ["new", "x", "--title", "t\ndiff --git a/x b/x"], ("--title",)),
        ("new-title-cr", ["new", "x", "--title", "t\rFrom: evil"], ("--title",)),
        ("new-author-newline", ["new", "x", "--author", "a <a@a>\nSubject: evil"], ("--author",)),
        ("new-author-diff", ["new", "x", "--author", "a\ndiff --git a/x b/x"], ("--author",)),
        ("new-title-nul", ["new", "x", "--title", "a\0b"], ("--title",)),
        ("new-id-empty", ["new", "x", "--id", ""], ("--id",)),
        ("new-id-taken", ["new", "x", "--id", "0070"], ("0070",)),
        ("new-id-letters", ["new", "x", "--id", "abcd"], ("abcd",)),
        ("new-id-five", ["new", "x", "--id", "00001"], ("00001",)),
        ("backup-create-empty", ["backup", "create", ""], ("slug",)),
        ("gates-empty-id", ["gates", ""], ("ID",)),
        ("gates-unknown-id", ["gates", "4242"], ("4242",)),
        ("gates-empty-gate", ["gates", "--gate", ""], ("gate",)),
        ("build-empty-profile", ["build", "--plan", "--profile", ""], ("profile",)),
        ("build-unknown-profile", ["build", "--plan", "--profile", "tpu"], ("tpu",)),
        ("build-jobs-zero", ["build", "--plan", "-j", "0"], ("jobs",)),
        ("build-jobs-negative", ["build", "--plan", "-j", "-3"], ("jobs",)),
        ("sync-to-empty", ["sync", "--to", ""], ("--to",)),
        ("package-verify-empty", ["package", "verify", ""], ("release",)),
        ("unknown-command", ["frobnicate"], ("frobnicate",)),
        ("unknown-option", ["apply", "--colour"], ("--colour",)),
        ("unknown-option-backup", ["backup", "list", "--all"], ("--all",)),
        ("apply-upto-twice", ["apply", "--upto"], ("--upto",)),
    ]
    for lbl, argv, must in argvs:
        yield Case("cli", lbl, lambda c: None, argv, must=must)

    def below(c: Ctx) -> None:  # the tree moved down to 0070: 0071 and 0089 are not applied
        run_cli(c.root, ["unapply", "--to", "0070"])
    yield Case("cli", "refresh-not-applied", below, ["refresh", "0071"], must=("0071", "apply --upto"))

    def owned_above(c: Ctx) -> None:  # an edit of a line 0089 adds, refreshed into 0071 below it
        p = c.tree / "up" / "src" / "b.c"
        p.write_text(p.read_text().replace("extra\n", "extra, edited\n"))
    yield Case("cli", "refresh-edit-owned-above", owned_above, ["refresh", "0071"], must=("0089", "apply --upto 0071"))


# ------------------------------------------------ family: the state of a stopped `forktool sync`

SYNC_STATE = ".opencoti/sync/state.json"


def _sync_state(c: Ctx | None) -> dict:
    root = c.root if c is not None else _TEMPLATE.stopped  # type: ignore[union-attr]
    return json.loads((root / SYNC_STATE).read_text())


def sync_state_cases() -> Iterator[Case]:
    """Every key of a real stopped sync's state spoiled; --abort (restores and deletes) is the command at risk."""
    shown = "sync/state.json"
    # optional keys: a state written before them (e.g. a stop recorded on a CI branch) is still valid without them
    optional = {"offset", "remembered", "kind", "remembered_files", "review_merged", "path", "api", "checked"}
    for case in doc_cases("sync-state", SYNC_STATE, _sync_state, True, [["sync", "--abort"]], optional,
                          fname=shown):
        if case.name.startswith("done.0.drift.0.offset=negative"):  # drift runs both ways: a valid value
            continue
        case.stopped = True
        yield case

    def edit(change: Callable[[dict, Ctx], None]) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            st = _sync_state(c)
            change(st, c)
            (c.root / SYNC_STATE).write_text(json.dumps(st, indent=1))
        return setup

    def put(*path: object, value: object) -> Callable[[dict, Ctx], None]:
        def change(st: dict, c: Ctx) -> None:
            obj: Any = st
            for k in path[:-1]:
                obj = obj[k]
            obj[path[-1]] = _sub_canary(value, c)
        return change

    # names and paths the loop joins to a directory it restores, writes or deletes in
    hostile = {"..": "..", "dotdot": "../../../../canary", "absolute": "@CANARY@", "slash": "a/b",
               "empty": "", "nul": "x\u0000y"}
    places = [("backups", "tree"), ("backups", "project"), ("original", 1, 0), ("done", 0, "name"), ("stop", "name"),
              ("component",), ("to", "name"), ("to", "subdir"), ("old_pristine_digest",), ("new_pristine_digest",),
              ("done", 0, "files", 0, "file"), ("stop", "files", 0, "file")]
    for where in places:
        for lbl, value in hostile.items():
            if where[-1] in ("subdir", "file") and lbl in ("empty", "slash"):
                continue  # no subdir is the archive's root; a relative path may have parts
            for argv in (["sync", "--abort"], ["sync", "--continue"], ["apply"]):
                yield Case("sync-state", f"{label(where)}={lbl}:{' '.join(argv)}",
                           edit(put(*where, value=value + ("/x.patch" if lbl == "absolute" and "original" in where
                                                           else ""))), argv, must=(shown,), stopped=True)
    # names that pass the schema and point at what the loop must not follow or does not have
    def backup_link(kind: str) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            st = _sync_state(c)
            bdir = c.state / ("vendor-backups" if kind == "tree" else "sync-backups")
            name = st["backups"][kind]
            shutil.copytree(bdir / name, c.canary / "b", symlinks=True)
            shutil.rmtree(bdir / name)
            (bdir / name).symlink_to(c.canary / "b")
        return setup

    def sync_dir_link(c: Ctx) -> None:
        shutil.copytree(c.state / "sync", c.canary / "sync")
        shutil.rmtree(c.state / "sync")
        (c.state / "sync").symlink_to(c.canary / "sync")

    def journal(state: object) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            (c.state / "sync" / "txn" / "new").mkdir(parents=True)
            (c.state / "sync" / "txn" / "plan.json").write_text(json.dumps({"entries": [], "state": state}))
        return setup

    def manifest_damage(c: Ctx) -> None:
        name = _sync_state(c)["backups"]["project"]
        (c.state / "sync-backups" / name / "manifest.json").write_text('{"name": 7}')

    other = "20990101-000000-elsewhere"
    # each with the commands that read what it spoils (a valid state lets the others go on, rightly)
    every, loop = ("--abort", "--continue", "--skip", "status", "apply"), ("--abort", "--continue", "--skip")
    specials: list[tuple[str, Callable[[Ctx], None], tuple[str, ...], tuple[str, ...]]] = [
        ("tree-backup-symlinked", backup_link("tree"), ("symlink",), ("--abort",)),
        ("project-backup-symlinked", backup_link("project"), ("symlink",), ("--abort",)),
        ("sync-dir-symlinked", sync_dir_link, ("symlink",), every),
        ("backups-elsewhere", edit(put("backups", value={"tree": other, "project": other})), (shown,), loop),
        ("project-backup-damaged", manifest_damage, ("manifest.json",), ("--abort",)),
        ("journal-state-damaged", journal({"version": 1, "stage": "stopped"}), ("journal", "plan.json"), loop),
        ("journal-state-list", journal([1]), ("journal", "plan.json"), loop),
        ("position-past-end", edit(put("position", value=99)), (shown, "position"), every),
        ("stopped-without-stop", edit(put("stop", value=None)), (shown, "stop"), every),
        ("component-unknown", edit(put("component", value="nosuch")), (shown, "component"), loop),
        ("pristine-not-cached", edit(put("new_pristine_digest", value="0" * 64)), ("pristine",),
         ("--continue", "--skip")),
        ("original-not-a-patch", edit(put("original", 1, 1, value="not a patch\n")), ("0002",),
         ("--continue", "--skip")),
    ]
    for lbl, setup, must, commands in specials:
        for cmd in commands:
            argv = ["sync", cmd] if cmd.startswith("--") else [cmd]
            yield Case("sync-state", f"{lbl}:{' '.join(argv)}", setup, argv, must=must, stopped=True)

# ------------------------------------------------ families: signals and unwritable output (real processes)

# runs `python -m forktool ARGV` with SIGINT sent to itself at the named moments: a real signal, delivered where
# the process is at that instant (inside an import, while the lock or a journal file is being opened)
INTERRUPTER = r"""
import os, signal, sys
moments = [m for m in sys.argv[1].split(",") if m]
def hook(event, args):
    if not moments or not args:
        return
    kind, _, what = moments[0].partition(":")
    if event == kind and ((kind == "import" and args[0] == what)
                          or (kind == "open" and isinstance(args[0], str) and what in args[0])):
        moments.pop(0)
        os.kill(os.getpid(), signal.SIGINT)
sys.addaudithook(hook)
sys.argv = ["forktool", *sys.argv[2:]]
import runpy
runpy.run_module("forktool", run_name="__main__", alter_sys=True)
"""

EVERYWHERE = ("import:forktool.cli_spec", "import:forktool.output", "import:forktool.project")


def signal_cases() -> Iterator[Case]:
    def unapplied(c: Ctx) -> None:
        run_cli(c.root, ["unapply"])

    def none(c: Ctx) -> None:
        pass

    tree = ("import:forktool.commands.tree_cmds", "open:.opencoti/lock", "open:patches/series")
    moving = ("open:.opencoti/vendor-backups/", "open:.opencoti/txn/new/0", "open:.opencoti/txn/new/0,open:.opencoti/txn/new/1")
    commands: list[tuple[list[str], Callable[[Ctx], None], tuple[str, ...], bool]] = [
        (["status"], none, tree, False),
        (["status", "--json"], none, tree, False),
        (["verify"], none, tree, False),
        (["verify", "--no-cache", "--json"], none, tree, False),
        (["apply"], none, tree, False),
        (["apply", "--json"], unapplied, tree + moving, False),
        (["unapply"], none, tree + moving, False),
        (["unapply", "--to", "0070", "--json"], none, tree + moving, False),
        (["refresh", "0089"], none, tree, False),
        (["backup", "list"], none, ("import:forktool.commands.backup_cmds",), False),
        (["backup", "create", "x", "--json"], none, ("open:.opencoti/lock", "open:.opencoti/vendor-backups/"), False),
        (["registry", "check"], none, ("import:forktool.commands.registry_cmds", "open:.opencoti/lock"), False),
        (["markers", "--json"], none, ("open:.opencoti/lock",), False),
        (["vendor", "status"], none, ("import:forktool.vendor",), False),
        (["sync", "--abort"], none, ("import:forktool.commands.sync_cmds", "open:.opencoti/lock"), True),
        # through the typer app (a repeated flag is a line only click reads)
        (["status", "--json", "--json"], none, ("import:typer",), False),
        (["unapply", "--force", "--force"], none, ("import:typer", "open:.opencoti/txn/new/0"), False),
        (["apply", "--json", "--json"], unapplied, ("import:typer", "open:.opencoti/txn/new/1"), False),
    ]
    for argv, setup, moments, stopped in commands:
        for m in EVERYWHERE + moments:
            yield Case("signals", f"{' '.join(argv)}@{m}", setup, argv, interrupt=(m,) if "," not in m else
                       tuple(m.split(",")), stopped=stopped, recovery=True, expect=(130,))


def output_cases() -> Iterator[Case]:
    commands: list[tuple[list[str], int]] = [
        (["status", "--json"], 0), (["verify", "--json"], 0), (["markers", "--json"], 0),
        (["registry", "check", "--json"], 0), (["vendor", "status", "--json"], 0), (["backup", "list", "--json"], 0),
        (["apply", "--json"], 0), (["unapply", "--json"], 0), (["backup", "create", "x", "--json"], 0),
        (["apply", "--upto", "9999", "--json"], 2), (["status"], 0), (["--version"], 0), (["--help"], 0),
        # through the typer app
        (["status", "--json", "--json"], 0), (["unapply", "--json", "--json"], 0), (["status", "--help"], 0),
    ]
    for argv, code in commands:
        for streams in ("plain", "stdout=closed", "stdout=full", "stdout=pipe", "stderr=closed", "stderr=full"):
            yield Case("output", f"{' '.join(argv)}:{streams}", lambda c: None, argv, streams=streams, code=code,
                       recovery=True)


def _process(case: Case, root: Path, argv: list[str]) -> tuple[int | None, str, str]:
    """Run the case as a process with its streams; (exit code or -signal, stdout, stderr); None: a hang."""
    import subprocess
    import tempfile

    env = dict(os.environ, FORKTOOL_ROOT=str(root))
    cmd = [sys.executable, "-c", INTERRUPTER, ",".join(case.interrupt), *argv] if case.interrupt else \
        [sys.executable, "-m", "forktool", *argv]
    where, _, how = case.streams.partition("=")
    close = {"stdout": 1, "stderr": 2}.get(where) if how == "closed" else None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull, "rb") as null:
        streams: dict[str, Any] = {"stdout": out, "stderr": err}
        opened = []
        if how == "full":
            opened.append(open("/dev/full", "wb"))
            streams[where] = opened[-1]
        elif how == "pipe":  # a pipe whose reader has already gone, as after `| head -c 0`
            r, w = os.pipe()
            os.close(r)
            opened.append(os.fdopen(w, "wb"))
            streams[where] = opened[-1]
        try:
            p = subprocess.Popen(cmd, env=env, stdin=null, preexec_fn=(lambda: os.close(close)) if close else None,
                                 **streams)
            for f in opened:
                f.close()
            try:
                code: int | None = p.wait(timeout=TIME_LIMIT * 3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                code = None
        finally:
            for f in opened:
                f.close()
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def _process_outcome(case: Case, root: Path, argv: list[str], secs0: float) -> tuple[Outcome | None, str]:
    """The outcome of a signals or output case by its contract (docs/manual-cli.md), or None when it kept it."""
    import signal as sig

    code, out, err = _process(case, root, argv)
    secs = time.monotonic() - secs0
    text = err + out
    if code is None:
        return Outcome(case, None, "hang", secs, f"still running after {TIME_LIMIT * 3} s", text), text
    if "Traceback" in text or "internal error" in text or code == 3:
        return Outcome(case, code, "traceback", secs, _last_line(text), text), text
    if case.interrupt:
        if code != 130:
            return Outcome(case, code, "wrong-exit", secs, f"exit {code}, not 130 (was the moment reached?)", text), text
        if err.count("interrupted") != 1 or out.strip():
            return Outcome(case, code, "unclear", secs, f"not one line 'interrupted': {err!r} {out!r}", text), text
        return None, "interrupted"
    where, _, how = case.streams.partition("=")
    moves = argv[0] in ("apply", "unapply") or argv[:2] == ["backup", "create"]
    json_out = "--json" in argv or argv[-1] in ("--help", "--version")
    if where == "stdout" and json_out and case.code == 0:
        if how == "pipe":
            want, must = -sig.SIGPIPE, (("ran to its end",) if moves else ())
        else:
            want, must = 1, ("cannot write the output to stdout",) + (("ran to its end",) if moves else ())
    else:
        want, must = case.code, ()
    if code != want:
        return Outcome(case, code, "wrong-exit", secs, f"exit {code}, want {want}", text), text
    missing = [m for m in must if m not in err]
    if missing or (where == "stdout" and how == "pipe" and not must and "cannot write" in err):
        return Outcome(case, code, "unclear", secs, f"stderr {err!r}, want {must}", text), text
    if where == "stderr" and json_out and case.code == 0 and not out.strip():
        return Outcome(case, code, "unclear", secs, "stdout lost its output when stderr could not be written", text), text
    return None, "contract"



# ------------------------------------------------ family: caches that would vouch for a spoiled input
# Each case spoils an input so that a check fails from scratch, then forges what would make it pass: a
# validation or parse entry in the shared cache (laid out as earlier versions read it), the same in the
# project's own cache for `verify --no-cache`, or a stat-index row / verdict for an edited tree file. The
# command must still refuse. The shared cache is a copy per case, so forged entries never reach other cases.


def _private_cache(c: Ctx) -> Path:
    cache = c.work / "cache"
    shutil.copytree(c.tpl.cache, cache, symlinks=True)
    os.environ["FORKTOOL_CACHE"] = str(cache)  # run_case puts the template's back afterwards
    return cache


def _plant_checks(root: Path, name: str, doc: object, text: str, good: object) -> None:
    """Under root: `doc` passed schema `name` (also its digest-blind shapes), and `text` parses to `good`."""
    from forktool import cache as fcache
    from forktool import schema, schemas
    shapes = [(name, doc), (f"{name}#shape", schema.volatile_shape(doc, name)),
              (f"{name}#digests", schema.digest_shape(doc, name))]
    for label_, data in shapes:
        if data is None:
            continue
        blob = json.dumps([label_, schemas.SCHEMAS[name], data], sort_keys=True, separators=(",", ":"))
        key = hashlib.sha256(blob.encode()).hexdigest()
        entry = root / "validated" / key[:2] / key[2:]
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(key[2:])
    if text:
        key = fcache.key_of("yaml", fcache._yaml_fingerprint(), hashlib.sha256(text.encode()).hexdigest())
        fcache.Cache(root, "yaml").put(key, {"value": good})


def _spoil(rel: str, path: tuple, value: object, json_doc: bool) -> Callable[[Ctx], tuple[str, object, str, object]]:
    """Writes the document at rel with value at path; gives (schema name, spoiled doc, its text, the good doc)."""
    name = {"registry/UPSTREAM_SYNC.yaml": "registry", "vendor/vendor.lock": "vendor-lock",
            ".opencoti/state.json": "state", "vendor/vendor.yaml": "vendor"}[rel]

    def spoil(c: Ctx) -> tuple[str, object, str, object]:
        good = _json(c, rel) if json_doc else _yaml(c, rel)
        doc = set_at(copy.deepcopy(good), path, value)
        data = render(doc, json_doc)
        (c.root / rel).write_bytes(data)
        return name, doc, "" if json_doc else data.decode(), good
    return spoil


def cache_cases() -> Iterator[Case]:
    spoils = [
        ("registry/UPSTREAM_SYNC.yaml", ("patches", 0, "gates", 0, "timeout"), "abc", False, "timeout"),
        ("registry/UPSTREAM_SYNC.yaml", ("patches", 0, "gates", 0, "timeout"), -5, False, "timeout"),
        ("registry/UPSTREAM_SYNC.yaml", ("patches", 1, "status"), "nope", False, "status"),
        ("registry/UPSTREAM_SYNC.yaml", ("patches", 0, "build_impact"), ["gpu"], False, "build_impact"),
        ("registry/UPSTREAM_SYNC.yaml", ("hooks", "one", "sites", 0, "line"), "three", False, "line"),
        ("registry/UPSTREAM_SYNC.yaml", ("schema",), 2, False, "schema"),
        ("vendor/vendor.lock", ("pristine_files",), -1, True, "pristine_files"),
        ("vendor/vendor.lock", ("patched", "tree_digest"), "f" * 63, True, "tree_digest"),
        ("vendor/vendor.lock", ("pristine_digest",), "F" * 64, True, "pristine_digest"),
        (".opencoti/state.json", ("applied", 0, "sha256"), "0" * 63, True, "sha256"),
        (".opencoti/state.json", ("version",), 7, True, "version"),
        ("vendor/vendor.yaml", ("components", 0, "kind"), "svn", False, "kind"),
    ]
    for rel, path, value, json_doc, must in spoils:
        spoil = _spoil(rel, path, value, json_doc)
        what = f"{rel.rsplit('/', 1)[-1]}:{label(path)}={value!r}"
        commands = [["verify"], ["verify", "--no-cache"], ["status"]]
        if rel.startswith("registry/"):
            commands = [["verify"], ["verify", "--no-cache"], ["registry", "check"], ["gates", "--list"]]
        elif rel == "vendor/vendor.yaml":  # status reads the lock, not the pin
            commands = [["verify"], ["verify", "--no-cache"], ["vendor", "status"]]

        def shared(c: Ctx, spoil=spoil) -> None:
            _plant_checks(_private_cache(c), *spoil(c))

        def shared_parse_only(c: Ctx, spoil=spoil) -> None:
            name, doc, text, good = spoil(c)
            _plant_checks(_private_cache(c), name, good, text, good)

        def own(c: Ctx, spoil=spoil) -> None:
            _private_cache(c)
            _plant_checks(c.state / "cache", *spoil(c))
        for argv in commands:
            yield Case("caches", f"{what}+shared-validated:{' '.join(argv)}", shared, argv, must=(must,))
            if not json_doc:
                yield Case("caches", f"{what}+shared-parse:{' '.join(argv)}", shared_parse_only, argv, must=(must,))
        yield Case("caches", f"{what}+own-validated:verify --no-cache", own, ["verify", "--no-cache"], must=(must,))

    def edited(c: Ctx) -> Path:
        p = c.tree / "up/src/a.c"
        p.write_bytes(p.read_bytes().replace(b"return 2;", b"return 3;"))
        return p

    def forged_index(c: Ctx) -> None:
        from forktool import index
        _private_cache(c)
        run_cli(c.root, ["verify"])  # an index that trusts every file
        p = edited(c)
        rows, _ = index._load(c.state / "index", c.tree)
        st = p.stat()
        old = rows["up/src/a.c"]
        rows["up/src/a.c"] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, old[4], old[5])
        index._save(c.state / "index", c.tree, st.st_mtime_ns + 10 ** 10, rows)

    def flipped_verdict(c: Ctx) -> None:
        from forktool.cache import Cache
        _private_cache(c)
        edited(c)
        run_cli(c.root, ["verify"], expect=1)
        for q in (c.state / "cache" / "verdict").rglob("*.json"):
            raw = json.loads(q.read_text())
            Cache(c.state / "cache", "verdict").put(raw["key"], dict(raw["value"], ok=True, problems=[]))

    def forged_memo(c: Ctx) -> None:
        from forktool.cache import Memo
        cache = _private_cache(c)
        for q in (cache / "pristine-manifest").rglob("*"):
            if q.is_file():
                kind, key, value = marshal.loads(q.read_bytes().split(b"\n", 1)[1])
                Memo(cache, "pristine-manifest").put(key, {**value, "up/src/a.c": value["up/src/b.c"]})
        edited(c)
    for lbl, fn in [("forged-stat-index-row", forged_index), ("flipped-verdict", flipped_verdict),
                    ("forged-pristine-memo", forged_memo)]:
        yield Case("caches", f"tree-edited+{lbl}:verify --no-cache", fn, ["verify", "--no-cache"], must=("a.c",))
    yield Case("caches", "tree-edited+forged-pristine-memo:verify", forged_memo, ["verify"], must=("a.c",))


def sync_safety_cases() -> Iterator[Case]:
    """A stopped sync's backups and journals: prune keeps them, no link out is followed, no journal is guessed at."""
    def needed(c: Ctx) -> list[Path]:
        b = _sync_state(c)["backups"]
        return [c.state / "vendor-backups" / b["tree"], c.state / "sync-backups" / b["project"]]

    for keep in ("0", "1", "2", "10"):
        yield Case("sync-safety", f"prune-keep-{keep}", lambda c: None, ["backup", "prune", "--keep", keep],
                   stopped=True, kept=needed, succeeds=True)
    yield Case("sync-safety", "list", lambda c: None, ["backup", "list"], stopped=True, kept=needed, succeeds=True)

    def dir_link(name: str) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            shutil.move(c.state / name, c.canary / name)
            (c.state / name).symlink_to(c.canary / name)
        return setup

    def dir_file(name: str) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            shutil.move(c.state / name, c.canary / name)
            (c.state / name).write_text("not a directory\n")
        return setup

    def one_link(kind: str) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            d = c.state / ("vendor-backups" if kind == "tree" else "sync-backups")
            name = _sync_state(c)["backups"][kind]
            shutil.move(d / name, c.canary / name)
            (d / name).symlink_to(c.canary / name)
        return setup

    def spoil(kind: str, how: str) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            d = (c.state / ("vendor-backups" if kind == "tree" else "sync-backups")
                 / _sync_state(c)["backups"][kind])
            m = d / "manifest.json"
            if how == "manifest-gone":
                m.unlink()
            elif how == "manifest-garbage":
                m.write_text("{not json")
            elif how == "checksum":
                doc = json.loads(m.read_text())
                doc["reason"] += " (edited)"
                m.write_text(json.dumps(doc))
            elif how == "objects-gone":
                shutil.rmtree(d / "objects")
            elif how == "object-changed":
                obj = sorted(p for p in (d / "objects").rglob("*") if p.is_file())[0]
                obj.write_bytes(obj.read_bytes() + b"x")
        return setup

    def state_text(name: str, text: str) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            (c.state / "sync" / name).write_text(text)
        return setup

    def journal(where: str, raw: bytes) -> Callable[[Ctx], None]:
        def setup(c: Ctx) -> None:
            tdir = c.state / where
            (tdir / "new").mkdir(parents=True)
            (tdir / "plan.json").write_bytes(raw)
        return setup

    loop = (["sync", "--abort"], ["sync", "--continue"], ["sync", "--skip"])
    backups = (["backup", "list"], ["backup", "prune", "--keep", "0"])
    specials: list[tuple[str, Callable[[Ctx], None], tuple[str, ...], tuple[list[str], ...]]] = [
        ("sync-backups-symlinked", dir_link("sync-backups"), ("symlink",), (["sync", "--abort"], *backups)),
        ("vendor-backups-symlinked", dir_link("vendor-backups"), ("symlink",), (["sync", "--abort"], *backups)),
        ("sync-backups-a-file", dir_file("sync-backups"), ("sync-backups",), (["sync", "--abort"], *backups)),
        ("vendor-backups-a-file", dir_file("vendor-backups"), ("vendor-backups",), (["sync", "--abort"], *backups)),
        ("project-backup-symlinked", one_link("project"), ("symlink",), (["sync", "--abort"],)),
        ("tree-backup-symlinked", one_link("tree"), ("symlink",), (["sync", "--abort"],)),
        ("state-garbage", state_text("state.json", "{not json"), ("state.json",),
         (["backup", "prune", "--keep", "0"], *loop)),
        ("state-empty", state_text("state.json", ""), ("state.json",), (["backup", "prune", "--keep", "0"],)),
        ("undo-garbage", state_text("undo.json", "[1]"), ("undo.json",), (["backup", "prune", "--keep", "0"],)),
        ("sync-journal-garbage", journal("sync/txn", b"{not json"), ("journal",), (*loop, ["recover"])),
        ("sync-journal-foreign", journal("sync/txn", b'{"entries": [], "state": {}, "by": "other"}'),
         ("journal",), (*loop, ["recover"])),
        ("project-journal-garbage", journal("sync-txn/txn", b"{not json"), ("journal",),
         (["apply"], ["backup", "create", "x"], ["backup", "restore", "@SYNC_BACKUP@"], ["recover"])),
        ("project-journal-foreign", journal("sync-txn/txn", b'{"entries": [], "state": {}, "by": "other"}'),
         ("journal",), (["apply"], ["recover"])),
        ("project-journal-symlinked", dir_link_target("sync-txn"), ("symlink",), (["apply"], ["recover"])),
        ("restore-during-sync", lambda c: None, ("in progress",), (["backup", "restore", "@SYNC_BACKUP@"],)),
    ]
    for how in ("manifest-gone", "manifest-garbage", "checksum", "objects-gone", "object-changed"):
        specials.append((f"project-backup-{how}", spoil("project", how), ("backup",), (["sync", "--abort"],)))
        specials.append((f"tree-backup-{how}", spoil("tree", how), ("backup",), (["sync", "--abort"],)))
    for lbl, setup, must, commands in specials:
        for argv in commands:
            yield Case("sync-safety", f"{lbl}:{' '.join(argv)}", setup, list(argv), must=must, stopped=True)
    for lbl, name in [("empty", "sync/"), ("dotdot", "sync/.."), ("nested", "sync/a/b"), ("unknown", "sync/nope"),
                      ("nul", "sync/a\u0000b")]:
        yield Case("sync-safety", f"restore-name-{lbl}", lambda c: None, ["backup", "restore", name], must=("backup",))


def dir_link_target(name: str) -> Callable[[Ctx], None]:
    """.opencoti/<name> made a symlink to a directory outside the project (the target exists, empty)."""
    def setup(c: Ctx) -> None:
        (c.canary / name / "new").mkdir(parents=True)
        (c.state / name).symlink_to(c.canary / name)
    return setup


def all_cases() -> list[Case]:
    return [*config_families(), *journal_cases(), *backup_cases(), *patch_cases(), *series_cases(),
            *tree_cases(), *state_dir_cases(), *sdist_cases(), *cli_cases(), *sync_state_cases(), *signal_cases(),
            *output_cases(), *cache_cases(), *sync_safety_cases()]


# ---------------------------------------------------------------- running a case

VICTIMS = [Path("/tmp/forktool-evil.txt"), Path("/tmp/forktool-pwn.c"), Path("/outside.txt")]


class CaseTimeout(BaseException):
    """Raised by the alarm inside a case that runs too long (a hang)."""


def fingerprint(top: Path, skip: tuple[Path, ...] = ()) -> dict[bytes, tuple]:
    """path -> (type, content digest or link target), from lstat; never opens anything but regular files."""
    out: dict[bytes, tuple] = {}
    btop = os.fsencode(top)
    bskip = {os.fsencode(s) for s in skip}
    if not os.path.lexists(btop):
        return out
    stack = [btop]
    while stack:
        d = stack.pop()
        if d in bskip:
            continue
        st = os.lstat(d)
        rel = os.path.relpath(d, btop)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(d))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode) & 0o700)
            try:
                stack.extend(os.path.join(d, n) for n in os.listdir(d))
            except PermissionError:
                pass
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(d, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[rel] = ("file", h.hexdigest(), bool(st.st_mode & stat.S_IXUSR))
        else:
            out[rel] = ("special", stat.S_IFMT(st.st_mode))
    return out


def _sync_backup_name(root: Path) -> str:
    """sync/NAME of the stopped sync's project backup, as `backup restore` takes it ('' when there is none)."""
    try:
        return "sync/" + json.loads((root / SYNC_STATE).read_text())["backups"]["project"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "sync/none"


def _alarm(signum: int, frame: object) -> None:
    raise CaseTimeout()


def run_case(case: Case, base: Path, n: int) -> Outcome:
    tpl = template(base / "template")
    work = base / "cases" / f"{n:04d}" / "w1" / "w2"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    root = work / "proj"
    canary = work / "canary"
    canary.mkdir()
    (canary / "victim.txt").write_text("precious\n")
    cache = tpl.cache
    if case.fresh:
        root.mkdir()
        cache = work / "cache"
    else:
        shutil.copytree(tpl.stopped if case.stopped else tpl.root, root, symlinks=True)
    ctx = Ctx(root, canary, tpl, work)
    old_cache = os.environ.get("FORKTOOL_CACHE")
    os.environ["FORKTOOL_CACHE"] = str(cache)
    try:
        try:
            case.setup(ctx)
        except Exception as e:  # the corpus itself is wrong: never count it as the tool's outcome
            return Outcome(case, None, "setup-error", 0.0, f"{type(e).__name__}: {e}")
        argv = [a.replace("@BACKUP@", tpl.backup).replace("@SDIST@", str(work / "pkg-1.0.tar.gz")) for a in case.argv]
        if "@SYNC_BACKUP@" in argv:
            argv[argv.index("@SYNC_BACKUP@")] = _sync_backup_name(root)
        tree = root / "vendor" / "llamafile"
        outside_before = fingerprint(base / "cases" / f"{n:04d}", skip=(root, work / "cache"))
        inputs_before = fingerprint(root, skip=(root / ".opencoti", tree, root / "build"))
        tree_before = fingerprint(tree)
        kept = case.kept(ctx) if case.kept is not None else []
        kept_before = [fingerprint(k) for k in kept]
        victims_before = [v.exists() for v in VICTIMS]
        t0 = time.monotonic()
        if case.interrupt or case.streams:
            outcome, kind = _process_outcome(case, root, argv, t0)
            if outcome is not None:
                return outcome
            secs = time.monotonic() - t0
            if fingerprint(base / "cases" / f"{n:04d}", skip=(root, work / "cache")) != outside_before or \
                    [v.exists() for v in VICTIMS] != victims_before:
                return Outcome(case, None, "outside", secs, "wrote outside the project")
            # what was interrupted or could not print is finished or undone by the next commands
            for after in ([["sync", "--abort"]] if case.stopped else []) + [["status"], ["apply"], ["verify"]]:
                code, out, err = run_cli(root, after, expect=None)
                if code != 0:
                    return Outcome(case, code, "not-recovered", secs, f"then `{' '.join(after)}` exited {code}: "
                                   f"{_last_line(err)}", err)
            return Outcome(case, None, kind, secs)
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT)
        raw_err = io.StringIO()
        try:
            with contextlib.redirect_stderr(raw_err):  # click writes its usage errors to sys.stderr
                code, out, err = run_cli(root, argv, expect=None)
            err += raw_err.getvalue()
        except CaseTimeout:
            return Outcome(case, None, "hang", time.monotonic() - t0, f"still running after {TIME_LIMIT} s")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        secs = time.monotonic() - t0
        text = err + out
        if code == 3 or "Traceback" in text or "internal error" in text:
            return Outcome(case, code, "traceback", secs, _last_line(text), text)
        if fingerprint(base / "cases" / f"{n:04d}", skip=(root, work / "cache")) != outside_before or \
                [v.exists() for v in VICTIMS] != victims_before:
            return Outcome(case, code, "outside", secs, "wrote outside the project", text)
        if fingerprint(tree) != tree_before:
            return Outcome(case, code, "tree-changed", secs, "the vendored tree changed", text)
        if fingerprint(root, skip=(root / ".opencoti", tree, root / "build")) != inputs_before:
            return Outcome(case, code, "inputs-changed", secs, "a project file changed", text)
        lost = [str(k.relative_to(root)) for k, fp in zip(kept, kept_before, strict=True)
                if fingerprint(k) != fp or not fp]
        if lost:
            return Outcome(case, code, "lost", secs, f"what a sync needs changed or went: {', '.join(lost)}", text)
        if case.succeeds and code == 0:
            return Outcome(case, code, "kept", secs, "", text)
        if code == 0:
            return Outcome(case, code, "success", secs, "accepted: exit 0", text)
        if code not in case.expect:
            return Outcome(case, code, "wrong-exit", secs, f"exit {code}", text)
        missing = [m for m in case.must if m.lower() not in text.lower()]
        if missing:
            return Outcome(case, code, "unclear", secs, f"message does not name {missing}: {_last_line(text)}", text)
        return Outcome(case, code, "refusal" if code == 1 else "usage", secs, "", text)
    finally:
        if old_cache is None:
            os.environ.pop("FORKTOOL_CACHE", None)
        else:
            os.environ["FORKTOOL_CACHE"] = old_cache
        _cleanup(base / "cases" / f"{n:04d}")


def _cleanup(d: Path) -> None:
    for p in d.rglob("*") if d.exists() else []:
        try:
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        except OSError:
            pass
    shutil.rmtree(d, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:200] if lines else ""


def main() -> int:
    import argparse
    import tempfile
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--family", help="only this family")
    ap.add_argument("--show", default="", help="comma-separated outcomes to list case by case")
    ap.add_argument("--json", help="append every outcome here, one JSON line per case")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="forktool-corpus-") as tmp:
        base = Path(tmp)
        template(base / "template")
        cases = [c for c in all_cases() if not args.family or c.family == args.family]
        table: Counter[tuple[str, str]] = Counter()
        results = []
        t0 = time.monotonic()
        for n, case in enumerate(cases):
            o = run_case(case, base, n)
            table[(case.family, o.kind)] += 1
            results.append({"case": case.id, "outcome": o.kind, "code": o.code, "seconds": round(o.seconds, 3),
                            "detail": o.detail})
            if args.json:  # one line per case as it ends, so a long run can be read while it goes
                with open(args.json, "a") as f:
                    f.write(json.dumps(results[-1]) + "\n")
            if o.kind in args.show.split(","):
                print(f"{o.kind:15} {case.id}: {o.detail}", file=sys.stderr)
        families = sorted({f for f, _ in table})
        kinds = sorted({k for _, k in table})
        print(f"{len(cases)} cases in {time.monotonic() - t0:.0f} s")
        print("| family | " + " | ".join(kinds) + " | total |")
        print("|---|" + "---|" * (len(kinds) + 1))
        for f in families:
            row = [table[(f, k)] for k in kinds]
            print(f"| {f} | " + " | ".join(str(x) for x in row) + f" | {sum(row)} |")
        tot = [sum(table[(f, k)] for f in families) for k in kinds]
        print("| all | " + " | ".join(str(x) for x in tot) + f" | {sum(tot)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
