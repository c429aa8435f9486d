"""Caches are optimisations that cannot vouch: an entry counts only under its exact key, the shared cache holds
only content verified on read, and --no-cache reads nothing remembered."""

from __future__ import annotations

import hashlib
import json
import marshal
import shutil
from pathlib import Path

import pytest
import yaml

from forktool import cache as fcache
from forktool import index, schemas
from forktool.cache import Cache, key_of
from tests.helpers.patches import make_patch
from tests.helpers.project import UPSTREAM, Proj


def test_cache_entry_is_used_only_under_its_key(tmp_path: Path):
    c = Cache(tmp_path, "kind")
    k1, k2 = key_of("a", 1), key_of("a", 2)
    c.put(k1, {"v": 1})
    assert c.get(k1) == {"v": 1} and c.get(k2) is None
    path = next(tmp_path.rglob("*.json"))
    path.write_text(path.read_text().replace('"v":1', '"v":2'))  # value edited: checksum no longer matches
    assert c.get(k1) is None
    assert Cache(None, "kind").get(k1) is None  # disabled (--no-cache)


def test_schema_memo_only_for_the_same_document_and_schema(tmp_path: Path):
    schema = {"type": "object"}
    memo = fcache.Checks(tmp_path)
    memo.remember_valid("x", schema, {"a": 1})
    assert not (tmp_path / "validated").exists()  # written when the command ends without an error
    memo.flush()
    memo = fcache.Checks(tmp_path)
    assert memo.known_valid("x", schema, {"a": 1})
    assert not memo.known_valid("x", schema, {"a": 2})
    assert not memo.known_valid("x", {"type": "array"}, {"a": 1})
    assert not fcache.Checks(None).known_valid("x", schema, {"a": 1})  # --no-cache reads nothing
    entry = next((tmp_path / "validated").rglob("*"))
    while entry.is_dir():
        entry = next(entry.iterdir())
    entry.write_text("forged")
    assert not memo.known_valid("x", schema, {"a": 1})


def test_a_bad_config_is_refused_every_time(proj: Proj):
    y = proj.root / "vendor" / "vendor.yaml"
    proj.run("vendor", "status")  # the good file passes and is remembered
    good = y.read_text()
    y.write_text(good + "bogus_key: 1\n")
    for _ in range(2):
        code, out, err = proj.run("vendor", "status", expect=None)
        assert code == 1 and "bogus_key" in err
    y.write_text(good)
    proj.run("vendor", "status")


# ---------------------------------------------------------------- forged entries cannot vouch
# Each case writes what a forger would (real files in the tmp FORKTOOL_CACHE or .opencoti), then runs the real
# CLI: a check that fails from scratch still fails. The shared cache is written with the layouts and keys
# earlier versions read, so a regression that reads them again is caught.

A = UPSTREAM["src/a.c"]
A1 = A.replace("    return 1;\n", "    // opencoti-hook: one\n    return 2;\n")
BUILD_YAML = ("artifacts:\n  - name: lib\n    impact: host\n    paths: ['up/src']\n"
              "profiles:\n  cpu:\n    targets: [lib]\n")
REGISTRY = {
    "schema": 1,
    "patches": [{
        "id": "0070", "file": "0070-one.patch", "title": "one", "bug": "bug-1", "status": "shipped",
        "shipped": "2026-07-01", "build_impact": ["host"], "files": ["up/src/a.c"], "hooks": ["one"],
        "gates": [{"name": "smoke", "needs": ["cpu"], "command": ["true"], "proves": "it runs", "timeout": 60}],
    }],
    "hooks": {"one": {"patch": "0070", "description": "returns two",
                      "sites": [{"file": "up/src/a.c", "symbol": "a", "line": 1}]}},
}


def _registered(proj: Proj) -> Proj:
    """proj with one applied patch, its registry and build rules: `verify` passes."""
    (proj.root / "registry" / "build.yaml").write_text(BUILD_YAML)
    proj.write_patch("0070-one.patch", make_patch("0070-one.patch", {"up/src/a.c": (A, A1)}, "one", "one"))
    _write_registry(proj, REGISTRY)
    proj.run("apply")
    proj.run("verify")
    return proj


