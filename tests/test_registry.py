"""registry check: each way registry, series, patches and tree can disagree is caught and named."""

from __future__ import annotations

import signal

import pytest
import yaml

from tests.helpers.cli import signal_at
from tests.helpers.patches import make_patch
from tests.helpers.project import Proj
from tests.helpers.registry import CTX, CTX1, CUDA, REG, write_reg


def problems(p: Proj) -> list[str]:
    res = p.json("registry", "check", expect=None)
    return [f"{x['where']}: {x['what']}" for x in res["problems"]]


def mutated(**changes) -> dict:
    import copy
    r = copy.deepcopy(REG)
    for path, value in changes.items():
        obj = r
        keys = path.split(".")
        for k in keys[:-1]:
            obj = obj[int(k)] if k.isdigit() else obj[k]
        obj[keys[-1]] = value
    return r


def test_clean_registry_passes_and_verify_runs_it(rp: Proj):
    assert problems(rp) == []
    rp.run("apply")
    rp.run("verify")
    out = rp.json("markers")["markers"]
    assert [(m["file"], m["hook"]) for m in out] == [("up/src/ctx.c", "ctx-window")] * 2


def test_patch_missing_from_registry(rp: Proj):
    write_reg(rp, mutated(patches=[]) | {"hooks": {}})
    assert any("missing from registry" in x for x in problems(rp))


def test_registered_patch_not_in_series(rp: Proj):
    (rp.root / "patches" / "series").write_text("")
    assert any("not in patches/series" in x for x in problems(rp))


def test_undeclared_file(rp: Proj):
    write_reg(rp, mutated(**{"patches.0.files": []}))
    assert any("touches up/src/ctx.c, which its entry does not declare" in x for x in problems(rp))


def test_build_impact_contradicted(rp: Proj):
    cu = make_patch("0070-ctx-window.patch", {"up/src/ctx.c": (CTX, CTX1),
                                              "up/ggml/src/ggml-cuda/k.cu": (CUDA, CUDA.replace("0", "1"))},
                    "ctx window", "ctx-window")
    (rp.root / "patches" / "0070-ctx-window.patch").write_text(cu)
    write_reg(rp, mutated(**{"patches.0.files": ["up/ggml/src/ggml-cuda/k.cu", "up/src/ctx.c"]}))
    assert any("declared build impact ['host']" in x and "ggml-cuda" in x for x in problems(rp))


def test_registered_hook_without_marker_at_site(rp: Proj):
    r = mutated()
    r["hooks"]["ctx-window"]["sites"].append({"file": "up/src/ctx.c", "symbol": "ctx_run"})
    write_reg(rp, r)
    assert any("ctx_run" in x and "no marker inside the declared symbol" in x for x in problems(rp))


def test_marker_outside_declared_symbol(rp: Proj):
    r = mutated()
    r["hooks"]["ctx-window"]["sites"] = [{"file": "up/src/ctx.c", "symbol": "ctx_init"}]
    write_reg(rp, r)
    assert any("up/src/ctx.c:3" in x and "outside its declared site" in x for x in problems(rp))


def test_unregistered_marker_in_tree(rp: Proj):
    rp.run("apply")
    rp.edit("up/src/ctx.c", "    return c->a;\n", "    return c->a; // opencoti-hook: stray\n")
    assert any("(tree)" in x and "'stray'" in x for x in problems(rp))


def test_a_marker_deleted_from_the_tree_is_not_called_at_its_site(rp: Proj):
    rp.run("apply")
    rp.edit("up/src/ctx.c", "    c->window = 0; // opencoti-hook: ctx-window\n", "    c->window = 0;\n")
    code, out, err = rp.run("registry", "check")
    # the sites are checked on the series; the tree's edit is not, and the report says so instead of OK for it
    assert "registry: OK (1 patches, 1 hooks, all markers at their sites)" in err
    assert "not checked: the sites of the markers in the 1 file(s) of the tree that no patch explains" in err
    assert rp.json("registry", "check")["not_checked"] == ["tree"]
    rp.run("verify", expect=1)
    rp.edit("up/src/ctx.c", "    c->window = 0;\n", "    c->window = 0; // opencoti-hook: ctx-window\n")
    code, out, err = rp.run("registry", "check")
    assert "not checked" not in err and rp.json("registry", "check")["not_checked"] == []


@pytest.mark.parametrize("typo", ["opencoti-hook ctx-run", "opencoti-hok: ctx-run", "OPENCOTI-HOOK: ctx-run",
                                  "opencoti_hook: ctx-run", "opencoti-hook:"])
