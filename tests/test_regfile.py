"""The registry kept by the tool: new registers, refresh and apply --reanchor keep files, build impact, hooks and
site lines, written in place with comments and quoting kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from forktool import regfile
from forktool import registry as rg
from forktool.errors import ForktoolError
from tests.helpers.project import Proj

# the registry as a person keeps it: comments, quoted ids, a double-quoted title, a folded description
TEXT = """\
# The UPSTREAM_SYNC registry of this fork.
schema: 1
patches:
# the window field and its users
- id: '0070'
  file: 0070-ctx-window.patch
  title: "ctx window: the field"  # the person's words
  bug: bug-1
  status: shipped
  shipped: '2026-07-01'
  build_impact:
  - host
  files:
  - up/src/ctx.c
  hooks:
  - ctx-window
  gates:
  - name: smoke
    needs: [cpu]
    command: ['true']
    proves: nothing much
hooks:
  # one logical change
  ctx-window:
    patch: '0070'
    description: the window field, set to zero
      by ctx_init
    sites:
    - file: up/src/ctx.c
      symbol: ctx
      line: 1
    - file: up/src/ctx.c
      symbol: ctx_init
      line: 6
# end of registry
"""


def human_lines(text: str) -> list[str]:
    """The lines a person wrote that the tool must keep: comments and the quoted or hand-styled values."""
    return [ln for ln in text.splitlines() if "#" in ln or '"' in ln or "'" in ln or "description" in ln
            or "by ctx_init" in ln]


@pytest.fixture
def kp(rp: Proj) -> Proj:  # noqa: F811
    (rp.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(TEXT)
    rp.run("registry", "render")
    rp.run("apply")
    rp.run("verify")
    return rp


def reg_text(p: Proj) -> str:
    return (p.root / "registry" / "UPSTREAM_SYNC.yaml").read_text()


def test_new_edit_refresh_verify_with_no_hand_edit(kp: Proj):
    data = kp.json("new", "cuda-tweak", "--title", "cuda: tweak the kernel")
    assert data["registry"] == "updated"
    entry = yaml.safe_load(reg_text(kp))["patches"][1]
    assert entry == {"id": "0071", "file": "0071-cuda-tweak.patch", "title": "cuda: tweak the kernel",
                     "status": "dev", "build_impact": [], "files": [], "hooks": []}
    assert "\n- id: '0071'\n  file: 0071-cuda-tweak.patch\n" in reg_text(kp)  # an id is quoted, as YAML 1.2 needs
    kp.run("registry", "check")  # the empty patch is registered: nothing to complain about
    kp.edit("up/ggml/src/ggml-cuda/k.cu", "    int x = 0;\n", "    int x = 0;\n    x += 1; // opencoti-hook: k-bump\n")
    data = kp.json("refresh", "0071")
    assert data["registry"] == "updated"
    kp.run("verify")
    text = reg_text(kp)
    reg = yaml.safe_load(text)
    assert reg["patches"][1] | {"title": "x"} == {
        "id": "0071", "file": "0071-cuda-tweak.patch", "title": "x", "status": "dev",
        "build_impact": ["cuda-dso"], "files": ["up/ggml/src/ggml-cuda/k.cu"], "hooks": ["k-bump"]}
    assert reg["hooks"]["k-bump"] == {"patch": "0071", "sites": [
        {"file": "up/ggml/src/ggml-cuda/k.cu", "symbol": "k", "line": 1}]}
    # everything the person wrote is still there, byte for byte
    assert human_lines(TEXT) == [ln for ln in human_lines(text) if ln in TEXT.splitlines()]
    assert text.startswith(TEXT.split("# end of registry")[0][:400])
    assert text.endswith("# end of registry\n") or "# end of registry" in text
    # a refresh that changes nothing leaves the registry alone
    before = text
    assert kp.json("refresh", "0071")["registry"] == "unchanged"
    assert reg_text(kp) == before


def test_refresh_keeps_site_lines_and_files(kp: Proj):
    # three lines above ctx_init and a second file: the site line moves, files and impact follow
    kp.edit("up/src/ctx.c", "int ctx_init(", "/* a */\n/* b */\n/* c */\nint ctx_init(")
    kp.edit("up/ggml/src/ggml-cuda/k.cu", "    int x = 0;\n", "    int x = 2;\n")
    assert kp.json("refresh", "0070")["registry"] == "updated"
    kp.run("verify")
    code, out, err = kp.run("registry", "check")
    assert "advisory" not in err + out
    reg = yaml.safe_load(reg_text(kp))
    assert [s["line"] for s in reg["hooks"]["ctx-window"]["sites"]] == [1, 9]
    assert reg["patches"][0]["files"] == ["up/ggml/src/ggml-cuda/k.cu", "up/src/ctx.c"]
    assert reg["patches"][0]["build_impact"] == ["host", "cuda-dso"]
    # the person's keys are untouched, the comment after the title too
    assert '  title: "ctx window: the field"  # the person\'s words' in reg_text(kp)
    assert reg["patches"][0]["gates"][0]["command"] == ["true"]


def test_refresh_over_a_series_that_does_not_apply_whole_says_sites_not_checked(kp: Proj):
    """A patch above that does not apply leaves no series to find the sites in: refresh keeps them as they were and
    says they were not checked, never a bare `registry: unchanged` over a site line that is now wrong."""
    from tests.helpers.patches import make_patch
    from tests.helpers.registry import CTX

    other = CTX.replace("int ctx_run(", "int ctx_other(")  # context the file never holds: 0071 does not apply
    kp.write_patch("0071-bad.patch", make_patch("0071-bad.patch", {"up/src/ctx.c": (
        other, other.replace("return c->a;", "return c->a + 1;"))}, "bad", ""))
    kp.edit("up/src/ctx.c", "int ctx_init(", "/* a */\n/* b */\n/* c */\nint ctx_init(")
    code, out, err = kp.run("refresh", "0070")
    line = next(ln for ln in (out + err).splitlines() if ln.startswith("registry:"))
    assert line.startswith("registry: unchanged; hook sites not checked, left as they were: the series does not "
                           "apply whole (patch 0071-bad.patch"), line
    assert [s["line"] for s in yaml.safe_load(reg_text(kp))["hooks"]["ctx-window"]["sites"]] == [1, 6]
    assert "hook sites not checked" in kp.json("refresh", "0070")["registry"]


def test_a_hook_renamed_in_the_marker_follows(kp: Proj):
    text = (kp.tree / "up/src/ctx.c").read_text()
    (kp.tree / "up/src/ctx.c").write_text(text.replace("opencoti-hook: ctx-window", "opencoti-hook: ctx-win"))
    kp.run("refresh", "0070")
    reg = yaml.safe_load(reg_text(kp))
    assert reg["patches"][0]["hooks"] == ["ctx-win"]
    assert [s["symbol"] for s in reg["hooks"]["ctx-win"]["sites"]] == ["ctx", "ctx_init"]
    # the old entry carries a person's description: kept, and the check names it
    assert "ctx-window" in reg["hooks"]
    code, out, err = kp.run("verify", expect=1)
    assert "hooks.ctx-window" in out + err


def test_apply_reanchor_keeps_site_lines(kp: Proj):
    # a second patch above 0070 in the same file; then 0070 grows below it: 0071's site line moves
    kp.run("new", "run-tweak")
    kp.edit("up/src/ctx.c", "    return c->a;\n", "    c->a += 0; // opencoti-hook: run-tweak\n    return c->a;\n")
    kp.run("refresh", "0071")
    kp.run("unapply", "--to", "0070")
    kp.edit("up/src/ctx.c", "int ctx_init(", "/* one */\n/* two */\nint ctx_init(")
    kp.run("refresh", "0070")
    # refresh already moved the lines of every hook in the files it touched, 0071's included
    site = {"file": "up/src/ctx.c", "symbol": "ctx_run", "line": 15}
    assert yaml.safe_load(reg_text(kp))["hooks"]["run-tweak"]["sites"] == [site]
    # lines left stale (by hand, or by an older tool): apply --reanchor puts them right
    path = kp.root / "registry" / "UPSTREAM_SYNC.yaml"
    path.write_text(reg_text(kp).replace("line: 15", "line: 3"))
    kp.run("registry", "render")
    code, out, err = kp.run("apply", "--reanchor")
    assert "registry: updated" in err + out
    kp.run("verify")
    code, out, err = kp.run("registry", "check")
    assert "advisory" not in out + err
    assert yaml.safe_load(reg_text(kp))["hooks"]["run-tweak"]["sites"] == [site]


def test_new_with_a_broken_registry_says_so(kp: Proj):
    (kp.root / "registry" / "UPSTREAM_SYNC.yaml").write_text("schema: 1\npatches: nope\nhooks: {}\n")
    data = kp.json("new", "x")
    assert data["registry"].startswith("not updated: it does not load")
    assert (kp.root / "registry" / "UPSTREAM_SYNC.yaml").read_text() == "schema: 1\npatches: nope\nhooks: {}\n"


# ---------------------------------------------------------------- the writer itself


def load(text: str) -> rg.Registry:
    return rg.from_data(yaml.safe_load(text), Path("r.yaml"))


def test_nothing_changed_is_byte_identical():
    assert regfile.update_text(TEXT, load(TEXT)) == TEXT


def test_the_projects_registry_keeps_its_gates_parts_when_a_patch_changes():
    # refresh rewrites a changed patch entry in place: the gates' declared parts (what `forktool gates` claims for
    # each part) must come through it unchanged, as must the rest of the text
    import dataclasses
    text = (Path(__file__).resolve().parents[1] / "registry" / "UPSTREAM_SYNC.yaml").read_text()
    reg = load(text)
    assert regfile.update_text(text, reg) == text
    i = next(i for i, p in enumerate(reg.patches) if p.id == "0089")
    before = reg.patches[i].gates
    assert before and all(g.parts for g in before)
    reg.patches[i] = dataclasses.replace(reg.patches[i], title="rolling-KV two-pass compute-buffer reserve (moved)")
    out = regfile.update_text(text, reg)
    assert out != text and load(out).patches[i].gates == before
    assert len(out.splitlines()) == len(text.splitlines())


def test_entries_added_in_order_and_removed():
    import dataclasses
    reg = load(TEXT)
    first = dataclasses.replace(reg.patches[0], id="0069", file="0069-a.patch", title="it's: first", hooks=())
    last = dataclasses.replace(reg.patches[0], id="0090", file="0090-z.patch", title="last", hooks=(), gates=())
    reg.patches[:] = [first, reg.patches[0], last]
    reg.hooks["z"] = rg.Hook("z", "0090", "", (rg.Site("up/src/ctx.c", "ctx_run", 12),))
    out = regfile.update_text(TEXT, reg)
    assert [p.id for p in load(out).patches] == ["0069", "0070", "0090"]
    assert list(load(out).hooks) == ["ctx-window", "z"]
    assert all(ln in out.splitlines() for ln in TEXT.splitlines())  # only additions
    # and back: removing them gives the original text again
    reg.patches[:] = [reg.patches[1]]
    del reg.hooks["z"]
    assert regfile.update_text(out, reg) == TEXT


def test_empty_flow_lists_are_filled():
    text = "# kept\nschema: 1\npatches: []  # none yet\nhooks: {}\n"
    reg = load(TEXT)
    out = regfile.update_text(text, reg)
    assert out.startswith("# kept\nschema: 1\n") and rg.dump(load(out)) == rg.dump(reg)


def test_a_change_the_writer_cannot_place_is_refused():
    import dataclasses
    reg = load(TEXT)
    reg.patches[0] = dataclasses.replace(reg.patches[0], description="new text")  # no such key to edit in place
    with pytest.raises(ForktoolError, match="cannot add key 'description'"):
        regfile.update_text(TEXT, reg)


def test_reanchor_registers_a_series_and_sync_keeps_a_new_hook(proj: Proj):  # noqa: F811
    """An empty registry filled by apply --reanchor; a sync whose resolution adds a marker ends with verify OK."""
    from tests.helpers import sync as tl
    tl.loop_series(proj)
    path = proj.root / "registry" / "UPSTREAM_SYNC.yaml"
    path.write_text("# kept by forktool\nschema: 1\npatches: []\nhooks: {}\n")
    proj.run("registry", "render")
    code, out, err = proj.run("apply", "--reanchor")
    assert "registry: updated" in out + err
    proj.run("verify")
    reg = yaml.safe_load(path.read_text())
    assert [p["id"] for p in reg["patches"]] == ["0001", "0002", "0003", "0004"]
    assert reg["hooks"]["a-ten"] == {"patch": "0002", "sites": [{"file": "up/src/a.c", "symbol": "a", "line": 1}]}
    commit = tl.new_upstream(proj)
    proj.run("sync", "--to", commit, "--start", expect=1)
    text = (proj.tree / "up/src/a.c").read_text()
    start, end = text.index("<<<<<<< "), text.index(">>>>>>> ")
    end = text.index("\n", end) + 1
    (proj.tree / "up/src/a.c").write_text(text[:start] + "    (void) 0; // opencoti-hook: a-extra\n"
                                          "    return 20; // opencoti-hook: a-ten\n" + text[end:])
    proj.run("sync", "--continue")
    proj.run("verify")
    reg = yaml.safe_load(path.read_text())
    assert reg["patches"][1]["hooks"] == ["a-ten", "a-extra"]
    assert reg["hooks"]["a-extra"] == {"patch": "0002", "sites": [{"file": "up/src/a.c", "symbol": "a", "line": 1}]}
    assert path.read_text().startswith("# kept by forktool\n")