def _write_registry(proj: Proj, reg: dict) -> None:
    (proj.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    proj.run("registry", "render")


def _plant_valid(root: Path, name: str, data: object) -> Path:
    """An entry saying `data` passed schema `name`, laid out as the schema memo reads it under root."""
    doc = json.dumps([name, schemas.SCHEMAS[name], data], sort_keys=True, separators=(",", ":"),
                     default=lambda o: f"<{type(o).__name__}:{o}>")
    key = hashlib.sha256(doc.encode()).hexdigest()
    p = root / "validated" / key[:2] / key[2:]
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(key[2:])
    return p


def _plant_yaml(root: Path, text: str, value: object) -> None:
    """A well-sealed parse of text that says it is value, under root's yaml/ as the parse memo reads it."""
    key = key_of("yaml", fcache._yaml_fingerprint(), hashlib.sha256(text.encode()).hexdigest())
    Cache(root, "yaml").put(key, {"value": value})


def test_a_planted_validation_entry_cannot_pass_a_bad_registry(proj: Proj, cache: Path):
    _registered(proj)
    bad = json.loads(json.dumps(REGISTRY))
    bad["patches"][0]["gates"][0]["timeout"] = "abc"
    _write_registry_raw(proj, bad)
    for root in (cache, proj.root / ".opencoti" / "cache"):  # the shared cache and the project's own
        _plant_valid(root, "registry", bad)
        _plant_yaml(root, (proj.root / "registry" / "UPSTREAM_SYNC.yaml").read_text(), bad)
    for args in (["verify", "--no-cache"], ["registry", "check"], ["verify"]):
        if args == ["registry", "check"] or args == ["verify"]:
            _forget_project_cache(proj)  # the project's own cache is trusted like git's index: see docs/caches.md
        code, out, err = proj.run(*args, expect=1)
        assert "timeout must be whole seconds" in err, (args, err)


def _write_registry_raw(proj: Proj, reg: dict) -> None:
    (proj.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))


def _forget_project_cache(proj: Proj) -> None:
    shutil.rmtree(proj.root / ".opencoti" / "cache", ignore_errors=True)


def test_a_planted_parse_cannot_add_a_gate(proj: Proj, cache: Path):
    _registered(proj)
    text = (proj.root / "registry" / "UPSTREAM_SYNC.yaml").read_text()
    forged = json.loads(json.dumps(REGISTRY))
    forged["patches"][0]["gates"][0]["command"] = ["sh", "-c", "echo planted"]
    _plant_yaml(cache, text, forged)
    _plant_valid(cache, "registry", forged)
    res = proj.json("gates", "--list")
    assert "planted" not in json.dumps(res)
    assert [r["command"] for r in res["gates"]] == [["true"]]


def _tree_file_edited_in_place(proj: Proj) -> Path:
    """A tree file given other bytes of the same size: only its ctime (and mtime) tell the stat index."""
    p = proj.tree / "up/src/a.c"
    data = p.read_bytes()
    p.write_bytes(data.replace(b"return 2;", b"return 3;"))
    return p


def test_a_forged_stat_index_row_cannot_pass_verify_no_cache(proj: Proj):
    _registered(proj)
    p = _tree_file_edited_in_place(proj)
    ix = proj.root / ".opencoti" / "index"
    rows, _taken = index._load(ix, proj.tree)
    st = p.stat()
    old = rows["up/src/a.c"]
    rows["up/src/a.c"] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, old[4], old[5])  # the old sha
    index._save(ix, proj.tree, st.st_mtime_ns + 10 ** 10, rows)
    code, out, err = proj.run("verify", "--no-cache", expect=1)
    assert "up/src/a.c" in err
    assert index._load(ix, proj.tree)[0]["up/src/a.c"][4] == old[4]  # --no-cache did not rewrite the index