def test_a_marker_with_a_typo_is_named_not_ignored(rp: Proj, typo: str):
    extra = CTX1.replace("    return c->a;\n", f"    return c->a + 1; // {typo}\n")
    (rp.root / "patches" / "0070-ctx-window.patch").write_text(
        make_patch("0070-ctx-window.patch", {"up/src/ctx.c": (CTX, extra)}, "ctx window", "ctx-window"))
    got = problems(rp)
    # it once passed as a hunk with no marker: the hook it meant silently did not exist
    assert any("up/src/ctx.c hunk #" in x and "is not a marker" in x and typo.split()[0] in x for x in got), got


def test_a_failing_check_shows_each_place_as_written_and_says_what_to_do(rp: Proj):
    write_reg(rp, mutated(**{"hooks.ctx-window.sites": [{"file": "up/src/ctx.c", "symbol": "x[red]y[/red]"}]}))
    code, out, err = rp.run("registry", "check", expect=1)
    # the symbol was read as markup and shown as "xy"
    assert "site up/src/ctx.c x[red]y[/red]: no marker inside the declared symbol" in err
    assert "error: registry check found 3 problem(s)" in err and "then run `forktool registry check` again" in err
    assert rp.json("registry", "check", expect=1)["error"] == "registry check found 3 problem(s)"


def test_a_missing_registry_names_the_way_to_start_one_and_that_way_works(rp: Proj):
    reg = rp.root / "registry" / "UPSTREAM_SYNC.yaml"
    reg.unlink()
    code, out, err = rp.run("registry", "check", expect=1)
    assert "UPSTREAM_SYNC.yaml not found" in err  # the hint said only "the registry lives there"
    assert "write `schema: 1`, `patches: []` and `hooks: {}` there and run `forktool apply --reanchor`" in err
    reg.write_text("schema: 1\npatches: []\nhooks: {}\n")
    rp.run("apply", "--reanchor")
    assert problems(rp) == []


def test_unregistered_marker_in_patch(rp: Proj):
    extra = CTX1.replace("    return c->a;\n", "    return c->a;\n    // opencoti-hook: ghost\n")
    (rp.root / "patches" / "0070-ctx-window.patch").write_text(
        make_patch("0070-ctx-window.patch", {"up/src/ctx.c": (CTX, extra)}, "ctx window", "ctx-window"))
    got = problems(rp)
    assert any("'ghost'" in x and "nobody registered" in x for x in got)
    assert any("does not list" in x for x in got)


def test_marker_on_an_upstream_line(rp: Proj):
    edited = CTX1.replace("    return c->a;\n", "    return c->a; // opencoti-hook: ctx-window\n")
    (rp.root / "patches" / "0070-ctx-window.patch").write_text(
        make_patch("0070-ctx-window.patch", {"up/src/ctx.c": (CTX, edited)}, "ctx window", "ctx-window"))
    r = mutated()
    r["hooks"]["ctx-window"]["sites"].append({"file": "up/src/ctx.c", "symbol": "ctx_run"})
    write_reg(rp, r)
    assert any("marker on an upstream line" in x for x in problems(rp))


def test_hook_owned_by_other_patch_and_missing_hook_entry(rp: Proj):
    r = mutated()
    r["hooks"]["ctx-window"]["patch"] = "0099"
    write_reg(rp, r)
    got = problems(rp)
    assert any("owned by patch 0099" in x for x in got)
    assert any("owning patch 0099 is not registered" in x for x in got)


@pytest.mark.parametrize("change, message", [
    ({"patches.0.colour": "blue"}, "unknown key(s): colour"),
    ({"patches.0.status": "maybe"}, "status must be one of"),
    ({"patches.0.gates": [{"name": "g", "needs": ["tpu"], "command": ["true"], "proves": "x"}]}, "needs must be"),
])
def test_schema_rejects_with_file_and_key(rp: Proj, change, message):
    (rp.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(mutated(**change), sort_keys=False))
    code, out, err = rp.run("registry", "check", expect=1)
    assert message in err and "UPSTREAM_SYNC.yaml: patches[0]" in err


@pytest.mark.parametrize("change, message", [
    ({"patches.0.status": "Shipped"}, "status must be one of"),
    ({"schema": True}, "unsupported schema (expected 1)"),
    ({"hooks.ctx-window.sites.0.line": -5}, "line must be a positive whole number"),
    ({"patches.0.colour": "blue"}, "unknown key(s): colour"),
])
def test_every_schema_refusal_says_what_to_do(rp: Proj, change, message):
    # a schema refusal said what and where but had no `next:` line; every one now names the file to fix and the
    # command that checks it again, and changes nothing
    path = rp.root / "registry" / "UPSTREAM_SYNC.yaml"
    path.write_text(yaml.safe_dump(mutated(**change), sort_keys=False))
    before = rp.digest()
    code, out, err = rp.run("registry", "check", expect=1)
    assert message in err, err
    assert "next: " in err and "fix that key in registry/UPSTREAM_SYNC.yaml; `forktool registry check` re-checks it" \
        in err, err
    assert rp.digest() == before


