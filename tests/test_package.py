"""Release packaging: same inputs give the same bytes, and verify catches any tampering."""

from __future__ import annotations

import gzip
import os
import signal
import tarfile
from pathlib import Path

import pytest

from forktool import cli
from forktool import package as pk
from forktool.errors import VerifyError
from tests.helpers.build import BUILD_YAML, demo_project
from tests.helpers.cli import signal_at
from tests.helpers.project import Proj, bare_project


def _inputs(root: Path) -> pk.ReleaseSpec:
    tree = root / "tree"
    (tree / "llama.cpp" / "src").mkdir(parents=True)
    (tree / "llama.cpp" / "src" / "llama.cpp").write_text("int main() {}\n")
    (tree / "llama.cpp" / "CMakeLists.txt").write_text("project(x)\n")
    (tree / "llama.cpp" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(tree / "llama.cpp" / "run.sh", 0o755)
    bins = root / "build" / "bin"
    bins.mkdir(parents=True)
    (bins / "llama-cli").write_bytes(b"\x7fELF cli")
    os.chmod(bins / "llama-cli", 0o755)
    (bins / "libllama.so").write_bytes(b"\x7fELF lib")
    manifest = {"profile": "cpu", "stamp": "0c1e5709+pristine", "build_number": 0, "top": None,
                "series_digest": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "patches": [], "registry_digest": None, "pristine_digest": "0" * 64,
                "upstream": {"component": "llama.cpp", "package": "llama-cpp-python", "version": "0.3.36",
                             "sdist_sha256": "1" * 64, "upstream_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"},
                "build": {"generator": "Unix Makefiles", "targets": ["llama-cli"], "compilers": {"cxx": "GNU 12.2.0"},
                          "flags": ["-DCMAKE_BUILD_TYPE=Release"]}}
    return pk.ReleaseSpec("llama.cpp-0c1e5709+pristine-cpu",
                          {"bin/llama-cli": bins / "llama-cli", "bin/libllama.so": bins / "libllama.so"},
                          tree, manifest, {"registry": {}}, epoch=0)


@pytest.fixture
def release(tmp_path: Path) -> Path:
    spec = _inputs(tmp_path / "in")
    return Path(pk.write_release(spec, tmp_path / "dist")["dir"])


def test_packaging_twice_gives_identical_bytes(tmp_path: Path) -> None:
    spec = _inputs(tmp_path / "in")
    a = pk.write_release(spec, tmp_path / "a")
    # different mtimes and umask on the inputs must not leak into the archives
    for p in (spec.source_tree / "llama.cpp").rglob("*"):
        os.utime(p, (1_000_000, 1_000_000))
    old = os.umask(0o077)
    try:
        b = pk.write_release(spec, tmp_path / "b")
    finally:
        os.umask(old)
    assert Path(a["archive"]).read_bytes() == Path(b["archive"]).read_bytes()
    src = f"{spec.name}/{spec.name}-source.tar.gz"
    assert (tmp_path / "a" / src).read_bytes() == (tmp_path / "b" / src).read_bytes()


def test_archives_have_no_timestamps_or_owners(release: Path) -> None:
    archive = release.with_name(release.name + ".tar.gz")
    head = archive.read_bytes()[:10]
    assert head[3] & 0x08 == 0, "gzip header carries a file name"
    assert head[4:8] == b"\0\0\0\0", "gzip header carries a time"
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and names[0] == release.name
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" and m.gname == "" for m in members)
    modes = {m.name.rsplit("/", 1)[-1]: m.mode for m in members}
    assert modes["llama-cli"] == 0o755 and modes["RELEASE_NOTES.md"] == 0o644


def test_release_holds_manifest_sums_notes_and_source(release: Path) -> None:
    names = sorted(p.relative_to(release).as_posix() for p in release.rglob("*") if p.is_file())
    assert names == ["RELEASE_NOTES.md", "SHA256SUMS", "bin/libllama.so", "bin/llama-cli",
                     f"{release.name}-source.tar.gz", "manifest.json"]
    notes = (release / "RELEASE_NOTES.md").read_text()
    assert "0c1e5709+pristine" in notes and "No patch applied" in notes and "bin/llama-cli" in notes
    with tarfile.open(release / f"{release.name}-source.tar.gz") as tar:
        assert f"{release.name}-source/llama.cpp/src/llama.cpp" in tar.getnames()
    res = pk.verify_release(release)
    assert res["ok"] and res["files"] == 5


def test_verify_catches_a_flipped_byte(release: Path) -> None:
    p = release / "bin" / "llama-cli"
    data = bytearray(p.read_bytes())
    data[3] ^= 0x01
    p.write_bytes(bytes(data))
    with pytest.raises(VerifyError) as e:
        pk.verify_release(release)
    assert "bin/llama-cli: sha256 differs from SHA256SUMS" in e.value.details


@pytest.mark.parametrize("tamper", ["extra", "missing", "manifest", "source"])
def test_verify_catches_other_tampering(release: Path, tamper: str) -> None:
    if tamper == "extra":
        (release / "bin" / "evil.so").write_bytes(b"x")
    elif tamper == "missing":
        (release / "RELEASE_NOTES.md").unlink()
    elif tamper == "manifest":
        m = release / "manifest.json"
        m.write_text(m.read_text().replace('"cpu"', '"cuda"'))
    else:
        src = release / f"{release.name}-source.tar.gz"
        data = bytearray(src.read_bytes())
        data[len(data) // 2] ^= 0xFF
        src.write_bytes(bytes(data))
    with pytest.raises(VerifyError):
        pk.verify_release(release)


def test_verify_refuses_a_path_listed_twice_in_the_sums(release: Path) -> None:
    # `sha256sum -c SHA256SUMS` checks every line: a wrong line beside a right one for the same file is no match
    sums = release / "SHA256SUMS"
    sums.write_text("0" * 64 + "  bin/llama-cli\n" + sums.read_text())
    with pytest.raises(VerifyError) as e:
        pk.verify_release(release)
    assert any(d.endswith(": bin/llama-cli is listed again") for d in e.value.details), e.value.details

def test_verify_reads_the_archive_too(release: Path) -> None:
    assert pk.verify_release(release.with_name(release.name + ".tar.gz"))["ok"]


def test_verifying_an_archive_ended_by_sigterm_leaves_nothing_in_tmpdir(release: Path, proj: Proj, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # the archive is extracted under .opencoti/tmp/ (a whole release: the binaries and the source), which the next
    # command making a temporary directory there cleans; SIGTERM runs no clean-up, and $TMPDIR is never written
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    arc = str(release.with_name(release.name + ".tar.gz"))
    work = proj.root / ".opencoti" / "tmp"
    # at the first file extracted: renamed into place inside the extracted release directory
    r = signal_at(proj.root, signal.SIGTERM, f"{release.name}/", ["package", "verify", arc], event="os.rename")
    assert r.returncode == -signal.SIGTERM, r.stderr
    assert os.listdir(tmpdir) == [] and len(os.listdir(work)) == 1
    code, out, err = proj.run("package", "verify", arc)
    assert "package verify: OK" in err
    assert os.listdir(tmpdir) == [] and os.listdir(work) == []


def test_package_verify_cli_exits_1_on_tampering(release: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    proj = bare_project(tmp_path / "proj")
    monkeypatch.setenv("FORKTOOL_ROOT", str(proj))
    assert cli.main(["package", "verify", str(release)]) == 0
    with gzip.open(release / f"{release.name}-source.tar.gz") as f:
        assert f.read(1)
    (release / "bin" / "libllama.so").write_bytes(b"\x7fELF liB")
    assert cli.main(["package", "verify", str(release), "--json"]) == 1
    assert "bin/libllama.so: sha256 differs" in capsys.readouterr().out


def _resum(release: Path) -> None:
    """SHA256SUMS rewritten to match the files as they are now: only the manifest's own content is wrong."""
    files = {rel: pk.sha256_file(p) for rel, p in pk.tree_entries(release) if p.is_file() and rel != pk.SUMS}
    (release / pk.SUMS).write_text(pk.sums_text(files))


def _listing(root: Path) -> dict[str, bytes]:
    return {rel: p.read_bytes() for rel, p in pk.tree_entries(root) if p.is_file()}


@pytest.mark.parametrize("label, edit", [
    ("empty-list", lambda m: []),
    ("list-of-int", lambda m: [1]),
    ("string", lambda m: "x"),
    ("files-list", lambda m: dict(m, files=[])),
    ("upstream-string", lambda m: dict(m, upstream="x")),
    ("patches-of-strings", lambda m: dict(m, patches=["0070"])),
    ("source-archive-missing", lambda m: {k: v for k, v in m.items() if k != "source_archive"}),
])
def test_a_release_manifest_of_the_wrong_shape_is_refused(release: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str], label: str,
                                                          edit: object) -> None:
    import json

    m = release / "manifest.json"
    m.write_text(json.dumps(edit(json.loads(m.read_text()))))  # type: ignore[operator]
    _resum(release)
    before = _listing(release)
    with pytest.raises(VerifyError) as e:
        pk.verify_release(release)
    assert any(d.startswith("manifest.json: ") for d in e.value.details), e.value.details
    proj = bare_project(tmp_path / "proj")
    monkeypatch.setenv("FORKTOOL_ROOT", str(proj))
    capsys.readouterr()
    assert cli.main(["package", "verify", str(release)]) == 1
    err = capsys.readouterr().err
    assert "manifest.json" in err and "Traceback" not in err
    assert _listing(release) == before


# ---------------------------------------------------------------- `forktool package` of a real (tiny) build

_TOOL_CMAKE = """\
cmake_minimum_required(VERSION 3.16)
project(demo C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_library(demo SHARED src/a.c)
set_target_properties(demo PROPERTIES VERSION 0.0.1 SOVERSION 0)
add_library(demo-cli-impl SHARED tools/impl.c)
add_executable(demo-cli tools/main.c)
target_link_libraries(demo-cli demo-cli-impl demo)
"""
# as in the real build.yaml: the tool's -impl library (llama-cli's code) is no artifact's output, yet it ships
_TOOL_BUILD_YAML = BUILD_YAML.replace("  tiny:\n", "  cpu:\n")


@pytest.fixture
def built(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import shutil

    from tests.helpers.cli import run_cli
    from tests.helpers.sync import sync_patch

    if not (shutil.which("cmake") and shutil.which("make") and shutil.which("cc")):
        pytest.skip("needs cmake, make and a C compiler")
    monkeypatch.setenv("FORKTOOL_LAUNCHER", "none")
    files = {"CMakeLists.txt": _TOOL_CMAKE, "src/a.c": "int a(void) { return 1; }\n",
             "tools/impl.c": "int a(void);\nint run(void) { return a() - 2; }\n",
             "tools/main.c": "int run(void);\nint main(void) { return run(); }\n"}
    root, _ = demo_project(tmp_path, files, _TOOL_BUILD_YAML, include="CMakeLists.txt, src, tools")
    patch = sync_patch("0001-a.patch", "a: two", [("llama.cpp/src/a.c", files["src/a.c"].encode(),
                                                     b"int a(void) { return 2; }\n")])
    (root / "patches" / "0001-a.patch").write_bytes(patch.raw)
    (root / "patches" / "series").write_text("0001-a.patch\n")
    for argv in (["vendor", "fetch"], ["apply"], ["build", "-j", "1"]):
        run_cli(root, argv)
    return root


def test_a_gate_refuses_a_build_whose_unlisted_library_was_replaced(built: Path) -> None:
    # a gate runs the build's binaries, which load libraries no artifact lists as an output (a tool's -impl library)
    from forktool.commands.gates_cmds import stale_build
    from forktool.project import Project

    assert stale_build(Project(built), "cpu") == ""
    impl = built / "build" / "cpu" / "bin" / "libdemo-cli-impl.so"
    impl.write_bytes(impl.read_bytes() + b"\0")
    assert stale_build(Project(built), "cpu") == "has bin/libdemo-cli-impl.so with other bytes than its build recorded"
    impl.unlink()
    assert "other libraries than its build recorded (bin/libdemo-cli-impl.so)" in stale_build(Project(built), "cpu")


@pytest.mark.parametrize("tamper", ["impl-replaced", "library-added", "soname-replaced", "library-removed"])
def test_package_ships_only_files_the_build_recorded(built: Path, tamper: str) -> None:
    from tests.helpers.cli import run_cli

    bins = built / "build" / "cpu" / "bin"
    _, out, _ = run_cli(built, ["package", "--out", "first", "--json"])
    import json

    assert sorted(json.loads((Path(json.loads(out)["dir"]) / "manifest.json").read_text())["files"]) == [
        "RELEASE_NOTES.md", "bin/demo-cli", "bin/libdemo-cli-impl.so", "bin/libdemo.so.0",
        f"{json.loads(out)['name']}-source.tar.gz"]
    if tamper == "impl-replaced":  # the tool's own code, in a library no artifact lists as its output
        (bins / "libdemo-cli-impl.so").write_bytes(b"\x7fELF not what make wrote")
    elif tamper == "library-added":
        (bins / "libextra.so").write_bytes(b"\x7fELF never built")
    elif tamper == "soname-replaced":  # libdemo.so (the recorded output) still leads to the built file
        (bins / "libdemo.so.0").unlink()
        (bins / "libdemo.so.0").write_bytes(b"\x7fELF loaded by demo-cli")
        (bins / "libdemo.so").unlink()
        (bins / "libdemo.so").symlink_to("libdemo.so.0.0.1")
    else:
        (bins / "libdemo-cli-impl.so").unlink()
    code, _, err = run_cli(built, ["package", "--out", "second"], expect=1)
    assert "not what `forktool build` recorded" in err and "bin/lib" in err, err
    assert not (built / "second").exists() or not any((built / "second").iterdir())
    if tamper == "library-removed":
        run_cli(built, ["build", "-j", "1"])  # the fix the error names: make writes it again
        run_cli(built, ["package", "--out", "third"])


def _tree_listing(root: Path) -> dict[str, str]:
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(d, n)
            out[p.relative_to(root).as_posix()] = (os.readlink(p) if p.is_symlink() else
                                                   p.read_bytes().hex() if p.is_file() else "dir")
    return out


@pytest.mark.parametrize("place", ["out-is-a-file", "out-is-a-dangling-link", "out-under-a-file", "dir-is-a-file",
                                   "dir-is-a-link-to-a-dir", "dir-is-a-dangling-link", "archive-is-a-dir",
                                   "archive-is-a-link"])
def test_package_refuses_odd_output_places_and_writes_nothing(built: Path, tmp_path: Path, place: str) -> None:
    from forktool.build import read_record, stamp
    from tests.helpers.cli import run_cli

    rec = read_record(built / "build" / "cpu")
    name = f"llama.cpp-{rec['stamp']}-cpu"
    assert rec["stamp"] == stamp("", [(a["id"], a["name"], a["sha256"]) for a in rec["applied"]], False)[0]
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("mine\n")
    if place == "out-is-a-file":
        out.write_text("x\n")
    elif place == "out-is-a-dangling-link":
        out.symlink_to(tmp_path / "nothing")
    elif place == "out-under-a-file":
        out.write_text("x\n")
        out = out / "sub"
    else:
        out.mkdir()
        target = {"dir-is-a-file": out / name, "dir-is-a-link-to-a-dir": out / name,
                  "dir-is-a-dangling-link": out / name, "archive-is-a-dir": out / f"{name}.tar.gz",
                  "archive-is-a-link": out / f"{name}.tar.gz"}[place]
        if place == "dir-is-a-file":
            target.write_text("x\n")
        elif place == "dir-is-a-link-to-a-dir":
            target.symlink_to(elsewhere)
        elif place == "archive-is-a-dir":
            target.mkdir()
        else:
            target.symlink_to(tmp_path / "nothing")
    def listing() -> dict[str, str]:  # forktool's own stat index may be refreshed by any command: left out
        return {k: v for k, v in _tree_listing(tmp_path).items() if not k.startswith("proj/.opencoti/")}

    before = listing()
    code, _, err = run_cli(built, ["package", "--out", str(out)], expect=1)
    assert "Traceback" not in err and "internal error" not in err and "next:" in err, err
    assert listing() == before  # nothing written, the linked directory's content kept


def test_a_kill_while_replacing_a_release_never_leaves_half_of_it(built: Path, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.helpers.cli import run_cli

    out = tmp_path / "out"
    _, first, _ = run_cli(built, ["package", "--out", str(out), "--json"])
    release = Path(json.loads(first)["dir"])
    env = dict(os.environ, FORKTOOL_ROOT=str(built), FORKTOOL_FAULT="package-replacing")
    r = subprocess.run([sys.executable, "-m", "forktool", "package", "--out", str(out)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 137, r.stderr
    # the older copy moved aside whole: nothing half-removed under the release's name
    assert not os.path.lexists(release)
    [work] = [p for p in out.iterdir() if p.name.startswith(".")]
    assert pk.verify_release(work / "replaced")["ok"]
    # the next run removes the work directory the kill left and writes the release again
    run_cli(built, ["package", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == [release.name, f"{release.name}.tar.gz"]
    assert pk.verify_release(release)["ok"] and pk.verify_release(out / f"{release.name}.tar.gz")["ok"]


@pytest.mark.parametrize("form", ["directory", "archive"])
@pytest.mark.parametrize("extra", ["symlink-to-a-directory", "empty-directory"])
def test_verify_catches_an_added_link_to_a_directory_or_an_empty_directory(release: Path, tmp_path: Path, form: str,
                                                                         extra: str) -> None:
    # os.walk lists a symlink to a directory among the directories and never enters it: it was taken for a
    # directory and left out of the comparison, so the release verified with an entry SHA256SUMS does not list
    if extra == "symlink-to-a-directory":
        (release / "bin" / "plugins").symlink_to("." if form == "archive" else str(tmp_path))
    else:
        (release / "share" / "empty").mkdir(parents=True)
    target = release
    if form == "archive":
        target = tmp_path / "re" / f"{release.name}.tar.gz"
        target.parent.mkdir()
        pk.write_targz(release, release.name, target, 0)
    with pytest.raises(VerifyError) as e:
        pk.verify_release(target)
    want = "bin/plugins: present but not listed in SHA256SUMS" if extra == "symlink-to-a-directory" else \
        "share/: a directory that holds no file listed in SHA256SUMS"
    assert want in e.value.details, e.value.details


def test_package_refuses_a_build_of_another_upstream_under_the_same_patches(built: Path) -> None:
    # a sync whose patches keep their bytes (upstream changed only files they do not touch): the build record's
    # patch list still matches, but its binaries are of the upstream before the move
    from tests.helpers.cli import run_cli
    from tests.helpers.project import git

    up = built.parent / "upstream"
    (up / "tools" / "impl.c").write_text("int a(void);\nint run(void) { return a() - 3; }\n")
    git(up, "commit", "-qam", "upstream changes a file no patch touches")
    patch_before = (built / "patches" / "0001-a.patch").read_bytes()
    run_cli(built, ["sync", "--to", git(up, "rev-parse", "HEAD"), "--start"])
    assert (built / "patches" / "0001-a.patch").read_bytes() == patch_before
    code, _, err = run_cli(built, ["package", "--out", "rel"], expect=1)
    assert "the last build is not of the upstream the tree is made from" in err, err
    assert not (built / "rel").exists()
    run_cli(built, ["build", "-j", "1"])
    run_cli(built, ["package", "--out", "rel"])
