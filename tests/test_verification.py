"""verify as one report, its caches (stat index, re-exports, scopes, verdict) and --no-cache agreeing with them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from forktool.index import scan_indexed
from forktool.tree import scan
from tests.helpers.project import Proj

KEYS = {"ok", "problems", "tree_digest", "series_digest", "applied", "exported", "full_series", "registry",
        "advisories", "cached", "compiled", "not_compiled_why", "not_checked"}


def verdict(p: Proj, *extra: str) -> dict:
    return p.json("verify", *extra, expect=None)


def comparable(v: dict) -> tuple:
    return v["ok"], v["problems"], v["tree_digest"], v["series_digest"], v["applied"], v["registry"]


def age_tree(p: Proj, seconds: int = 60) -> None:
    """Move every mtime into the past, so the stat index trusts the entries (none is racily clean)."""
    past = time.time() - seconds
    for dirpath, _, files in os.walk(p.tree):
        for f in files:
            os.utime(os.path.join(dirpath, f), (past, past), follow_symlinks=False)


def test_json_carries_the_same_fields_pass_or_fail(rp: Proj):  # noqa: F811
    rp.run("apply")
    ok = verdict(rp)
    assert ok["ok"] is True and ok["problems"] == [] and set(ok) == KEYS
    rp.edit("up/src/ctx.c", "return c->a;", "return c->a + 1;")
    code, out, err = rp.run("verify", "--json", expect=1)
    bad = json.loads(out)
    assert bad["ok"] is False and set(bad) == KEYS | {"error"}
    assert bad["tree_digest"] != ok["tree_digest"] and len(bad["tree_digest"]) == 64
    assert all(set(x) == {"where", "what"} and x["where"] and x["what"] for x in bad["problems"])


def test_without_a_registry_verify_says_the_registry_was_not_checked(rp: Proj):  # noqa: F811
    # the registry check is part of what verify: OK stands for: where the project keeps none, no marker in the tree
    # was checked, and both outputs say so instead of OK
    rp.run("apply")
    assert verdict(rp)["not_checked"] == []
    for name in ("UPSTREAM_SYNC.yaml", "UPSTREAM_SYNC.md"):
        (rp.root / "registry" / name).unlink()
    rp.edit("up/src/ctx.c", "int ctx_run(", "int stray; // opencoti-hook: nobody-registered\nint ctx_run(")
    rp.run("refresh", "0070")  # a marker no registry lists, in the patch and the tree
    v = verdict(rp)
    assert (v["ok"], v["registry"], v["not_checked"]) == (True, None, ["registry"])
    code, out, err = rp.run("verify")
    assert "registry: not checked (no registry/UPSTREAM_SYNC.yaml" in err and "registry: OK" not in err
    assert err.strip().splitlines()[-1].startswith("verify: OK") and "; registry not checked" in err
    rp.run("registry", "check", expect=1)  # the command that checks the registry refuses the same project

def test_every_difference_in_one_report(rp: Proj):  # noqa: F811
    rp.run("apply")
    rp.edit("up/src/ctx.c", "return c->a;", "return c->a + 1;")  # tree + re-export + lock digest
    md = rp.root / "registry" / "UPSTREAM_SYNC.md"
    md.write_text(md.read_text() + "edited by hand\n")  # registry
    code, out, err = rp.run("verify", "--json", expect=1)
    where = [x["where"] for x in json.loads(out)["problems"]]
    assert "vendor/llamafile/up/src/ctx.c" in where  # the tree
    assert "patches/0070-ctx-window.patch" in where  # the re-export
    assert "vendor/vendor.lock" in where  # the recorded digest
    assert "registry/UPSTREAM_SYNC.md" in where  # the registry
    code, out, err = rp.run("verify", expect=1)
    assert "verify found 4 difference(s)" in err and "UPSTREAM_SYNC.md" in err and "modified up/src/ctx.c" in err


def test_cache_and_no_cache_agree_on_clean_and_tampered_trees(rp: Proj):  # noqa: F811
    rp.run("apply")
    age_tree(rp)
    first, second, scratch = verdict(rp), verdict(rp), verdict(rp, "--no-cache")
    assert first["ok"] and not first["cached"] and second["cached"] and not scratch["cached"]
    assert comparable(first) == comparable(second) == comparable(scratch)
    # an edit that keeps size and mtime: the stat index still sees it (ctime moved)
    f = rp.tree / "up/src/ctx.c"
    st = f.stat()
    f.write_bytes(f.read_bytes().replace(b"c->a = 0;", b"c->a = 9;"))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    tampered, again, scratch = verdict(rp), verdict(rp), verdict(rp, "--no-cache")
    assert not tampered["ok"] and again["cached"]
    assert comparable(tampered) == comparable(again) == comparable(scratch)
    assert any("modified up/src/ctx.c" in x["what"] for x in tampered["problems"])


def test_forged_or_corrupt_cache_entries_are_ignored(rp: Proj):  # noqa: F811
    rp.run("apply")
    assert verdict(rp)["ok"]
    cache = rp.root / ".opencoti" / "cache"
    clean_files = {p: p.read_bytes() for p in cache.rglob("*.json")}
    rp.edit("up/src/ctx.c", "return c->a;", "return c->a + 1;")
    tampered = verdict(rp)
    assert not tampered["ok"]
    new = [p for p in cache.rglob("*.json") if p not in clean_files]
    assert new
    ok_verdict = next(b for p, b in clean_files.items() if p.parent.parent.name == "verdict")
    for p in new:
        raw = json.loads(p.read_bytes())
        if raw["kind"] == "verdict":
            forged = dict(raw, value=dict(raw["value"], ok=True, problems=[]))  # value edited, checksum kept
            p.write_text(json.dumps(forged))
        elif raw["kind"] == "reexport":
            p.write_text(json.dumps(dict(raw, value=True)))
    assert comparable(verdict(rp)) == comparable(tampered)
    for p in new:  # another key's entry (a clean verdict) moved under this key; then plain garbage
        p.write_bytes(ok_verdict if p.parent.parent.name == "verdict" else b"{not json")
    assert comparable(verdict(rp)) == comparable(tampered)
    for p in cache.rglob("*.json"):
        p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])  # truncated
    assert comparable(verdict(rp)) == comparable(tampered) == comparable(verdict(rp, "--no-cache"))


def test_a_changed_pristine_object_changes_the_verdict(rp: Proj):  # noqa: F811
    rp.run("apply")
    assert verdict(rp)["ok"] and verdict(rp)["cached"]
    objects = Path(os.environ["FORKTOOL_CACHE"]) / "objects"
    victim = next(p for p in objects.rglob("*") if p.is_file())
    victim.write_bytes(victim.read_bytes() + b"x")
    v = verdict(rp)
    assert not v["ok"] and not v["cached"] and any("corrupt" in x["what"] for x in v["problems"])


def test_vendor_fetch_repairs_a_damaged_pristine_object(rp: Proj):  # noqa: F811
    # "from cache" vouches for bytes it has read: a damaged object (other bytes, or a FIFO where it belongs) is
    # fetched again, not passed over because a file of that name exists
    from forktool import vendor
    from forktool.project import Project

    rp.run("apply")
    project = Project(rp.root)
    manifest, _ = vendor.read_pristine(project)
    store = vendor.objects(project)
    victim = store.path(min(e.sha256 for e in manifest.values()))
    good = victim.read_bytes()
    victim.write_bytes(good + b"x")
    _, out, err = rp.run("vendor", "fetch")
    assert "missing or damaged: fetching it again" in out + err and "(from cache)" not in out + err
    assert victim.read_bytes() == good and verdict(rp)["ok"]
    victim.unlink()
    os.mkfifo(victim)
    _, out, err = rp.run("vendor", "fetch")
    assert "missing or damaged" in out + err and victim.is_file() and victim.read_bytes() == good
    _, out, err = rp.run("vendor", "fetch")  # whole again: from the cache, checked
    assert "(from cache)" in out + err and "damaged" not in out + err


def test_stat_index_hashes_only_what_changed(tmp_path: Path):
    root = tmp_path / "t"
    for i in range(20):
        (root / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 3}" / f"f{i}.c").write_text(f"int f{i};\n")
    (root / "link").symlink_to("d0/f0.c")
    past = time.time() - 60
    for p in root.rglob("*"):
        os.utime(p, (past, past), follow_symlinks=False)
    index = tmp_path / "index"
    m1, hashed1 = scan_indexed(root, index)
    assert m1 == scan(root) and hashed1 == 21
    m2, hashed2 = scan_indexed(root, index)
    assert m2 == m1 and hashed2 == 0
    (root / "d1" / "f1.c").write_text("int changed;\n")  # new mtime: racily clean entries are re-hashed too
    (root / "d2" / "f2.c").unlink()
    m3, hashed3 = scan_indexed(root, index)
    assert m3 == scan(root) and hashed3 == 1 and "d2/f2.c" not in m3
    index.write_bytes(b"\x00garbage")
    m4, hashed4 = scan_indexed(root, index)
    assert m4 == scan(root) and hashed4 == len(m4)


def _reexports(p: Proj) -> set[Path]:
    return set((p.root / ".opencoti" / "cache" / "reexport").rglob("*.json"))


def test_verify_right_after_refresh_agrees_with_no_cache(rp: Proj):  # noqa: F811
    rp.run("apply")
    assert verdict(rp)["ok"]
    rp.edit("up/src/ctx.c", "c->window = 0;", "c->window = 64;")
    before = _reexports(rp)
    rp.run("refresh", "0070")
    recorded = _reexports(rp) - before
    assert len(recorded) == 1  # refresh recorded the re-export it proved
    after_refresh = verdict(rp)
    assert _reexports(rp) == before | recorded  # verify found it: nothing re-exported, nothing new stored
    scratch = verdict(rp, "--no-cache")
    assert after_refresh["ok"] and not after_refresh["cached"]
    assert comparable(after_refresh) == comparable(scratch)


def test_verify_after_refresh_sees_an_edit_that_keeps_size_and_mtime(rp: Proj):  # noqa: F811
    rp.run("apply")
    rp.edit("up/src/ctx.c", "c->window = 0;", "c->window = 64;")
    rp.run("refresh", "0070")
    f = rp.tree / "up/src/ctx.c"
    st = f.stat()
    f.write_bytes(f.read_bytes().replace(b"window = 64;", b"window = 65;"))  # right after refresh, same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    tampered, scratch = verdict(rp), verdict(rp, "--no-cache")
    assert not tampered["ok"] and not tampered["cached"]
    assert comparable(tampered) == comparable(scratch)
    assert any(x["where"] == "patches/0070-ctx-window.patch" for x in tampered["problems"])  # the re-export
    assert any("modified up/src/ctx.c" in x["what"] for x in tampered["problems"])


def test_refresh_records_no_re_export_it_did_not_compute(rp: Proj):  # noqa: F811
    rp.run("apply")
    (rp.tree / "up/src/new.c").write_text("int n; // opencoti-hook: ctx-window\n")  # a new file joins the patch
    before = _reexports(rp)
    rp.run("refresh", "0070")
    assert _reexports(rp) == before  # a new file: verify's export is not the computation refresh did
    v, scratch = verdict(rp), verdict(rp, "--no-cache")
    assert comparable(v) == comparable(scratch)


def test_a_patch_that_no_longer_applies_is_one_difference_and_the_sites_are_not_checked(rp: Proj):  # noqa: F811
    # 0071 is written against a line 0070 adds; 0070 then changes that line, and 0071 no longer applies
    from tests.helpers.patches import make_patch
    from tests.helpers.registry import CTX1

    rp.write_patch("0071-ctx-run.patch", make_patch("0071-ctx-run.patch", {"up/src/ctx.c": (
        CTX1, CTX1.replace("    return 0;\n}\n", "    return 1;\n}\n"))}, "ctx run", ""))
    rp.run("apply")
    rp.run("apply", "--upto", "0070")
    rp.edit("up/src/ctx.c", "c->window = 0;", "c->window = 2;")
    rp.run("refresh", "0070")
    data = json.loads(rp.run("verify", "--json", expect=1)[1])
    what = [x["what"] for x in data["problems"]]
    assert any(w.startswith("does not apply: hunk #1 of up/src/ctx.c") for w in what), what
    assert any(w.startswith("hook sites not checked: the series does not apply") for w in what), what
    data = json.loads(rp.run("registry", "check", "--json", expect=1)[1])
    assert any(x["what"].startswith("hook sites not checked") for x in data["problems"])
