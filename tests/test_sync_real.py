"""forktool sync from the pinned 0.3.36 to real older sdists, each patch's status checked against git apply."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from forktool import sync as fsync
from forktool import vendor
from forktool.apply import apply_file
from forktool.project import Project
from forktool.series import Patch, diff_file, split_lines
from tests.helpers.sync import sync_patch, write_project

MAIN = Path(__file__).parents[1]
VERSIONS = ["llama-cpp-python==0.3.35", "llama-cpp-python==0.3.34"]
# files the fork's real series touches, used for the realistic patches below
EDITS = [
    ("0001-cparams-kv-residency", "llama.cpp/src/llama-cparams.h", r"^struct llama_cparams \{",
     "    int32_t kv_residency_mode = 0; // opencoti-hook: kv-residency-cparams"),
    ("0002-kv-cache-window-sizer", "llama.cpp/src/llama-kv-cache.cpp", r"^llama_kv_cache::llama_kv_cache\(",
     "    // opencoti-hook: kv-window-sizer"),
    ("0003-context-two-pass-reserve", "llama.cpp/src/llama-context.cpp", r"graph_reserve\(",
     "    // opencoti-hook: two-pass-reserve"),
    ("0004-common-arg-vram-target", "llama.cpp/common/arg.cpp", r"add_opt\(common_arg\(",
     "    // opencoti-hook: vram-target-arg"),
    ("0005-kv-cache-host-tail", "llama.cpp/src/llama-kv-cache.cpp", r"^void llama_kv_cache::clear\(",
     "    // opencoti-hook: kv-host-tail"),
    ("0006-cuda-stream-tail", "llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu", r"^static void ggml_cuda_mul_mat\(",
     "    // opencoti-hook: cuda-tail"),
    ("0007-server-log-window", "llama.cpp/tools/server/main.cpp", r"^int main\(",
     "    // opencoti-hook: server-window-log"),
]


def insert_after(text: bytes, pattern: str, line: str) -> bytes:
    lines = split_lines(text)
    at = next(i for i, ln in enumerate(lines) if re.search(pattern.encode(), ln))
    return b"".join(lines[:at + 1] + [line.encode() + b"\n"] + lines[at + 1:])


def first_hunk_between(a: bytes, b: bytes, rel: str):
    fd = diff_file(rel, a, b)
    return None if fd is None else fd.hunks[0]


def realistic_series(read_old, read_other) -> list[Patch]:
    """Seven marker patches on real files, plus three built from real drift: a patch on a line the other
    upstream changed (conflict), one after it on the same file (blocked), and a backport of the other
    upstream's own change (upstreamed there)."""
    state: dict[str, bytes | None] = {}

    def cur(rel):
        return state[rel] if rel in state else read_old(rel)

    patches = []
    for slug, rel, pattern, line in EDITS:
        before = cur(rel)
        state[rel] = insert_after(before, pattern, line)
        patches.append(sync_patch(f"{slug}.patch", slug, [(rel, before, state[rel])]))
    n = len(patches)
    drifted = [rel for rel in ("llama.cpp/src/llama-graph.cpp", "llama.cpp/src/llama-model.cpp",
                               "llama.cpp/src/llama-vocab.cpp", "llama.cpp/common/common.cpp")
               if read_old(rel) != read_other(rel) and read_other(rel) is not None]
    assert len(drifted) >= 2, "expected real drift between the versions"
    # conflict: rewrite the first line of upstream's first change
    rel = drifted[0]
    before = cur(rel)
    h = first_hunk_between(read_other(rel), before, rel)
    changed = next(t for op, t in h.lines if op == b"+" and t.strip())
    after = before.replace(changed, changed.rstrip(b"\n") + b" // opencoti-hook: conflict\n", 1)
    state[rel] = after
    patches.append(sync_patch(f"{n + 1:04d}-touch-changed-line.patch", "touch a changed line", [(rel, before, after)]))
    # blocked: the same file again, far away
    before = cur(rel)
    after = before + b"// opencoti-hook: tail\n"
    state[rel] = after
    patches.append(sync_patch(f"{n + 2:04d}-same-file-again.patch", "same file again", [(rel, before, after)]))
    # upstreamed: backport the other upstream's first change to a file
    rel = drifted[1]
    before = cur(rel)
    h = first_hunk_between(before, read_other(rel), rel)
    one = diff_file(rel, before, read_other(rel))
    one.hunks = [h]
    after, _ = apply_file(patches[0], one, before)
    state[rel] = after
    patches.append(sync_patch(f"{n + 3:04d}-backport.patch", "backport", [(rel, before, after)]))
    return patches


