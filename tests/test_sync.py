"""forktool sync on synthetic upstreams: every status, outputs, hooks, build-file drift, --accept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest

from forktool import sync as fsync
from forktool.apply import apply_file
from forktool.commands import sync_cmds
from forktool.errors import ForktoolError, UsageError
from forktool.project import Project
from forktool.series import Patch, parse_patch
from tests.helpers.sync import sync_patch, write_project

DATE = "Mon, 30 Nov 2026 00:00:00 +0000"


# ---------------------------------------------------------------- helpers


def func(name: str, n: int = 24, tweak: dict[int, str] | None = None) -> str:
    """A C function with n distinct body lines; tweak replaces body line i."""
    body = [f"    int {name}_{i} = {i};" for i in range(n)]
    for i, text in (tweak or {}).items():
        body[i] = text
    return f"int {name}(void) {{\n" + "\n".join(body) + "\n    return 0;\n}\n"


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


OLD_FILES = {
    "src/a.c": func("a_fn"),
    "src/b.c": func("b_fn"),
    "src/c.c": func("c_fn"),
    "src/d.c": func("d_fn"),
    "src/e.c": func("e_fn"),
    "src/f.c": "int helper(void) { return 1; }\n\n" + func("f_fn"),
    "src/CMakeLists.txt": "add_library(llama\n    a.c\n    b.c\n)\n",
}


def new_upstream(old: dict[str, str]) -> dict[str, str]:
    """The 'newer upstream': one kind of drift per file."""
    new = dict(old)
    new["src/b.c"] = "// five new lines\n" * 5 + old["src/b.c"]  # offset
    new["src/c.c"] = edit(old["src/c.c"], "c_fn_7 = 7;", "c_fn_7 = 70;")  # near the patch: merge
    new["src/d.c"] = edit(old["src/d.c"], "d_fn_10 = 10;", "d_fn_10 = 1000;")  # same line: conflict
    new["src/e.c"] = edit(old["src/e.c"], "e_fn_10 = 10;", "e_fn_10 = 11; // opencoti-hook: e")  # upstreamed
    # f_fn moves to another file; helper stays
    new["src/f.c"] = "int helper(void) { return 1; }\n"
    new["src/g.c"] = func("f_fn")
    new["src/CMakeLists.txt"] = "add_library(llama\n    a.c\n    g.c\n)\n"
    return new


def commit_tree(repo: git.Repo, files: dict[str, str], message: str) -> str:
    root = Path(repo.working_tree_dir)
    for p in root.rglob("*"):
        if p.is_file() and ".git" not in p.parts:
            p.unlink()
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    repo.git.add("-A")
    repo.git.commit("-m", message, "--allow-empty")
    return repo.head.commit.hexsha


def series_for(old: dict[str, str]) -> list[Patch]:
    def change(rel: str, a: str, b: str) -> tuple[str, bytes, bytes]:
        return (f"llama.cpp/{rel}", old[rel].encode(), edit(old[rel], a, b).encode())

    d_after_4 = edit(old["src/d.c"], "d_fn_10 = 10;", "d_fn_10 = 11; // opencoti-hook: d")
    return [
        sync_patch("0001-a.patch", "clean one", [change("src/a.c", "a_fn_10 = 10;", "a_fn_10 = 11; // opencoti-hook: a")]),
        sync_patch("0002-b.patch", "offset one", [change("src/b.c", "b_fn_10 = 10;", "b_fn_10 = 11;")]),
        sync_patch("0003-c.patch", "merged one", [change("src/c.c", "c_fn_10 = 10;", "c_fn_10 = 11;")]),
        sync_patch("0004-d.patch", "conflicting one", [("llama.cpp/src/d.c", old["src/d.c"].encode(), d_after_4.encode())]),
        sync_patch("0005-e.patch", "upstreamed one", [change("src/e.c", "e_fn_10 = 10;", "e_fn_10 = 11; // opencoti-hook: e")]),
        sync_patch("0006-d2.patch", "blocked one", [("llama.cpp/src/d.c", d_after_4.encode(),
                                                      edit(d_after_4, "d_fn_20 = 20;", "d_fn_20 = 21;").encode())]),
        sync_patch("0007-new.patch", "new file", [("llama.cpp/src/window.h", None, b"#pragma once\nint w(void);\n")]),
    ]


def upstream_repo(tmp_path, monkeypatch, old: dict, new: dict):
    """A git upstream with two commits (old, then new) and a private cache."""
    monkeypatch.setenv("FORKTOOL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FORKTOOL_ROOT", raising=False)
    repo = git.Repo.init(tmp_path / "upstream")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "t")
        cw.set_value("user", "email", "t@example.invalid")
    return repo, commit_tree(repo, old, "old"), commit_tree(repo, new, "new")


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    return upstream_repo(tmp_path, monkeypatch, OLD_FILES, new_upstream(OLD_FILES))


def component_yaml(url: str, commit: str) -> str:
    return ("# pin of the test upstream\ncomponents:\n  - name: llama.cpp\n    kind: git\n"
            f"    url: {url}\n    # the commit we build on\n    commit: {commit}\n    upstream_commit: {commit}\n"
            "    include:\n      - src\n")


@pytest.fixture
def project(tmp_path, upstream):
    repo, c1, _ = upstream
    return write_project(tmp_path / "proj", component_yaml(repo.working_tree_dir, c1), series_for(OLD_FILES))


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- statuses


def test_every_status(project, upstream, tmp_path):
    _, _, c2 = upstream
    before = snapshot(project.root / "patches") | snapshot(project.root / "vendor")
    rep = sync_cmds.sync(project, c2, accept=False, build=False, out=str(tmp_path / "out"))
    got = {p["id"]: p["status"] for p in rep.data["patches"]}
    assert got == {"0001": "clean", "0002": "offset", "0003": "merged", "0004": "conflict",
                   "0005": "upstreamed", "0006": "blocked", "0007": "clean"}
    assert rep.exit_code == 1
    assert rep.data["counts"] == {"clean": 2, "offset": 1, "merged": 1, "conflict": 1, "upstreamed": 1, "blocked": 1}
    by_id = {p["id"]: p for p in rep.data["patches"]}
    assert by_id["0002"]["drift"] == [{"patch": "0002", "file": "llama.cpp/src/b.c", "hunk": 1, "offset": 5}]
    assert by_id["0006"]["blocked_by"] == ["0004"]
    assert [h["how"] for h in by_id["0003"]["files"][0]["hunks"]] == ["changed"]
    # the user's project is untouched: pin, patches, and no vendored tree made
    assert snapshot(project.root / "patches") | snapshot(project.root / "vendor") == before
    assert not project.tree.exists()


def test_conflict_text_and_merge_result(project, upstream, tmp_path):
    _, _, c2 = upstream
    res = fsync.sync(project, c2, build=False, out=tmp_path / "out")
    conflict = next(r for r in res.results if r.patch.id == "0004")
    [block] = conflict.files[0].conflicts
    assert block["text"].startswith("<<<<<<< patch (on the pinned upstream)")
    assert "d_fn_10 = 1000;" in block["text"] and "d_fn_10 = 11;" in block["text"]
    merged = next(r for r in res.results if r.patch.id == "0003")
    # the refreshed patch carries the patch's change on top of upstream's neighbouring edit
    assert b"-    int c_fn_10 = 10;\n+    int c_fn_10 = 11;\n" in merged.refreshed.raw
    assert b" int c_fn_7 = 70;" in merged.refreshed.raw.replace(b"    int", b"int")


def test_outputs_refreshed_patches_apply_exactly(project, upstream, tmp_path):
    repo, _, c2 = upstream
    out = tmp_path / "out"
    fsync.sync(project, c2, build=False, out=out)
    names = sorted(p.name for p in (out / "patches").iterdir())
    assert names == ["0001-a.patch", "0002-b.patch", "0003-c.patch", "0007-new.patch", "series"]
    series = (out / "patches" / "series").read_text()
    assert "# 0005-e.patch" in series and "upstreamed in" in series
    assert "\n0004-d.patch\n" in series  # a conflicting patch stays in the series: a human must fix it
    upstream_files = {f"llama.cpp/{k}": v.encode() for k, v in new_upstream(OLD_FILES).items()}
    state: dict[str, bytes | None] = {}
    for name in names[:-1]:
        patch = parse_patch((out / "patches" / name).read_bytes(), name)
        original = (project.patches_dir / name).read_bytes()
        assert patch.header == parse_patch(original, name).header  # messages and trailers are kept
        for fd in patch.files:
            cur = state[fd.path] if fd.path in state else upstream_files.get(fd.path)
            state[fd.path], drift = apply_file(patch, fd, cur)
            assert drift == []
    data = json.loads((out / "report.json").read_text())
    assert data["to"]["upstream_commit"] == c2 and data["acceptable"] is False
    md = (out / "report.md").read_text()
    for word in ("clean", "offset", "merged", "conflict", "upstreamed", "blocked", "<<<<<<<"):
        assert word in md
    assert len(md.encode()) < 1024 * 1024  # $GITHUB_STEP_SUMMARY takes at most 1 MiB


def test_outputs_are_deterministic(project, upstream, tmp_path):
    _, _, c2 = upstream
    fsync.sync(project, c2, build=False, out=tmp_path / "o1")
    fsync.sync(project, c2, build=False, out=tmp_path / "o2")
    assert snapshot(tmp_path / "o1") == snapshot(tmp_path / "o2")


# ---------------------------------------------------------------- hooks and build files


def test_hook_relocation(project, upstream, tmp_path):
    _, _, c2 = upstream
    (project.registry_dir / "UPSTREAM_SYNC.yaml").write_text(
        "schema: 1\npatches: []\nhooks:\n"
        "  a:\n    patch: '0001'\n    sites:\n      - {file: llama.cpp/src/a.c, symbol: a_fn, line: 1}\n"
        "  b:\n    patch: '0002'\n    sites:\n      - {file: llama.cpp/src/b.c, symbol: b_fn, line: 1}\n"
        "  f:\n    patch: '0001'\n    sites:\n      - {file: llama.cpp/src/f.c, symbol: f_fn, line: 3}\n"
        "  gone:\n    patch: '0001'\n    sites:\n      - {file: llama.cpp/src/a.c, symbol: nowhere_fn, line: 9}\n"
        # 0005 is upstreamed: its site goes with it, though upstream's e.c still has e_fn
        "  e:\n    patch: '0005'\n    sites:\n      - {file: llama.cpp/src/e.c, symbol: e_fn, line: 1}\n")
    res = fsync.sync(project, c2, build=False, out=tmp_path / "out")
    sites = {s["hook"]: s for s in res.hooks["sites"]}
    assert (sites["e"]["status"], sites["e"]["new_line"]) == ("dropped", None)
    assert (sites["a"]["status"], sites["a"]["new_line"]) == ("found", 1)
    assert (sites["b"]["status"], sites["b"]["new_line"]) == ("moved_lines", 6)
    assert (sites["f"]["status"], sites["f"]["new_file"], sites["f"]["new_line"]) == (
        "moved_file", "llama.cpp/src/g.c", 1)
    assert sites["gone"]["status"] == "vanished"
    assert res.needs_human
    # the proposal moves found sites and leaves vanished ones for a human
    import yaml
    proposal = yaml.safe_load((tmp_path / "out" / "registry" / "UPSTREAM_SYNC.yaml").read_text())
    assert proposal["hooks"]["f"]["sites"] == [{"file": "llama.cpp/src/g.c", "symbol": "f_fn", "line": 1}]
    assert proposal["hooks"]["b"]["sites"][0]["line"] == 6
    assert proposal["hooks"]["gone"]["sites"][0]["line"] == 9


def test_build_file_drift(project, upstream, tmp_path):
    _, _, c2 = upstream
    res = fsync.sync(project, c2, build=False, out=tmp_path / "out")
    llama = next(b for b in res.build_files if b["target"] == "llama")
    assert (llama["added"], llama["removed"]) == (["g.c"], ["b.c"])


def test_build_files_neither_upstream_lists_are_not_checked_not_unchanged(tmp_path, monkeypatch):
    """Upstreams without the targets' CMake files give no source list to compare: the report says not checked,
    per target and why, never that the source lists are unchanged."""
    no_cmake = {k: v for k, v in OLD_FILES.items() if "CMake" not in k}
    repo, c1, c2 = upstream_repo(tmp_path, monkeypatch, no_cmake,
                                 {k: v for k, v in new_upstream(no_cmake).items() if "CMake" not in k})
    project = write_project(tmp_path / "proj", component_yaml(repo.working_tree_dir, c1), series_for(OLD_FILES)[:2])
    rep = sync_cmds.sync(project, c2, False, False, str(tmp_path / "out"))
    md = (tmp_path / "out" / "report.md").read_text()
    section = md[md.index("## Build files"):md.index("## cpu build")]
    assert "unchanged" not in section
    rows = {b["target"]: b for b in rep.data["build_files"]}
    assert rows["llama"]["not_checked"] == "neither upstream has src/CMakeLists.txt"
    assert all(b["not_checked"] for b in rows.values()), rows
    assert "Not checked (no source list to compare): llama (neither upstream has src/CMakeLists.txt)" in section
    assert any("build files not checked" in ln and "llama (neither upstream has" in ln for ln in rep.lines)


def test_build_files_a_target_neither_upstream_defines_is_not_checked():
    """A CMake file on both sides that defines the target on neither lists no source: not checked, not unchanged."""
    text = b"add_library(other z.cpp)\n"
    files = ["up/src/z.cpp"]
    read = {"up/src/CMakeLists.txt": text}.get
    row = next(r for r in fsync.build_file_drift(read, read, files, files, "up/") if r["target"] == "llama")
    assert row["not_checked"] == "neither upstream's src/CMakeLists.txt defines add_library(llama ...)"
    ok = b"add_library(llama a.cpp)\n"
    row = next(r for r in fsync.build_file_drift({"up/src/CMakeLists.txt": ok}.get, {"up/src/CMakeLists.txt": ok}.get,
                                                 files, files, "up/") if r["target"] == "llama")
    assert (row["not_checked"], row["added"], row["removed"]) == ("", [], [])


def test_cmake_sources_follow_lists_and_globs():
    text = (b'file(GLOB MODELS "models/*.cpp")\nset(CORE\n  a.cpp # a comment.cpp\n  b.cpp)\n'
            b"add_library(llama ../include/llama.h ${CORE} ${MODELS})\nadd_library(other z.cpp)\n")
    files = ["l/src/models/m1.cpp", "l/src/models/sub/deep.cpp", "l/src/z.cpp"]
    assert fsync.cmake_sources(text, "llama", "l/src", files) == {"../include/llama.h", "a.cpp", "b.cpp",
                                                                  "models/m1.cpp"}


# ---------------------------------------------------------------- accept


def test_accept_refused_with_conflicts(project, upstream, tmp_path):
    _, _, c2 = upstream
    before = snapshot(project.root / "patches") | snapshot(project.root / "vendor")
    with pytest.raises(ForktoolError, match="--accept refused"):
        sync_cmds.sync(project, c2, accept=True, build=False, out=str(tmp_path / "out"))
    assert snapshot(project.root / "patches") | snapshot(project.root / "vendor") == before


def test_accept_moves_pin_and_patches(tmp_path, upstream):
    repo, c1, c2 = upstream
    patches = [p for p in series_for(OLD_FILES) if p.id in ("0001", "0002", "0003", "0005", "0007")]
    project = write_project(tmp_path / "proj", component_yaml(repo.working_tree_dir, c1), patches)
    env = dict(os.environ, FORKTOOL_ROOT=str(project.root))

    def ft(*argv: str) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "forktool", *argv], env=env, capture_output=True, text=True)
        assert r.returncode == 0, (argv, r.stderr)
        return r
    for argv in (["vendor", "fetch"], ["apply"]):
        ft(*argv)
    assert json.loads(ft("status", "--json").stdout)["pin_moved"] == []
    rep = sync_cmds.sync(project, c2, accept=True, build=False, out="dist/sync")
    assert rep.exit_code == 0 and rep.data["acceptable"]
    # the tree still holds the old upstream: status says "clean" of it against the lock, and that the pin moved
    st = ft("status")
    assert "tree: clean" in st.stderr and "pin moved: llama.cpp: vendor.yaml pins " in st.stderr
    assert f"@{c2}, the tree holds " in st.stderr and st.stderr.rstrip().endswith("(docs/sync.md)")
    assert "vendor fetch && forktool apply" in st.stderr
    yaml_text = project.vendor_yaml.read_text()
    assert f"commit: {c2}\n" in yaml_text and f"upstream_commit: {c2}\n" in yaml_text
    assert "# the commit we build on" in yaml_text and c1 not in yaml_text
    out = project.root / "dist" / "sync" / "patches"
    for name in ("0001-a.patch", "0002-b.patch", "0003-c.patch", "0007-new.patch"):
        assert (project.patches_dir / name).read_bytes() == (out / name).read_bytes()
    assert "# 0005-e.patch" in project.series_file.read_text()
    backups = list((project.state_dir / "sync-backups").iterdir())
    assert len(backups) == 1 and (backups[0] / "manifest.json").is_file()
    # the accepted project applies exactly on the new pin
    ft("unapply")
    shutil.rmtree(project.tree)
    for argv in (["vendor", "fetch"], ["apply"], ["verify"]):
        ft(*argv)
    assert json.loads(ft("status", "--json").stdout)["pin_moved"] == []
    # a second sync to the same upstream is now all clean
    again = sync_cmds.sync(Project(project.root), c2, accept=False, build=False, out=str(tmp_path / "again"))
    assert again.exit_code == 0
    assert {p["status"] for p in again.data["patches"]} == {"clean"}


def test_repin_keeps_comments_of_the_real_vendor_yaml():
    text = (Path(__file__).parents[1] / "vendor" / "vendor.yaml").read_text()
    project = Project(Path(__file__).parents[1])
    old, new = fsync.resolve_spec(project, "llama-cpp-python==0.3.35")
    assert (new.version, new.sha256) == ("0.3.35", "")
    new = new._replace(sha256="ab" * 32, upstream_commit="cd" * 20)
    out = fsync._repin_text(text, old.name, new)
    assert out.count("\n") == text.count("\n")
    # each value keeps its line's style: the version quoted, the digests plain as they were
    assert 'version: "0.3.35"' in out and f'sha256: {"ab" * 32}\n' in out
    assert [ln for ln in out.splitlines() if ln.lstrip().startswith("#")] == \
        [ln for ln in text.splitlines() if ln.lstrip().startswith("#")]
    # an unknown upstream commit drops the stale line instead of keeping a wrong one
    out2 = fsync._repin_text(text, old.name, new._replace(upstream_commit=""))
    assert "upstream_commit" not in out2


@pytest.mark.parametrize("spec", ["llama-cpp-python==1.0;rm", "abc@def", "", "./no/such.tar.gz",
                                  "https://example.org/llama.tar.gz", "pkg==1.0#subdir=../up"])
def test_bad_spec(spec):
    project = Project(Path(__file__).parents[1])
    with pytest.raises(UsageError):
        fsync.resolve_spec(project, spec)


def test_cli_json(project, upstream, tmp_path):
    _, _, c2 = upstream
    env = dict(os.environ, FORKTOOL_ROOT=str(project.root))
    r = subprocess.run([sys.executable, "-m", "forktool", "sync", "--to", c2, "--out", str(tmp_path / "o"),
                        "--json"], env=env, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["counts"]["conflict"] == 1 and "fetch_s" in data["timings"]


def test_broken_registry_is_reported_not_fatal(project, upstream, tmp_path):
    _, _, c2 = upstream
    (project.registry_dir / "UPSTREAM_SYNC.yaml").write_text("schema: 1\npatches: []\nhooks: {x: {patch: '1'}}\n")
    res = fsync.sync(project, c2, build=False, out=tmp_path / "out")
    assert "missing key" in res.hooks["error"] and res.needs_human
    assert "does not load" in (tmp_path / "out" / "report.md").read_text()


def test_build_is_skipped_when_patches_do_not_apply(project, upstream, tmp_path):
    _, _, c2 = upstream
    res = fsync.sync(project, c2, build=True, out=tmp_path / "out")
    assert res.build["status"] == "skipped"
    assert not (tmp_path / "out" / "build-project").exists()


def test_the_trial_looks_past_a_conflict(project, upstream, tmp_path):
    """A patch blocked by a conflict is still tried, on the conflicting patch's own side, so the report shows what
    the move will meet after that conflict is resolved."""
    _, _, c2 = upstream
    out = tmp_path / "out"
    rep = sync_cmds.sync(project, c2, accept=False, build=False, out=str(out))
    blocked = next(p for p in rep.data["patches"] if p["id"] == "0006")
    assert blocked["status"] == "blocked" and blocked["blocked_by"] == ["0004"]
    assert blocked["ahead"]["status"] == "clean" and "0004" in blocked["ahead"]["assumes"]
    assert "0006 blocked one by 0004 (ahead: clean)" in "\n".join(rep.lines)
    assert "(ahead: clean)" in (out / "report.md").read_text()
    assert rep.data["acceptable"] is False and rep.exit_code == 1  # still blocked: nothing is taken from a guess


def test_the_own_side_stand_in():
    merged = (b"a\n<<<<<<< patch\nours 1\nours 2\n||||||| base\nbase\n=======\ntheirs\n>>>>>>> new\nb\n"
              b"<<<<<<< patch\n=======\nonly theirs\n>>>>>>> new\n")
    assert fsync.own_side(merged) == b"a\nours 1\nours 2\nb\n"


def test_an_interrupted_accept_is_rolled_forward_under_the_lock(tmp_path, upstream):
    """--accept killed after its journal committed: the next sync (trial or loop) finishes it before anything."""
    repo, c1, c2 = upstream
    patches = [p for p in series_for(OLD_FILES) if p.id in ("0001", "0002", "0003", "0005", "0007")]
    project = write_project(tmp_path / "proj", component_yaml(repo.working_tree_dir, c1), patches)
    env = dict(os.environ, FORKTOOL_ROOT=str(project.root), FORKTOOL_FAULT="committed")
    r = subprocess.run([sys.executable, "-m", "forktool", "sync", "--to", c2, "--accept"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 137, r.stderr
    assert c1 in project.vendor_yaml.read_text()  # killed before the pin moved
    env.pop("FORKTOOL_FAULT")
    r = subprocess.run([sys.executable, "-m", "forktool", "sync", "--to", c2, "--out", str(tmp_path / "again")],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "roll" in r.stderr.lower() or "interrupted" in r.stderr.lower(), r.stderr
    assert f"commit: {c2}\n" in project.vendor_yaml.read_text()
    assert not any((project.state_dir / "sync-txn").rglob("plan.json"))  # the journal is done


def test_hook_sites_of_a_patch_that_did_not_apply_are_not_checked(project, upstream, tmp_path):
    """A site looked for in a tree without its patch (conflict, blocked) is `not_checked`, never `vanished`."""
    _, _, c2 = upstream
    (project.registry_dir / "UPSTREAM_SYNC.yaml").write_text(
        "schema: 1\npatches: []\nhooks:\n"
        "  gone:\n    patch: '0001'\n    sites:\n      - {file: llama.cpp/src/a.c, symbol: nowhere_fn, line: 9}\n"
        "  d2:\n    patch: '0006'\n    sites:\n      - {file: llama.cpp/src/d.c, symbol: d_new_fn, line: 3}\n"
        # d_fn stands in upstream's d.c, but where is no news of a marker that 0004's conflict kept out
        "  d:\n    patch: '0004'\n    sites:\n      - {file: llama.cpp/src/d.c, symbol: d_fn, line: 1}\n")
    res = fsync.sync(project, c2, build=False, out=tmp_path / "out")
    sites = {s["hook"]: s for s in res.hooks["sites"]}
    assert sites["gone"]["status"] == "vanished"  # its patch applied: the symbol really is gone
    assert sites["d2"]["status"] == "not_checked" and "0006 is blocked" in sites["d2"]["reason"]
    assert sites["d"]["status"] == "not_checked" and "0004 is conflict" in sites["d"]["reason"]
    assert sites["d"]["new_line"] is None
    assert res.needs_human
    # the terminal gets one line for the sites it could not check, the report every one of them
    (project.registry_dir / "UPSTREAM_SYNC.yaml").write_text(
        "schema: 1\npatches: []\nhooks:\n"
        "  d2:\n    patch: '0006'\n    sites:\n      - {file: llama.cpp/src/d.c, symbol: d_new_fn, line: 3}\n"
        "      - {file: llama.cpp/src/d.c, symbol: d_other_fn, line: 5}\n"
        "  d:\n    patch: '0004'\n    sites:\n      - {file: llama.cpp/src/d.c, symbol: d_fn, line: 1}\n")
    rep = sync_cmds.sync(project, c2, accept=False, build=False, out=str(tmp_path / "out2"))
    hook_lines = [x for x in rep.lines if x.startswith("hook")]
    assert hook_lines == [f"hook sites not checked (their patch did not apply here): 3 in 2 hook(s), d 1, d2 2; "
                          f"each in {tmp_path / 'out2'}/report.md"], rep.lines
    report = (tmp_path / "out2" / "report.md").read_text()
    assert "d_new_fn" in report and "d_other_fn" in report and "d_fn" in report


def test_a_trial_build_names_the_profile_it_built_and_that_no_other_was(tmp_path, upstream, monkeypatch):
    from forktool.sync import job

    repo, c1, c2 = upstream
    patches = [p for p in series_for(OLD_FILES) if p.id in ("0001", "0002", "0003", "0005", "0007")]
    project = write_project(tmp_path / "proj", component_yaml(repo.working_tree_dir, c1), patches)
    # the scratch build itself (a whole llama.cpp compile) runs in the slow tests; here what the trial says of it
    monkeypatch.setattr(job, "run_build", lambda *a, **k: {"status": "ok", "profile": "cpu", "seconds": 12.5,
                                                          "project": "p", "objects": 283, "outputs": {}})
    rep = sync_cmds.sync(project, c2, accept=False, build=True, out=str(tmp_path / "out"))
    text = "\n".join(rep.lines)
    assert "build: the cpu profile built (283 object(s) compiled, 12.5 s); no other profile was built or compiled" \
        in text and "build: ok" not in text


@pytest.mark.parametrize("out", [".", "patches", "vendor/x", "registry", ".opencoti/out", "afile", "afile/sub"])
def test_an_out_that_is_not_a_directory_of_its_own_is_refused(proj, out: str) -> None:
    # the trial replaces DIR/patches/ and writes DIR/registry/UPSTREAM_SYNC.yaml: `--out .` replaced the project's
    # own patches/ with the refreshed ones (the conflicting ones gone, exit 1), and a file there was an internal error
    from tests.helpers.sync import everything, loop_series, new_upstream

    loop_series(proj)
    commit = new_upstream(proj)
    (proj.root / "afile").write_text("x\n")
    before = everything(proj)
    code, out_text, _ = proj.run("sync", "--to", commit, "--out", out, "--json", expect=2)
    err = json.loads(out_text)
    assert err["kind"] == "UsageError" and err["where"].startswith("--out ") and "nothing was changed" in err["hint"]
    assert everything(proj) == before
    assert not (proj.root / "report.json").exists() and (proj.root / "afile").read_text() == "x\n"


def test_a_trial_build_whose_report_is_not_read_says_so_never_zero_objects(tmp_path, upstream, monkeypatch):
    # the scratch build exited 0 but its --json was not a build report: "0 object(s) compiled" would be false
    import subprocess as sp

    from forktool import proc
    from forktool.sync import job, scratch

    repo, c1, c2 = upstream
    patches = [p for p in series_for(OLD_FILES) if p.id in ("0001", "0002")]
    project = write_project(tmp_path / "proj", component_yaml(repo.working_tree_dir, c1), patches)
    steps = []
    monkeypatch.setattr(proc, "run", lambda cmd, **k: steps.append(cmd[3:]) or sp.CompletedProcess(cmd, 0, b"built\n", b""))
    got = scratch.run_build(project, tmp_path / "scratch", "components: []\n", [], "", lambda _: None)
    assert [s[0] for s in steps] == ["vendor", "apply", "build"] and got["status"] == "ok" and got["objects"] is None
    monkeypatch.setattr(job, "run_build", lambda *a, **k: got)
    rep = sync_cmds.sync(project, c2, accept=False, build=True, out=str(tmp_path / "out"))
    text = "\n".join(rep.lines)
    assert "build: the cpu profile built (objects compiled not read: its --json output was not a build report" in text
    assert "0 object(s)" not in text
    report = (tmp_path / "out" / "report.md").read_text()
    assert "objects compiled not read" in report and "(None objects)" not in report
