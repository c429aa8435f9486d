"""API drift, named: the upstream declarations a patch's added lines use that changed between two upstreams."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from forktool.cache import Cache
from forktool.symbols import declarations
from forktool.sync.apidrift import Upstream, api_drift, closure, used_names
from tests.helpers.project import Proj, git
from tests.helpers.sync import sync_patch as make_patch

API_H = """\
#pragma once
#include <stddef.h>
#define API_MAX 4
typedef struct iface * iface_t;
struct iface {
    const char * (*get_name)(void * self);
    size_t (*get_size)(void * self);
};
int api_init(int n);
int api_gone(void);
int api_same(int a);
struct state {
    int used;
    int spare;
};
"""
# the new upstream: iface gained two members, api_init takes another argument, api_gone went, API_MAX grew,
# api_same only renamed its parameter, state lost `spare`
API_H_NEW = """\
#pragma once
#include <stddef.h>
#define API_MAX 8
typedef struct iface * iface_t;
struct iface {
    const char * (*get_name)(void * self);
    void * (*alloc)(void * self, size_t n);
    size_t (*get_size)(void * self);
    int flags;
};
int api_init(int n, float scale);
int api_same(int b);
struct state {
    int used;
};
"""
USE_C = '#include "../include/api.h"\n\nint use(struct state * s)\n{\n    return s->used;\n}\n'
USE_C_PATCHED = USE_C.replace("    return s->used;\n", (
    "    static struct iface mine = { 0, 0 }; // opencoti-hook: use-iface\n"
    "    int k = api_init(API_MAX) + api_gone() + api_same(1); /* api_unused() in a comment */\n"
    "    const char * msg = \"api_in_a_string\";\n"
    "    return k + s->used + s->spare + (msg != 0);\n"))


def upstream(files: dict[str, str]) -> Upstream:
    return Upstream(frozenset(files), lambda rel: files[rel].encode() if rel in files else None)


OLD = {"up/include/api.h": API_H, "up/src/use.c": USE_C, "up/src/other.c": "int other(void) { return 0; }\n"}
NEW = dict(OLD, **{"up/include/api.h": API_H_NEW})
PATCH = make_patch("0073-use.patch", "use the api", [("up/src/use.c", USE_C.encode(), USE_C_PATCHED.encode())])


def test_a_synthetic_upstream_move_is_named():
    found = {d.name: d for d in api_drift(upstream(OLD), upstream(NEW), PATCH)}
    assert set(found) == {"iface", "api_init", "api_gone", "API_MAX", "state::spare"}
    assert found["iface"].line == "0073 uses `iface`: upstream added 2 members (alloc, flags)"
    assert (found["iface"].added, found["iface"].removed) == (["alloc", "flags"], [])
    assert found["api_init"].kind == "function" and found["api_init"].change == "changed"
    assert "`int api_init(int )` -> `int api_init(int , float )`" in found["api_init"].detail
    assert found["api_gone"].change == "removed" and "declared in up/include/api.h" in found["api_gone"].detail
    assert found["API_MAX"].detail == "upstream changed its definition: `#define API_MAX 4` -> `#define API_MAX 8`"
    # `struct state` stands in context lines only; the added lines name its member, which upstream removed
    assert (found["state::spare"].kind, found["state::spare"].change) == ("member", "removed")
    assert found["state::spare"].line == "0073 uses `state::spare`: upstream removed this member of struct state"
    # a renamed parameter is no change; names in comments and strings are not uses
    assert "api_same" not in found
    assert not {"api_unused", "api_in_a_string"} & used_names(PATCH)


def test_the_same_upstream_gives_nothing_and_a_moved_declaration_is_found():
    assert api_drift(upstream(OLD), upstream(OLD), PATCH) == []
    # api_gone moved to another header that use.c does not include: not removed, found elsewhere
    moved = dict(NEW, **{"up/include/more.h": "#pragma once\nint api_gone(void);\n"})
    found = {d.name: d for d in api_drift(upstream(OLD), upstream(moved), PATCH)}
    assert "api_gone" not in found
    moved["up/include/more.h"] = "#pragma once\nlong api_gone(int);\n"
    found = {d.name: d for d in api_drift(upstream(OLD), upstream(moved), PATCH)}
    assert found["api_gone"].change == "changed" and "now declared in up/include/more.h" in found["api_gone"].detail


def test_a_member_the_patch_names_is_reported_on_its_own():
    # the patch names iface's member get_size (x.get_size = ...) but not the struct itself
    body = USE_C.replace("    return s->used;\n", "    extern void * t; ((struct iface *) t)->get_size(0);\n"
                                                   "    return s->used;\n").replace("struct iface", "iface_t")
    p = make_patch("0074-m.patch", "member", [("up/src/use.c", USE_C.encode(), body.encode())])
    new = dict(OLD, **{"up/include/api.h": API_H.replace("size_t (*get_size)(void * self);",
                                                         "long (*get_size)(const void * self);")})
    found = {d.name: d for d in api_drift(upstream(OLD), upstream(new), p)}
    assert found["iface::get_size"].kind == "member" and found["iface::get_size"].change == "changed"


def test_a_std_qualified_name_is_not_upstreams_type_of_the_same_name():
    # llama.cpp's common/jinja/string.h declares `struct string`; 0.3.30 changed its append(): a patch that
    # writes std::string used the standard library's type, not that one (the trial said "0070 uses `string`")
    hdr = "#pragma once\nstruct string {\n    string & append(const string & other);\n};\n"
    use = '#include "string.h"\n\nint f(void)\n{\n    return 0;\n}\n'
    old = {"up/common/string.h": hdr, "up/common/use.cpp": use}
    new = dict(old, **{"up/common/string.h": hdr.replace("string & append", "string append")})
    body = use.replace("    return 0;\n", "    const std::string & v = ::std::string(); std::vector<string> mine;\n"
                                           "    return (int) v.size() + (int) mine.size();\n")
    p = make_patch("0070-std.patch", "std", [("up/common/use.cpp", use.encode(), body.encode())])
    assert "string" in used_names(p)  # std::vector<string> names upstream's own `string`
    assert [d.name for d in api_drift(upstream(old), upstream(new), p)] == ["string"]
    only_std = body.replace("std::vector<string> mine;", "std::vector<int> mine;")
    p = make_patch("0070-std.patch", "std", [("up/common/use.cpp", use.encode(), only_std.encode())])
    assert "string" not in used_names(p) and {"v", "mine", "size"} <= used_names(p)
    assert api_drift(upstream(old), upstream(new), p) == []


def test_includes_are_followed_by_their_path():
    files = {"a/x.c": '#include "inc/y.h"\n', "a/inc/y.h": '#include <z.h>\n', "b/inc/y.h": "", "c/z.h": "",
             "c/w.h": ""}
    assert closure(upstream(files), ["a/x.c"]) == ["a/x.c", "a/inc/y.h", "c/z.h"]


def test_declarations_are_cached_by_digest(tmp_path: Path):
    from forktool import symbols
    symbols._declarations_of.cache_clear()
    cache = Cache(tmp_path, "declarations")
    first = declarations(API_H.encode(), cache)
    assert cache.misses >= 1
    symbols._declarations_of.cache_clear()
    again = declarations(API_H.encode(), cache)
    assert again == first and cache.hits >= 1
    assert first["iface"].members[0][0] == "get_name" and first["api_init"].kind == "function"


def api_move(proj: Proj) -> str:
    """The project pinned at an upstream with api.h, PATCH applied; a newer upstream commit where api.h moved."""
    up = proj.upstream
    (up / "include" / "api.h").write_text(API_H)
    (up / "src" / "use.c").write_text(USE_C)
    git(up, "add", "-A")
    git(up, "commit", "-qm", "api")
    base = git(up, "rev-parse", "HEAD")
    yml = proj.root / "vendor" / "vendor.yaml"
    yml.write_text("\n".join(ln if not ln.startswith("    commit:") else f"    commit: {base}"
                             for ln in yml.read_text().splitlines()) + "\n")
    (proj.root / "vendor" / "vendor.lock").unlink()
    shutil.rmtree(proj.tree)
    proj.run("vendor", "fetch")
    proj.write_patch(PATCH.name, PATCH.raw.decode())
    proj.run("apply")
    (up / "include" / "api.h").write_text(API_H_NEW)
    git(up, "commit", "-qam", "api moves")
    return git(up, "rev-parse", "HEAD")


def test_the_trial_report_lists_it_and_needs_a_human(proj: Proj, tmp_path: Path):
    """A patch that applies cleanly on an upstream whose struct gained members: the trial names it."""
    new = api_move(proj)
    code, out, err = proj.run("sync", "--to", new, "--out", str(tmp_path / "o"), "--json", expect=None)
    data = json.loads(out)
    assert data["patches"][0]["status"] == "clean" and data["needs_human"] is True
    lines = [d["line"] for d in data["patches"][0]["api"]]
    assert "0073 uses `iface`: upstream added 2 members (alloc, flags)" in lines
    md = (tmp_path / "o" / "report.md").read_text()
    assert "## Upstream API the patches use that changed" in md
    assert "0073 uses `iface`: upstream added 2 members (alloc, flags)" in md


@pytest.mark.slow
def test_the_port_to_0_3_35_names_what_its_patches_lose(monkeypatch):
    """The real series on the real 0.3.35: the helper 0072 calls is gone there, as the port found by hand."""
    if not os.environ.get("FORKTOOL_CACHE"):
        monkeypatch.setenv("FORKTOOL_CACHE", str(Path.home() / ".cache" / "forktool"))
    from forktool import series, vendor
    from forktool.project import Project
    from forktool.sync.fetch import fetch_target, pinned_manifest, resolve_spec
    from forktool.workspace import load_patches
    project = Project(Path(__file__).parents[1])
    old, new = resolve_spec(project, "llama-cpp-python==0.3.35")
    pinned = pinned_manifest(project)
    target = fetch_target(project, old, new, pinned)
    store = vendor.objects(project)

    def reader(m):
        return lambda rel: store.get(m[rel].sha256) if rel in m else None
    patches = {p.id: p for p in load_patches(project, series.read_series(project.series_file))}
    o, n = Upstream(frozenset(pinned), reader(pinned)), Upstream(frozenset(target.manifest), reader(target.manifest))
    found = {d.name: d for d in api_drift(o, n, patches["0072"])}
    assert found["llama_clear_tensor_data"].change == "removed"
    assert "get_stream" in found["llama_kv_cache"].removed


def test_the_loop_shows_it_for_a_patch_it_carries_without_a_stop(proj: Proj, tmp_path: Path):
    code, out, err = proj.run("sync", "--to", api_move(proj), "--start", expect=None)
    assert "api drift: 0073 uses `iface`: upstream added 2 members (alloc, flags)" in out + err