def git(cwd: Path, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.invalid")
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, input=input, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {r.stderr.decode()}")
    return r


def git_statuses(tmp: Path, patches: list[Patch], ours: dict[str, str], read_old, read_new, final) -> dict[str, str]:
    """What git apply says for each patch, applied cumulatively on the other upstream (blocked ones skipped);
    the resulting bytes must equal forktool's."""
    repo = tmp / "git"
    repo.mkdir()
    git(repo, "init", "-q")
    paths = sorted({f for p in patches for f in p.paths})
    for rel in paths:
        data = read_new(rel)
        if data is not None:
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_bytes(data)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "other upstream")
    # --3way needs the pre-image blobs named by the index lines: the pinned side of the series
    old: dict[str, bytes | None] = {}
    for p in patches:
        for fd in p.files:
            pre = old[fd.path] if fd.path in old else read_old(fd.path)
            if pre is not None:
                git(repo, "hash-object", "-w", "--stdin", input=pre)
            old[fd.path], _ = apply_file(p, fd, pre)
    out = {}
    for p in patches:
        if ours[p.id] == "blocked":
            continue
        path = tmp / p.name
        path.write_bytes(p.raw)
        if git(repo, "apply", "--check", str(path), check=False).returncode == 0:
            git(repo, "apply", str(path))
            out[p.id] = "applies"
        elif git(repo, "apply", "--check", "-R", str(path), check=False).returncode == 0:
            out[p.id] = "reverse-applies"
            continue
        elif git(repo, "apply", "--3way", str(path), check=False).returncode == 0:
            out[p.id] = "3way-clean"
        else:
            out[p.id] = "3way-conflict"
            git(repo, "reset", "-q", "--hard")
            git(repo, "clean", "-qfd")
            continue
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", p.name)
    for rel in paths:
        disk = (repo / rel).read_bytes() if (repo / rel).exists() else None
        want = final[rel] if rel in final else read_new(rel)
        assert disk == want, f"{rel}: git's result differs from forktool's"
    return out


EXPECTED = {"applies": {"clean", "offset"}, "reverse-applies": {"upstreamed"}, "3way-clean": {"merged"},
            "3way-conflict": {"conflict"}}


@pytest.mark.slow
@pytest.mark.parametrize("spec", VERSIONS)
def test_real_versions_agree_with_git_apply(spec, tmp_path, session_cache, monkeypatch):
    monkeypatch.setenv("FORKTOOL_CACHE", str(session_cache))
    root = tmp_path / "proj"
    (root / "vendor").mkdir(parents=True)
    shutil.copy(MAIN / "vendor" / "vendor.yaml", root / "vendor" / "vendor.yaml")
    project = write_project(root, (MAIN / "vendor" / "vendor.yaml").read_text(), [])
    pinned = fsync.pinned_manifest(project)
    old, new = fsync.resolve_spec(project, spec)
    target = fsync.fetch_target(project, old, new, pinned)
    store = vendor.objects(project)

    def reader(m):
        return lambda rel: store.get(m[rel].sha256) if rel in m else None

    read_old, read_new = reader(pinned), reader(target.manifest)
    patches = realistic_series(read_old, read_new)
    project = write_project(root, (MAIN / "vendor" / "vendor.yaml").read_text(), patches)
    t0 = time.monotonic()
    res = fsync.sync(Project(root), spec, build=False, out=tmp_path / "out")
    seconds = time.monotonic() - t0
    ours = {r.patch.id: r.status for r in res.results}
    final = fsync._final_state(res.results, read_new)
    theirs = git_statuses(tmp_path, patches, ours, read_old, read_new, final)
    for pid, verdict in theirs.items():
        assert ours[pid] in EXPECTED[verdict], (pid, ours[pid], verdict)
    blocked = [r for r in res.results if r.status == "blocked"]
    assert all(r.blocked_by for r in blocked)
    print(f"\n{spec}: {res.counts} in {seconds:.2f} s (timings {res.timings}); git apply: {theirs}")
    assert res.counts["clean"] + res.counts["offset"] >= 5


@pytest.mark.slow
def test_upstream_commit_is_read_from_the_sdist(session_cache, monkeypatch):
    monkeypatch.setenv("FORKTOOL_CACHE", str(session_cache))
    project = Project(MAIN)
    pin = project.vendor.components[0]
    data = vendor.download_sdist(project, pin).read_bytes()
    assert fsync._sdist_upstream_commit(project, data, pin) == pin.upstream_commit


@pytest.mark.slow
def test_a_local_copy_of_the_pinned_sdist_gives_the_pinned_tree(monkeypatch, tmp_path):
    """The pinned sdist named as a local tarball: its tree is found under <top>/vendor/llama.cpp by the pinned
    tree's top-level names, its commit read from the .git it carries, and its files are the pinned ones."""
    if not os.environ.get("FORKTOOL_CACHE"):
        monkeypatch.setenv("FORKTOOL_CACHE", str(Path.home() / ".cache" / "forktool"))
    project = Project(MAIN)
    pin = project.vendor.components[0]
    local = tmp_path / f"llama_cpp_python-{pin.version}.tar.gz"
    shutil.copyfile(vendor.download_sdist(project, pin), local)
    old, new = fsync.resolve_spec(project, str(local))
    assert (new.kind, new.sha256, new.upstream_commit) == ("tarball", pin.sha256, "")
    pinned = fsync.pinned_manifest(project)
    target = fsync.fetch_target(project, old, new, pinned)
    assert target.new.subdir == f"llama_cpp_python-{pin.version}/vendor/llama.cpp"
    assert target.new.upstream_commit == pin.upstream_commit
    assert target.manifest == pinned