def test_duplicate_ids(rp: Proj):
    r = mutated()
    r["patches"].append(dict(r["patches"][0]))
    (rp.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(r, sort_keys=False))
    code, out, err = rp.run("registry", "check", expect=1)
    assert "duplicate patch id 0070" in err


def test_stale_markdown_view(rp: Proj):
    (rp.root / "registry" / "UPSTREAM_SYNC.md").write_text("old\n")
    assert any("UPSTREAM_SYNC.md" in x and "stale" in x for x in problems(rp))
    rp.run("registry", "render", "--check", expect=1)
    rp.run("registry", "render")
    rp.run("registry", "render", "--check")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_a_registry_file_is_written_leaves_no_temp_file_in_registry(rp: Proj, sig: int):
    # registry/ is committed: a SIGTERM or SIGHUP between the temp file's creation and its rename left
    # `registry/.forktool-RANDOM.tmp` there for good (git showed it untracked); the signal now waits for the rename
    (rp.root / "registry" / "UPSTREAM_SYNC.md").write_text("old\n")
    r = signal_at(rp.root, sig, "registry/.forktool-", ["registry", "render"], event="os.rename")
    assert r.returncode == -sig, r.stderr
    assert sorted(p.name for p in (rp.root / "registry").iterdir()) == ["UPSTREAM_SYNC.md", "UPSTREAM_SYNC.yaml",
                                                                        "build.yaml"]
    rp.run("registry", "render", "--check")  # and the file it was writing is whole


def test_rewriting_an_earlier_patch_line_carries_its_marker():
    from forktool.markers import hooks_in_patch
    from forktool.series import parse_patch
    later = CTX1.replace("    int window; // opencoti-hook: ctx-window\n",
                         "    int window, extra; // opencoti-hook: ctx-window\n    // opencoti-hook: extra\n")
    p = parse_patch(make_patch("0071-x.patch", {"up/src/ctx.c": (CTX1, later)}).encode(), "0071-x.patch")
    assert hooks_in_patch(p) == ["extra"]


def test_gates_run_skip_and_fail(rp: Proj, monkeypatch):
    monkeypatch.setenv("FORKTOOL_NO_CUDA", "1")
    r = mutated()
    r["patches"][0]["gates"] = [
        {"name": "ok", "needs": ["cpu"], "command": ["{python}", "-c", "print('gate ran')"], "proves": "runs"},
        {"name": "gpu", "needs": ["cuda"], "command": ["false"], "proves": "needs a GPU"},
        {"name": "bad", "needs": ["cpu"], "command": ["{python}", "-c", "import sys; sys.exit('broken')"],
         "proves": "fails"},
    ]
    write_reg(rp, r)
    listed = rp.json("gates", "--list")["gates"]
    assert [(g["gate"], g["needs"]) for g in listed] == [("ok", ["cpu"]), ("gpu", ["cuda"]), ("bad", ["cpu"])]
    res = rp.json("gates", "0070", expect=1)
    by = {g["gate"]: g for g in res["gates"]}
    assert by["ok"]["result"] == "pass" and "gate ran" in by["ok"]["stdout"]
    assert by["gpu"]["result"] == "skipped" and "FORKTOOL_NO_CUDA" in by["gpu"]["reason"]
    assert by["bad"]["result"] == "fail" and by["bad"]["exit_code"] == 1
    assert rp.json("gates", "--gate", "ok")["failed"] == 0
    # a gate skipped is not checked: the run that skipped it is not a pass, though nothing failed
    res = rp.json("gates", "--gate", "gpu", expect=1)
    assert (res["failed"], res["skipped"], res["gates"][0]["result"]) == (0, 1, "skipped")
    code, out, err = rp.run("gates", "--gate", "gpu", expect=1)
    assert "not checked 0070 gpu: skipped, it needs a CUDA GPU (FORKTOOL_NO_CUDA is set)" in out + err
    assert "1 gate(s) skipped, so not checked" in out + err and "pass" not in out + err
    code, out, err = rp.run("gates", "--gate", "nope", expect=2)
    assert "gates --list" in err