def test_a_flipped_verdict_cannot_pass_verify_no_cache(proj: Proj):
    _registered(proj)
    _tree_file_edited_in_place(proj)
    proj.run("verify", expect=1)
    entries = [q for q in (proj.root / ".opencoti" / "cache" / "verdict").rglob("*.json")]
    for q in entries:  # every remembered verdict now says OK, with a matching checksum
        raw = json.loads(q.read_text())
        raw["value"] = dict(raw["value"], ok=True, problems=[])
        Cache(proj.root / ".opencoti" / "cache", "verdict").put(raw["key"], raw["value"])
    code, out, err = proj.run("verify", "--no-cache", expect=1)
    assert "up/src/a.c" in err and "cached verdict" not in err


def test_a_forged_pristine_manifest_memo_is_verified_against_its_name(proj: Proj, cache: Path):
    _registered(proj)
    memos = [q for q in (cache / "pristine-manifest").rglob("*") if q.is_file()]
    assert len(memos) == 1
    kind, key, value = marshal.loads(memos[0].read_bytes().split(b"\n", 1)[1])
    value = dict(value)
    value.pop("up/src/a.c")  # a pristine without the file the patch changes
    fcache.Memo(cache, "pristine-manifest").put(key, value)
    before = proj.digest()
    proj.run("verify")  # the forged memo is not the manifest named by the lock: ignored
    proj.run("verify", "--no-cache")
    proj.run("unapply")
    proj.run("apply")
    assert proj.digest() == before and (proj.tree / "up/src/a.c").read_text() == A1


@pytest.mark.parametrize("how", ["folded", "int-mode"])
def test_a_memo_that_hashes_to_the_name_but_holds_other_entries_is_ignored(proj: Proj, cache: Path, how: str):
    # the digest hashes "MODE SHA PATH\n" lines: unchecked values can fold a file's line into the next entry's
    # mode (the file is gone, the digest the same), or give a mode of another type that prints the same
    import shutil

    from forktool.tree import Entry, digest

    _registered(proj)
    [memo_file] = [q for q in (cache / "pristine-manifest").rglob("*") if q.is_file()]
    kind, key, value = marshal.loads(memo_file.read_bytes().split(b"\n", 1)[1])
    value = dict(value)
    if how == "folded":
        gone, nxt = "up/src/a.c", "up/src/b.c"
        sha, mode = value.pop(gone)
        value[nxt] = (value[nxt][0], f"{mode} {sha} {gone}\n{value[nxt][1]}")
    else:
        value = {rel: (sha, int(mode)) for rel, (sha, mode) in value.items()}
    name = next((cache / "pristine").glob("*.json")).name.removesuffix(".json")
    assert digest({rel: Entry(*e) for rel, e in value.items()}) == name  # what the memo is checked against
    fcache.Memo(cache, "pristine-manifest").put(key, value)
    before = proj.digest()
    shutil.rmtree(proj.tree)
    (proj.root / ".opencoti" / "state.json").unlink()
    code, out, err = proj.run("vendor", "fetch")
    assert "(from cache)" in out + err
    proj.run("apply")
    assert proj.digest() == before and (proj.tree / "up/src/a.c").read_text() == A1
    proj.run("verify")


def test_a_forged_pristine_manifest_is_refused(proj: Proj, cache: Path):
    _registered(proj)
    [manifest] = (cache / "pristine").glob("*.json")
    raw = json.loads(manifest.read_text())
    raw["up/src/a.c"][0] = hashlib.sha256(b"other bytes").hexdigest()
    manifest.write_text(json.dumps(raw))
    before = proj.state_digest()
    for args in (["verify"], ["verify", "--no-cache"], ["unapply"]):
        code, out, err = proj.run(*args, expect=1)
        assert "does not hash" in err or "hashes to" in err, (args, err)
    assert proj.state_digest() == before


