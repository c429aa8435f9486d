"""The bad-input corpus as tests: every generated case is a clean refusal; concurrency; disk full on a tmpfs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests import corpus
from tests.helpers.cli import run_cli
from tests.helpers.project import UPSTREAM, make_project

FAMILIES = ["vendor.yaml", "registry", "build.yaml", "vendor.lock", "state.json", "journal", "backup", "patches",
            "series", "tree", "opencoti", "sdist", "cli", "sync-state", "signals", "output", "caches", "sync-safety"]
CLEAN = ("refusal", "usage", "interrupted", "contract", "kept")  # interrupted, contract: the exit-code contract
# kept; kept: exit 0 with what a sync needs intact
SAMPLE = 8  # the default suite runs every 8th case of each family; `-m slow` runs them all


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    b = tmp_path_factory.mktemp("corpus")
    old = os.environ.get("FORKTOOL_CACHE")
    corpus._TEMPLATE = None
    corpus.template(b / "template")
    yield b
    corpus._TEMPLATE = None
    if old is None:
        os.environ.pop("FORKTOOL_CACHE", None)
    else:
        os.environ["FORKTOOL_CACHE"] = old


def _run_family(base: Path, family: str, every: int) -> None:
    cases = [c for c in corpus.all_cases() if c.family == family]
    bad = []
    for n, case in enumerate(cases):
        if n % every:
            continue
        o = corpus.run_case(case, base, n)  # a case that never returns is stopped and counted as a hang
        if o.kind not in CLEAN:
            bad.append(f"{o.kind}: {case.id}: {o.detail}")
    assert not bad, f"{len(bad)} case(s) of {family} were not clean refusals:\n" + "\n".join(bad[:40])


@pytest.mark.parametrize("family", FAMILIES)
def test_corpus_sample(base: Path, family: str) -> None:
    _run_family(base, family, SAMPLE)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_corpus_full(base: Path, family: str) -> None:
    _run_family(base, family, 1)


def test_corpus_is_large_and_covers_every_family(base: Path) -> None:
    counts = Counter(c.family for c in corpus.all_cases())
    assert sum(counts.values()) >= 600
    assert set(counts) == set(FAMILIES) and min(counts.values()) >= 20


# ---------------------------------------------------------------- concurrency


def test_twenty_concurrent_apply_unapply_pairs(tmp_path: Path, cache: Path) -> None:
    proj = make_project(tmp_path, UPSTREAM)
    for name, text in corpus.SERIES.items():
        proj.write_patch(name, text)
    env = dict(os.environ, FORKTOOL_ROOT=str(proj.root))
    outcomes: Counter[str] = Counter()
    for i in range(20):
        first, second = (["apply"], ["unapply"]) if i % 2 == 0 else (["unapply"], ["apply"])
        procs = [subprocess.Popen([sys.executable, "-m", "forktool", *argv], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for argv in (first, second)]
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode in (0, 1), err
            assert "Traceback" not in err
            if p.returncode == 1:
                assert "another forktool command is running" in err
                outcomes["refused"] += 1
            else:
                outcomes["ran"] += 1
        v = subprocess.run([sys.executable, "-m", "forktool", "verify"], env=env, capture_output=True, text=True)
        assert v.returncode == 0, v.stderr
    assert outcomes["ran"] >= 20
    print(f"20 pairs: {dict(outcomes)}")


# ---------------------------------------------------------------- disk full


def _mount_tmpfs(where: Path, size: str) -> str | None:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                       text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def test_disk_full_at_many_fill_levels(tmp_path: Path, cache: Path) -> None:
    mnt = tmp_path / "small"
    why = _mount_tmpfs(mnt, "4m")
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs here: {why}")
    try:
        proj = make_project(mnt, UPSTREAM)
        for name, text in corpus.SERIES.items():
            proj.write_patch(name, text)
        pristine = proj.digest()
        env = dict(os.environ, FORKTOOL_ROOT=str(proj.root))
        results: Counter[str] = Counter()
        st = os.statvfs(mnt)
        free = st.f_bavail * st.f_frsize
        filler = mnt / "filler"
        for leave in [0, 1024, 4096, 8192, 12288, 16384, 24576, 32768, 49152, 65536, 98304, 131072]:
            filler.unlink(missing_ok=True)
            subprocess.run(["sync"])
            st = os.statvfs(mnt)
            free = st.f_bavail * st.f_frsize
            with open(filler, "wb") as f:
                f.write(b"\0" * max(0, free - leave))
            r = subprocess.run([sys.executable, "-m", "forktool", "apply"], env=env, capture_output=True, text=True)
            assert "Traceback" not in r.stderr, r.stderr
            assert r.returncode in (0, 1), r.stderr
            filler.unlink()
            if r.returncode == 1:
                assert "no space" in r.stderr.lower(), r.stderr
                results["refused"] += 1
                # nothing half-written: after space returns, the tree is either untouched or finishes cleanly
                assert run_cli(proj.root, ["status"], expect=None)[0] == 0
            else:
                results["applied"] += 1
            run_cli(proj.root, ["verify"] if r.returncode == 0 else ["status"])
            run_cli(proj.root, ["unapply"])
            assert proj.digest() == pristine
        assert results["refused"] >= 1
        print(f"disk full: {dict(results)}")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        shutil.rmtree(mnt, ignore_errors=True)


def test_corpus_counts_are_printable(tmp_path: Path) -> None:
    """`python -m tests.corpus --family cli` prints the table the manual quotes (docs/manual.md)."""
    env = dict(os.environ, PYTHONPATH=str(corpus.REPO))
    r = subprocess.run([sys.executable, "-m", "tests.corpus", "--family", "cli", "--json", str(tmp_path / "o.json")],
                       cwd=corpus.REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "| cli |" in r.stdout
    rows = [json.loads(line) for line in (tmp_path / "o.json").read_text().splitlines()]
    assert rows and all(r["outcome"] in ("refusal", "usage") for r in rows), [r for r in rows if r["outcome"]
                                                                                not in ("refusal", "usage")]


# ---------------------------------------------------------------- a crash after the plan was committed


def test_new_file_under_a_file_is_refused_before_commit_and_nothing_blocks(tmp_path: Path, cache: Path) -> None:
    proj = make_project(tmp_path, UPSTREAM)
    for name, text in corpus.SERIES.items():
        proj.write_patch(name, text)
    proj.run("apply")
    extra = corpus.make_patch("x.patch", {"up/src/a.c/x.c": (None, "int x;\n")}).split("\n---\n", 1)[1]
    p = proj.root / "patches" / "0089-three.patch"
    p.write_bytes(p.read_bytes() + extra.encode())
    before = proj.digest()
    code, out, err = proj.run("apply", expect=1)
    assert "up/src/a.c" in err and "nothing was changed" in err
    assert proj.digest() == before and not (proj.root / ".opencoti" / "txn").exists()
    proj.run("status")
    proj.run("unapply", "--force")


def test_a_journal_that_cannot_finish_says_what_to_do(tmp_path: Path, cache: Path) -> None:
    proj = make_project(tmp_path, UPSTREAM)
    for name, text in corpus.SERIES.items():
        proj.write_patch(name, text)
    r = proj.sub("apply", env={"FORKTOOL_FAULT": "committed"})
    assert r.returncode == 137
    # something replaces a directory the plan writes into: rolling forward cannot finish
    src = proj.tree / "up" / "src"
    shutil.move(src, tmp_path / "src-moved")
    src.write_text("not a directory\n")
    for argv in (["status"], ["unapply", "--force"], ["backup", "list"]):
        code, out, err = proj.run(*argv, expect=None)
        assert code in (0, 1) and "Traceback" not in err, err
        if code == 1:
            assert "journal" in err or "could not finish" in err
            assert "forktool recover --discard" in err and "rm -rf" not in err  # how to discard it
    # following the advice: put the directory back, discard the journal, and the project moves again
    src.unlink()
    shutil.move(tmp_path / "src-moved", src)
    proj.run("recover", "--discard", expect=None)
    assert not (proj.root / ".opencoti" / "txn").exists()
    proj.run("unapply", "--force")
    proj.run("apply")
    proj.run("verify")
