"""vendor fetch: sha256 pin, safe filtered extraction, pristine cache, lock."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.patches import make_patch
from tests.helpers.project import UPSTREAM, Proj, bare_project, git
from tests.helpers.pypi import sdist_pin


def _tar(members: list[tuple[str, str, bytes | str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(data, bytes)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                t.addfile(info)
            elif kind == "lnk":
                info.type, info.linkname = tarfile.LNKTYPE, str(data)
                t.addfile(info)
            elif kind == "dev":
                info.type = tarfile.CHRTYPE
                t.addfile(info)
    return buf.getvalue()


GOOD = [("file", "pkg-1.0/vendor/up/src/a.c", b"int a;\n"), ("file", "pkg-1.0/vendor/up/README.md", b"x\n"),
        ("file", "pkg-1.0/vendor/up/models/big.bin", b"\0" * 10), ("file", "pkg-1.0/setup.py", b"")]


def sdist_project(tmp_path: Path, archive: bytes, pin: str | None = None) -> tuple[Path, Path]:
    sd = tmp_path / "pkg-1.0.tar.gz"
    sd.write_bytes(archive)
    sha = pin or hashlib.sha256(archive).hexdigest()
    root = bare_project(tmp_path / "proj", sdist_pin(sha, include="[src, '*.c']", exclude="['*.md']"))
    return root, sd


def _everything(root: Path, cache: Path) -> dict[str, bytes]:
    out = {}
    for base in (root, cache):
        for p in sorted(base.rglob("*")):
            if p.is_file():
                out[str(p)] = p.read_bytes()
    return out


def test_fetch_filters_and_locks(tmp_path: Path, cache: Path):
    root, sd = sdist_project(tmp_path, _tar(GOOD))
    code, out, err = run_cli(root, ["vendor", "fetch", "--sdist", str(sd), "--json"])
    res = json.loads(out)
    assert res["files"] == 1 and res["materialised"]
    assert (root / "vendor/llamafile/up/src/a.c").read_bytes() == b"int a;\n"
    assert not (root / "vendor/llamafile/up/README.md").exists()
    lock = json.loads((root / "vendor/vendor.lock").read_text())
    assert lock["pristine_files"] == 1 and len(lock["pristine_digest"]) == 64
    # second fetch: from the cache, nothing rewritten
    before = _everything(root, cache)
    code, out, err = run_cli(root, ["vendor", "fetch", "--json"])
    assert json.loads(out)["from_cache"] is True
    assert _everything(root, cache) == before
    run_cli(root, ["vendor", "status"])


def test_sha_mismatch_refused_nothing_written(tmp_path: Path, cache: Path):
    root, sd = sdist_project(tmp_path, _tar(GOOD), pin="0" * 64)
    before = _everything(root, cache)
    code, out, err = run_cli(root, ["vendor", "fetch", "--sdist", str(sd)], expect=1)
    assert "sha256 mismatch" in err and "nothing was written" in err
    assert _everything(root, cache) == before
    assert not (root / "vendor/llamafile").exists()


@pytest.mark.parametrize("bad, message", [
    (("file", "pkg-1.0/vendor/up/../../../evil.c", b"x"), "'..'"),
    (("file", "/etc/evil.c", b"x"), "absolute"),
    (("sym", "pkg-1.0/vendor/up/src/link.c", "../../../../etc/passwd"), "leaves the root"),
    (("sym", "pkg-1.0/vendor/up/src/abs.c", "/etc/passwd"), "leaves the root"),
    (("dev", "pkg-1.0/vendor/up/src/dev.c", b""), "device"),
])
def test_unsafe_archives_are_refused(tmp_path: Path, cache: Path, bad, message):
    root, sd = sdist_project(tmp_path, _tar(GOOD + [bad]))
    code, out, err = run_cli(root, ["vendor", "fetch", "--sdist", str(sd)], expect=1)
    assert message in err and "unsafe" in err
    assert not (root / "vendor/llamafile").exists()
    assert not (root / "vendor/vendor.lock").exists()
    assert not (tmp_path / "evil.c").exists()


def test_internal_symlink_is_kept(tmp_path: Path, cache: Path):
    root, sd = sdist_project(tmp_path, _tar(GOOD + [("sym", "pkg-1.0/vendor/up/src/b.c", "a.c")]))
    run_cli(root, ["vendor", "fetch", "--sdist", str(sd)])
    link = root / "vendor/llamafile/up/src/b.c"
    assert link.is_symlink() and link.read_bytes() == b"int a;\n"


def test_unknown_key_in_vendor_yaml(tmp_path: Path, cache: Path):
    root, sd = sdist_project(tmp_path, _tar(GOOD))
    y = root / "vendor/vendor.yaml"
    y.write_text(y.read_text() + "    colour: blue\n")
    code, out, err = run_cli(root, ["vendor", "fetch", "--sdist", str(sd)], expect=1)
    assert "colour" in err and "vendor.yaml" in err


def test_not_a_project(tmp_path: Path):
    code, out, err = run_cli(tmp_path, ["status"], expect=2)
    assert "not inside a forktool project" in err


def test_a_link_planted_beside_the_sdist_entry_is_not_written_through(tmp_path: Path, cache: Path):
    # a cache another user can write: a link at the name the copy was written to took the sdist's bytes into the
    # file it points at (here a file of the user's own), and was then renamed into the cache as the entry
    root, sd = sdist_project(tmp_path, _tar(GOOD))
    sha = hashlib.sha256(sd.read_bytes()).hexdigest()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    (cache / "sdist").mkdir(parents=True)
    (cache / "sdist" / f"{sha}.tar.part").symlink_to(victim)
    run_cli(root, ["vendor", "fetch", "--sdist", str(sd)])
    assert victim.read_text() == "the user's own file\n"
    entry = cache / "sdist" / f"{sha}.tar.gz"
    assert not entry.is_symlink() and entry.read_bytes() == sd.read_bytes()


def test_a_directory_where_the_sdist_entry_belongs_is_a_refusal_naming_it(tmp_path: Path, cache: Path):
    root, sd = sdist_project(tmp_path, _tar(GOOD))
    sha = hashlib.sha256(sd.read_bytes()).hexdigest()
    entry = cache / "sdist" / f"{sha}.tar.gz"
    entry.mkdir(parents=True)
    code, out, err = run_cli(root, ["vendor", "fetch", "--sdist", str(sd)], expect=1)
    assert f"{entry}: a directory where a file belongs" in err and "next: remove it" in err
    assert "internal error" not in err and "Traceback" not in err
    assert not (root / "vendor/llamafile").exists() and not (root / "vendor/vendor.lock").exists()


def test_the_sdist_bytes_extracted_are_the_bytes_hashed(tmp_path: Path, cache: Path, monkeypatch):
    # the cached entry was hashed, then read again by name: bytes swapped in between were extracted unchecked
    from forktool import tree, vendor

    root, sd = sdist_project(tmp_path, _tar(GOOD))
    run_cli(root, ["vendor", "fetch", "--sdist", str(sd)])
    sha = hashlib.sha256(sd.read_bytes()).hexdigest()
    entry = cache / "sdist" / f"{sha}.tar.gz"
    other = _tar([("file", "pkg-1.0/vendor/up/src/a.c", b"int planted;\n")])
    real_sha256_file = tree.sha256_file

    def hash_then_swap(path: Path) -> str:
        got = real_sha256_file(path)
        if Path(path) == entry:
            entry.write_bytes(other)
        return got

    monkeypatch.setattr(vendor, "sha256_file", hash_then_swap)
    code, out, err = run_cli(root, ["vendor", "fetch", "--no-cache", "--json"], expect=None)
    assert code == 0, err  # the pinned bytes, as hashed, extract to the lock's pristine


def test_a_large_entry_of_other_bytes_is_never_held_in_memory(tmp_path: Path, cache: Path):
    # hashed as a stream: a planted sparse 2 GiB file under the sdist's name is refused within a 1 GiB address space
    import os
    import resource
    import subprocess
    import sys

    root, sd = sdist_project(tmp_path, _tar(GOOD))
    sha = hashlib.sha256(sd.read_bytes()).hexdigest()
    entry = cache / "sdist" / f"{sha}.tar.gz"
    entry.parent.mkdir(parents=True)
    with entry.open("wb") as f:
        f.truncate(2 << 30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = dict(os.environ, FORKTOOL_ROOT=str(root), FORKTOOL_CACHE=str(cache))
    r = subprocess.run([sys.executable, "-m", "forktool", "vendor", "fetch", "--sdist", str(sd)], env=env,
                       capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert r.returncode == 0, r.stderr
    assert entry.read_bytes() == sd.read_bytes()  # replaced by the pinned bytes


def test_a_cached_sdist_swapped_for_a_fifo_is_not_cached_and_never_waited_on(tmp_path: Path, cache: Path, monkeypatch):
    # sync's "(cached)" looked (is_file) and then hashed by name: a FIFO swapped in between blocked the open forever
    import os
    import signal

    from forktool.project import Project
    from forktool.sync.fetch import _fetch_sdist
    from tests.helpers.pypi import local_sdist

    sha = local_sdist(tmp_path / "links", "1.0", b"int a;\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "links"))
    root = bare_project(tmp_path / "proj", sdist_pin(sha))
    comp = Project(root).vendor.components[0]
    entry = cache / "sdist" / f"{sha}.tar.gz"
    entry.parent.mkdir(parents=True)
    os.mkfifo(entry)
    real_is_file = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda self: True if self == entry else real_is_file(self))  # the race, won

    def stuck(_sig, _frame):
        raise AssertionError("blocked")
    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    try:
        _, path, cached = _fetch_sdist(Project(root), comp, lambda _m: None)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert not cached and hashlib.sha256(path.read_bytes()).hexdigest() == sha  # fetched again over the FIFO


def test_after_an_accepted_pin_move_fetch_then_apply_records_the_new_tree_digest(proj: Proj):
    # a move whose patches keep their bytes (upstream changed a file no patch touches): the lock's patched digest
    # was of the old pristine, and docs/sync.md's way onto the new pin must end with verify OK
    a = UPSTREAM["src/a.c"]
    proj.write_patch("0001-a.patch", make_patch("0001-a.patch", {"up/src/a.c": (a, a.replace("return 1;", "return 7;"))}))
    proj.run("apply")
    (proj.upstream / "src" / "b.c").write_text(UPSTREAM["src/b.c"] + "line 31\n")
    git(proj.upstream, "commit", "-qam", "b grows")
    proj.run("sync", "--to", git(proj.upstream, "rev-parse", "HEAD"), "--accept", "--out", str(proj.root / "dist"))
    proj.run("unapply")
    shutil.rmtree(proj.tree)
    proj.run("vendor", "fetch")
    proj.run("apply")
    proj.run("verify")