@pytest.mark.parametrize("damage", ["truncated", "forged"])
def test_vendor_fetch_writes_a_damaged_pristine_manifest_over(proj: Proj, cache: Path, damage: str):
    """Every other command refuses a cached manifest that is damaged or not the one its name says, pointing to
    `vendor fetch`; that fetch derives it again from the pinned upstream and writes it over, saying so."""
    _registered(proj)
    [manifest] = (cache / "pristine").glob("*.json")
    good = manifest.read_bytes()
    if damage == "truncated":
        manifest.write_bytes(good[:len(good) // 2])
    else:
        raw = json.loads(good)
        raw["up/src/a.c"][0] = hashlib.sha256(b"other bytes").hexdigest()
        manifest.write_text(json.dumps(raw))
    before = proj.state_digest()
    code, out, err = proj.run("verify", expect=1)
    assert "run `forktool vendor fetch`" in err and "writes it over" in err
    code, out, err = proj.run("vendor", "fetch")
    assert "cached pristine manifest is not usable" in err and "(from cache)" not in out + err
    assert manifest.read_bytes() == good and proj.state_digest() == before
    proj.run("verify")


def test_the_shared_cache_holds_only_content_addressed_entries(proj: Proj, cache: Path):
    _registered(proj)
    for args in (["status"], ["verify"], ["registry", "check"], ["gates", "--list"], ["vendor", "status"]):
        proj.run(*args)
    assert sorted(q.name for q in cache.iterdir()) == ["git", "objects", "pristine", "pristine-manifest"]
    assert list((proj.root / ".opencoti" / "cache" / "validated").rglob("*"))  # kept with the project instead


def _sync_report(proj: Proj, commit: str, out: Path) -> dict:
    code, stdout, err = proj.run("sync", "--to", commit, "--out", str(out), "--json", expect=None)
    assert code in (0, 1), err  # 1: the trial found something for a person to look at; never a crash
    res = json.loads(stdout)
    res.pop("timings", None)
    res.pop("out", None)
    return res


def test_a_planted_or_damaged_sync_extraction_changes_nothing(proj: Proj, cache: Path, tmp_path: Path):
    from forktool import vendor
    from forktool.project import Project
    from forktool.sync.fetch import resolve_spec
    from tests.helpers.project import git

    _registered(proj)
    b = proj.upstream / "src/b.c"
    b.write_text(b.read_text().replace("line 20\n", "line twenty\n"))
    git(proj.upstream, "commit", "-qam", "next")
    c2 = git(proj.upstream, "rev-parse", "HEAD")
    reference = _sync_report(proj, c2, tmp_path / "o1")
    _forget_project_cache(proj)

    _, new = resolve_spec(Project(proj.root), c2)
    old_key = hashlib.sha256(json.dumps(vendor.component_lock_key(new), sort_keys=True).encode()).hexdigest()
    planted = cache / "sync" / f"{old_key}.json"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("garbage {")
    assert _sync_report(proj, c2, tmp_path / "o2") == reference
    # an entry naming other bytes (objects that are in the store: the pinned a.c stands in for b.c)
    pristine = json.loads(next((cache / "pristine").glob("*.json")).read_text())
    files = {rel.removeprefix("up/"): e for rel, e in pristine.items()}
    files["src/b.c"] = files["src/a.c"]
    planted.write_text(json.dumps({"files": files, "upstream_commit": c2}))
    _forget_project_cache(proj)
    assert _sync_report(proj, c2, tmp_path / "o3") == reference

    entries = [q for q in (proj.root / ".opencoti" / "cache" / "sync-component").rglob("*.json")]
    assert len(entries) == 1
    entries[0].write_text("garbage {")  # the project's own entry damaged: extracted again
    assert _sync_report(proj, c2, tmp_path / "o4") == reference


def test_checks_are_never_read_or_written_through_a_link(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    project_state = tmp_path / "proj" / ".opencoti"
    project_state.parent.mkdir()
    project_state.symlink_to(outside)  # .opencoti itself a link
    with fcache.remembering(project_state) as memo:
        assert memo.root is None
        memo.remember_valid("x", {}, 1)
    project_state.unlink()
    project_state.mkdir()
    (project_state / "cache").symlink_to(outside)  # its cache/ a link
    with fcache.remembering(project_state) as memo:
        assert memo.root is None
    (project_state / "cache").unlink()
    with fcache.remembering(project_state) as memo:
        memo.remember_valid("x", {}, 1)
    assert memo.root == project_state / "cache" and list((project_state / "cache" / "validated").rglob("*"))
    assert list(outside.iterdir()) == []
    fresh = tmp_path / "new" / ".opencoti"
    with fcache.remembering(fresh) as memo:  # no .opencoti yet: made, as a real directory, by the first write
        memo.remember_valid("x", {}, 1)
    assert fresh.is_dir() and not fresh.is_symlink() and list((fresh / "cache" / "validated").rglob("*"))
    (tmp_path / "file-state").write_text("not a directory\n")
    with fcache.remembering(tmp_path / "file-state") as memo:
        assert memo.root is None


def _the_object_of(cache: Path, rel: str) -> Path:
    [manifest] = (cache / "pristine").glob("*.json")
    sha = json.loads(manifest.read_text())[rel][0]
    return cache / "objects" / sha[:2] / sha[2:]


def _within(seconds: int):
    """A context in which a command that blocks (a FIFO opened for reading waits for a writer) fails the test."""
    import contextlib
    import signal

    @contextlib.contextmanager
    def guard():
        def stuck(_sig, _frame):
            raise AssertionError(f"blocked for {seconds} s")
        old = signal.signal(signal.SIGALRM, stuck)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    return guard()


def test_a_fifo_or_directory_planted_in_the_shared_cache_is_refused_never_waited_on(proj: Proj, cache: Path):
    import os

    _registered(proj)
    obj = _the_object_of(cache, "up/src/a.c")
    data = obj.read_bytes()
    before = proj.state_digest()
    obj.unlink()
    for plant in (os.mkfifo, os.mkdir):
        plant(obj)
        with _within(20):
            for args in (["verify", "--no-cache"], ["unapply"]):
                code, out, err = proj.run(*args, expect=1)
                assert "cannot be read" in err and "where a file belongs" in err and str(obj) in err, (args, err)
                assert "internal error" not in err and "Traceback" not in err
        assert proj.state_digest() == before
        obj.rmdir() if obj.is_dir() else obj.unlink()
    obj.write_bytes(data)
    proj.run("verify", "--no-cache")


def test_a_directory_where_the_cache_writes_a_file_is_a_refusal_not_a_crash(proj: Proj, cache: Path):
    _registered(proj)
    obj = _the_object_of(cache, "up/src/a.c")
    obj.unlink()
    obj.mkdir()
    with _within(60):
        code, out, err = proj.run("vendor", "fetch", expect=1)
    assert f"{obj}: a directory where a file belongs" in err and "next: remove it" in err
    assert "internal error" not in err and "Traceback" not in err


def test_a_fifo_planted_as_a_memo_or_the_stat_index_counts_as_no_entry(proj: Proj, cache: Path):
    import os

    _registered(proj)
    before = proj.state_digest()
    [memo] = [q for q in (cache / "pristine-manifest").rglob("*") if q.is_file()]
    memo.unlink()
    os.mkfifo(memo)
    ix = proj.root / ".opencoti" / "index"
    ix.unlink()
    os.mkfifo(ix)
    with _within(20):
        for args in (["status"], ["verify"], ["verify", "--no-cache"]):
            proj.run(*args)  # a cache that cannot be read is no cache: the command does the work itself
        proj.run("unapply")
        proj.run("apply")
    assert proj.state_digest() == before


@pytest.mark.parametrize("case", ["damaged-object", "unwritable-objects"])
def test_a_cache_of_another_user_is_a_refusal_not_a_crash(tmp_path: Path, case: str):
    # FORKTOOL_CACHE written by someone else (here root) and used by a user who may not change it (nobody): a damaged
    # object forktool must replace, or an objects/ it may not write into, is exit 1 naming the path, no traceback
    import os
    import subprocess
    import sys
    import tempfile

    from tests.helpers.project import make_project

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as another user")
    base = Path(tempfile.mkdtemp(prefix="forktool-other-uid-", dir="/tmp"))
    try:
        shared = base / "cache"
        os.environ["FORKTOOL_CACHE"] = str(shared)
        try:
            proj = make_project(base / "p", UPSTREAM)  # fills the cache as root
        finally:
            del os.environ["FORKTOOL_CACHE"]
        shutil.rmtree(proj.tree)
        (proj.root / ".opencoti" / "state.json").unlink()
        if case == "damaged-object":
            obj = next(p for p in (shared / "objects").rglob("*") if p.is_file())
            obj.write_bytes(b"damaged\n")
        else:  # the rest of the cache is the user's (its git mirror too); objects/ is another user's
            shutil.rmtree(shared / "objects")
            subprocess.run(["chown", "-R", "65534:65534", str(shared)], check=True)
            (shared / "objects").mkdir()
        subprocess.run(["chown", "-R", "65534:65534", str(base / "p")], check=True)
        os.chmod(base, 0o755)
        env = dict(os.environ, FORKTOOL_CACHE=str(shared), FORKTOOL_ROOT=str(proj.root), HOME=str(base))
        r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-m",
                            "forktool", "vendor", "fetch"], env=env, capture_output=True, text=True, cwd=base)
        assert r.returncode == 1, r.stderr
        assert "Permission denied: " + str(shared / "objects") in r.stderr, r.stderr
        assert "FORKTOOL_CACHE" in r.stderr and "Traceback" not in r.stderr and "internal error" not in r.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_lock_naming_a_pristine_only_the_shared_cache_holds_is_refused_by_fetch_no_cache(proj: Proj, cache: Path):
    # CI restores a cache a pull request can write. A commit whose vendor.lock names another pristine digest than the
    # pin extracts to is refused by a fetch from the archive; the same commit beside a planted pristine/DIGEST.json
    # (and its objects) was taken "(from cache)" and then verified OK: the cache chose the upstream bytes.
    from forktool.store import ObjectStore
    from forktool.tree import Entry, digest, manifest_to_json, sha256_bytes

    _registered(proj)
    lock_path = proj.root / "vendor" / "vendor.lock"
    lock = json.loads(lock_path.read_text())
    real_digest = lock["pristine_digest"]
    real = json.loads((cache / "pristine" / f"{real_digest}.json").read_text())
    forged_b = b"".join(f"line {i}\n".encode() for i in range(1, 31)).replace(b"line 7\n", b"line 7 planted\n")
    ObjectStore(cache / "objects").put(forged_b)
    manifest = {rel: Entry(*e) for rel, e in real.items()} | {"up/src/b.c": Entry(sha256_bytes(forged_b), "100644")}
    forged = digest(manifest)
    (cache / "pristine" / f"{forged}.json").write_text(json.dumps(manifest_to_json(manifest), sort_keys=True))
    lock["pristine_digest"] = forged  # the commit under test says so; its pin is unchanged
    lock_path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(proj.tree)
    shutil.rmtree(proj.root / ".opencoti")
    code, out, err = proj.run("vendor", "fetch", "--no-cache", expect=1)
    assert "differs from vendor.lock" in err and "(from cache)" not in out + err
    assert f"({forged})" in err and real_digest in err  # both digests whole: two can share a 12-digit prefix
    assert not proj.tree.exists() and json.loads(lock_path.read_text()) == lock
    proj.run("vendor", "fetch")  # without --no-cache the lock's digest is taken as naming the pin's pristine


@pytest.mark.parametrize("plant", ["config", "commondir", "hook"])
def test_a_git_mirror_planted_in_the_shared_cache_runs_nothing(proj: Proj, cache: Path, tmp_path: Path, plant: str):
    # git reads a repository's own config (and hooks, and a commondir's config) as instructions: a mirror someone
    # else planted under git/ could rewrite the url to an ext:: command that git runs for whoever fetches
    import hashlib
    import os

    from tests.helpers.project import git

    url = str(proj.upstream)
    mirror = cache / "git" / hashlib.sha256(url.encode()).hexdigest()[:16]
    shutil.rmtree(mirror)
    git(tmp_path, "init", "-q", "--bare", str(mirror))  # without the pinned commit: forktool fetches it from url
    pwned = tmp_path / "PWNED"
    bad = (f'[protocol "ext"]\n\tallow = always\n[url "ext::sh -c touch% {pwned}% >&2"]\n\tinsteadOf = {url}\n'
           f"[core]\n\thooksPath = {tmp_path / 'hooks'}\n")
    if plant == "config":
        with (mirror / "config").open("a") as f:
            f.write(bad)
    elif plant == "commondir":
        other = tmp_path / "other"
        git(tmp_path, "init", "-q", "--bare", str(other))
        with (other / "config").open("a") as f:
            f.write(bad)
        (mirror / "commondir").write_text(f"{other}\n")
    else:
        hook = mirror / "hooks" / "reference-transaction"
        hook.write_text(f"#!/bin/sh\ntouch {pwned}\n")
        hook.chmod(0o755)
        (mirror / "packed-refs").write_text("")
    shutil.rmtree(proj.tree)
    shutil.rmtree(proj.root / ".opencoti")
    proj.run("vendor", "fetch", "--no-cache")
    assert not pwned.exists()
    assert not os.path.exists(mirror / "commondir") and "ext::" not in (mirror / "config").read_text()
    proj.run("vendor", "fetch", "--no-cache")  # the mirror forktool left is used as it is


def test_a_large_planted_object_is_fetched_again_never_held_in_memory(proj: Proj, cache: Path):
    # an object is hashed as a stream: a sparse 2 GiB file planted under an object's name is found damaged and
    # replaced within a 1 GiB address space (read whole, it was a MemoryError: exit 3)
    import os
    import resource
    import subprocess
    import sys

    _registered(proj)
    obj = _the_object_of(cache, "up/src/a.c")
    data = obj.read_bytes()
    with obj.open("r+b") as f:
        f.truncate(2 << 30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = dict(os.environ, FORKTOOL_ROOT=str(proj.root), FORKTOOL_CACHE=str(cache))
    for args in (["vendor", "fetch"], ["verify", "--no-cache"]):
        r = subprocess.run([sys.executable, "-m", "forktool", *args], env=env, capture_output=True, text=True,
                           preexec_fn=limit, timeout=300)
        assert r.returncode == 0, (args, r.stderr)
        assert obj.read_bytes() == data
        if args == ["vendor", "fetch"]:
            assert "missing or damaged: fetching it again" in r.stderr


def test_a_fifo_swapped_in_after_a_look_is_never_waited_on_by_the_pristine_check(proj: Proj, cache: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch):
    # the check looked (is_file) and then opened by name: a FIFO swapped in between blocked the open forever
    import os
    from pathlib import Path as P

    from forktool import vendor
    from forktool.project import Project

    _registered(proj)
    obj = _the_object_of(cache, "up/src/a.c")
    obj.unlink()
    os.mkfifo(obj)
    real_is_file = P.is_file
    monkeypatch.setattr(P, "is_file", lambda self: True if self == obj else real_is_file(self))  # the race, won
    with _within(20):
        problems = vendor.verify_pristine_cache(Project(proj.root), use_cache=False)
    assert any("up/src/a.c" in p for p in problems)


def _loose_mirror_object(proj: Proj, cache: Path, rel: str) -> Path:
    """The path of rel's blob (at the upstream's HEAD) in the shared cache's mirror of proj's upstream, its packs
    unpacked into loose objects so that one can be rewritten or removed."""
    import subprocess

    from tests.helpers.project import git

    mirror = cache / "git" / hashlib.sha256(str(proj.upstream).encode()).hexdigest()[:16]
    for pack in list((mirror / "objects" / "pack").glob("*.pack")):
        data = pack.read_bytes()
        pack.with_suffix(".idx").unlink()
        pack.unlink()
        subprocess.run(["git", "--git-dir", str(mirror), "unpack-objects", "-q"], input=data, check=True)
    blob = git(proj.upstream, "rev-parse", f"HEAD:{rel}")
    return mirror / "objects" / blob[:2] / blob[2:]


def test_a_git_mirror_object_with_other_bytes_is_refused(proj: Proj, cache: Path):
    # git names objects by hash but does not re-hash them on read: an object of the pinned commit rewritten in the
    # shared cache's mirror gave its bytes to the pristine (with no lock to compare with, or a lock that names them)
    import os
    import zlib

    obj = _loose_mirror_object(proj, cache, "src/b.c")
    blob, mirror = obj.parent.name + obj.name, obj.parents[2]
    body = b"planted\n"
    os.chmod(obj, 0o644)
    obj.write_bytes(zlib.compress(b"blob %d\0" % len(body) + body))
    shutil.rmtree(proj.tree)
    shutil.rmtree(proj.root / ".opencoti")
    (proj.root / "vendor" / "vendor.lock").unlink()  # a first fetch: nothing to compare the pristine with
    code, out, err = proj.run("vendor", "fetch", expect=1)
    assert f"the git mirror holds object {blob[:12]} (blob) with bytes that do not hash to its name" in err
    assert str(mirror) in err and not proj.tree.exists() and not (proj.root / "vendor" / "vendor.lock").exists()


def test_a_clone_in_progress_never_stands_under_the_mirror_name(proj: Proj, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    # with git's config under the mirror's name while it cloned, another forktool sharing the cache took that clone
    # for a mirror not forktool's and removed it under the running git
    import os
    import subprocess
    import sys

    import git as gitpython

    from forktool import git as fgit
    from tests.helpers.project import git

    url = str(proj.upstream)
    cache = tmp_path / "fresh-cache"
    mirror = cache / "git" / hashlib.sha256(url.encode()).hexdigest()[:16]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    left = mirror.parent / f".{mirror.name}-{dead}-{'0' * 12}"  # a clone a kill left
    (left / "objects").mkdir(parents=True)
    real = gitpython.Repo.clone_from
    seen = []

    def clone_from(src, to, **kw):
        repo = real(src, to, **kw)
        seen.append((Path(to), os.path.lexists(mirror)))
        return repo

    monkeypatch.setattr(gitpython.Repo, "clone_from", clone_from)
    data = fgit.archive_commit(url, git(proj.upstream, "rev-parse", "HEAD"), cache)
    assert data and len(seen) == 1
    (to, there), = seen
    assert to.parent == mirror.parent and to != mirror and not there  # cloned beside it, renamed in once whole
    assert os.listdir(mirror.parent) == [mirror.name]  # neither this clone's work directory nor the dead one's
    assert fgit._MIRROR_CONFIG_RE.fullmatch((mirror / "config").read_text())
    fgit.archive_commit(url, git(proj.upstream, "rev-parse", "HEAD"), cache)  # used as it is, not cloned again
    assert len(seen) == 1


def test_fetching_through_a_git_mirror_leaves_no_git_process_running(proj: Proj, tmp_path: Path):
    # the object check reads every object through gitpython's `git cat-file --batch` processes: left open, two of
    # them outlived archive_commit (in a sync that fetches, and in every test that fetches, until the process ended)
    import os

    from forktool import git as fgit
    from tests.helpers.project import git

    def children() -> list[str]:
        out = []
        for d in os.listdir("/proc"):
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                    out.append(Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except (OSError, ValueError, IndexError):
                continue
        return out

    commit = git(proj.upstream, "rev-parse", "HEAD")
    for _ in range(2):  # a clone, then the mirror as it is
        assert fgit.archive_commit(str(proj.upstream), commit, tmp_path / "c")
        assert not [c for c in children() if c.startswith("git ")]


def test_a_git_mirror_missing_an_object_is_a_refusal_not_an_internal_error(proj: Proj, cache: Path):
    # the object check read a missing object through gitpython, whose ValueError ended forktool as an internal error
    # (exit 3); git's own archive had refused it as `git could not provide` (exit 1)
    import os


    obj = _loose_mirror_object(proj, cache, "src/b.c")
    blob, mirror = obj.parent.name + obj.name, obj.parents[2]
    os.unlink(obj)
    shutil.rmtree(proj.tree)
    shutil.rmtree(proj.root / ".opencoti")
    code, out, err = proj.run("vendor", "fetch", "--no-cache", expect=1)
    assert f"the git mirror lacks object {blob[:12]} (blob)" in err and str(mirror) in err and "Traceback" not in err
