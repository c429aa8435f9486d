"""Hook sites from a real C++ parse: snippets that trip a brace scanner, and the real vendored files."""

from __future__ import annotations

from pathlib import Path

import pytest

from forktool import registry as rg
from forktool import symbols
from forktool.cache import Cache
from forktool.markers import scan_file
from forktool.symbols import FILE_SCOPE, enclosing_symbol, find_symbol, scopes, site_symbol
from tests.helpers.cli import run_cli
from tests.helpers.project import Proj, copy_real_project


def line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def test_digit_separators_do_not_open_a_char_literal():
    src = ("int size() {\n    return 1'000'000;\n}\n\n"
           "int after(int x) {\n    int y = 0x1'F;\n    return x + y; // here\n}\n")
    assert enclosing_symbol(src, line_of(src, "// here")) == "after"
    assert find_symbol(src, "after") == 5 and find_symbol(src, "size") == 1


def test_raw_strings_with_braces_and_quotes():
    src = ('static const char * k = R"json({ "a": "}}}" })json";\n'
           'const char * t = R"(\n  } ) " {\n)";\n\n'
           "void f() {\n    int x = 1; // here\n}\n")
    assert enclosing_symbol(src, line_of(src, "// here")) == "f"
    assert find_symbol(src, "f") == line_of(src, "void f()") == 6


def test_templates_and_specialisations():
    src = ("template <typename T, int N = 3>\n"
           "struct box : base<T> {\n"
           "    T get() const { return v; } // in get\n"
           "    T v;\n"
           "};\n\n"
           "template <>\n"
           "int box<int>::get() const {\n"
           "    return 0; // in spec\n"
           "}\n\n"
           "template <typename T>\nstatic T twice(T x) {\n    return x + x; // in twice\n}\n")
    assert enclosing_symbol(src, line_of(src, "// in get")) == "box::get"
    assert enclosing_symbol(src, line_of(src, "// in spec")) == "box<int>::get"
    assert enclosing_symbol(src, line_of(src, "// in twice")) == "twice"
    assert find_symbol(src, "box") == 1  # a definition starts at its template<> line
    assert find_symbol(src, "twice") == line_of(src, "template <typename T>\nstatic")


def test_macros_around_function_heads():
    src = ("#define MY_API __attribute__((visibility(\"default\")))\n"
           "#define DEPRECATED(func, hint) func __attribute__((deprecated(hint)))\n"
           "extern \"C\" {\n"
           "LLAMA_API int exported(int a);\n"
           "DEPRECATED(LLAMA_API int old_one(int a, int b), \"use exported (it is newer)\");\n"
           "MY_API struct thing * make_thing(void);\n"
           "struct thing {\n    int n; // in thing\n};\n"
           "}\n"
           "MY_API int defined_here(int a) {\n    return a; // in defined_here\n}\n"
           "GGML_CALL_LIKE(x) {\n    int not_a_function; // in macro block\n}\n")
    assert enclosing_symbol(src, line_of(src, "// in thing")) == "thing"
    assert enclosing_symbol(src, line_of(src, "// in defined_here")) == "defined_here"
    assert enclosing_symbol(src, line_of(src, "// in macro block")) is None
    assert enclosing_symbol(src, line_of(src, "LLAMA_API int exported")) is None  # a declaration only
    assert site_symbol(src, line_of(src, "extern \"C\"")) == FILE_SCOPE
    assert site_symbol(src, line_of(src, "DEPRECATED(LLAMA_API")) == "thing"  # the next definition, 2 lines down


def test_nested_namespaces_and_classes():
    src = ("namespace outer { namespace inner::deeper {\n"
           "class widget {\n"
           "public:\n"
           "    struct part {\n"
           "        void spin() {\n"
           "            n++; // in spin\n"
           "        }\n"
           "        int n = 0; // in part\n"
           "    };\n"
           "    widget() : p() {} // ctor\n"
           "    ~widget();\n"
           "private:\n"
           "    part p;\n"
           "};\n"
           "widget::~widget() {\n    // in dtor\n}\n"
           "} }\n"
           "void free_fn() {\n    struct local { int a; };\n    local l{1}; // in free_fn\n}\n")
    assert enclosing_symbol(src, line_of(src, "// in spin")) == "widget::part::spin"
    assert enclosing_symbol(src, line_of(src, "// in part")) == "part"
    assert enclosing_symbol(src, line_of(src, "// ctor")) == "widget::widget"
    assert enclosing_symbol(src, line_of(src, "// in dtor")) == "widget::~widget"
    assert enclosing_symbol(src, line_of(src, "// in free_fn")) == "free_fn"
    assert [s.kind for s in scopes(src) if s.name in ("outer", "inner::deeper")] == ["namespace", "namespace"]


def test_scopes_cached_by_digest_and_a_forged_entry_is_ignored(tmp_path: Path):
    src = b"int one() {\n    return 1;\n}\n"
    cache = Cache(tmp_path, "scopes")
    symbols._scopes.cache_clear()
    first = scopes(src, cache)
    assert cache.misses == 1 and list((tmp_path / "scopes").rglob("*.json"))
    symbols._scopes.cache_clear()
    assert scopes(src, cache) == first and cache.hits == 1
    entry = next((tmp_path / "scopes").rglob("*.json"))
    entry.write_text(entry.read_text().replace('"one"', '"two"'))  # checksum no longer matches
    symbols._scopes.cache_clear()
    assert scopes(src, cache) == first and first[0].name == "one"


@pytest.mark.integration
def test_the_registry_sites_of_the_real_series_resolve(tmp_path: Path, session_cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FORKTOOL_CACHE", str(session_cache))
    root = copy_real_project(tmp_path / "proj")
    run_cli(root, ["vendor", "fetch"])
    run_cli(root, ["apply"])
    p = Proj(root, Path("/nonexistent"))
    reg = rg.load(root / "registry" / "UPSTREAM_SYNC.yaml")
    resolved = 0
    for hid, hook in reg.hooks.items():
        for site in hook.sites:
            data = (p.tree / site.file).read_bytes()
            here = [m.line for m in scan_file(site.file, data) if m.hook == hid]
            assert site.symbol in {site_symbol(data, n) for n in here}, (hid, site)
            if site.line is not None and site.symbol != FILE_SCOPE:
                assert find_symbol(data, site.symbol) == site.line, (hid, site)
            resolved += 1
    assert resolved == sum(len(h.sites) for h in reg.hooks.values()) > 50
    # the big upstream files parse into sensible scopes: known functions at their definitions
    kv = (p.tree / "llama.cpp/src/llama-kv-cache.cpp").read_text()
    assert find_symbol(kv, "llama_kv_cache::llama_kv_cache") == line_of(kv, "\nllama_kv_cache::llama_kv_cache(") + 1
    llama_h = (p.tree / "llama.cpp/include/llama.h").read_text()
    assert enclosing_symbol(llama_h, line_of(llama_h, "struct llama_sampler_i {") + 1) == "llama_sampler_i"
    assert enclosing_symbol(llama_h, line_of(llama_h, "llama_model_load_from_file(")) is None
