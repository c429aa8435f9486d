"""The trial: apply the series on the pinned and on another upstream, classify each patch on the new one."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from forktool import git as fgit
from forktool import series
from forktool.apply import apply_file, apply_series, reverse
from forktool.errors import ApplyError
from forktool.series import FileDiff, Patch
from forktool.tree import REGULAR

STATUSES = ("clean", "offset", "merged", "conflict", "upstreamed", "blocked")
# offset is drift the refreshed patch absorbs; everything past it needs a maintainer's eye
NEEDS_HUMAN = ("merged", "conflict", "upstreamed", "blocked")
LABELS = ("patch (on the pinned upstream)", "pinned upstream", "new upstream")


@dataclass
class FileResult:
    path: str
    status: str  # clean, offset, merged, conflict, upstreamed
    hunks: list[dict[str, object]] = field(default_factory=list)  # {hunk, how: exact|offset|changed, offset}
    conflicts: list[dict] = field(default_factory=list)  # {line, text}
    reason: str = ""

    def to_json(self) -> dict:
        return {"file": self.path, "status": self.status, "hunks": self.hunks, "conflicts": self.conflicts,
                "reason": self.reason}


@dataclass
class PatchResult:
    patch: Patch
    status: str
    files: list[FileResult] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)
    drift: list[dict] = field(default_factory=list)
    refreshed: Patch | None = None
    note: str = ""
    api: list[dict] = field(default_factory=list)  # upstream declarations it uses that changed (apidrift)
    # a blocked patch tried anyway, with each earlier conflict taken on the conflicting patch's own side
    ahead: dict | None = None

    @property
    def changed(self) -> bool:
        return self.refreshed is not None and self.refreshed.raw != self.patch.raw

    def to_json(self) -> dict:
        return {"id": self.patch.id, "name": self.patch.name, "title": self.patch.title, "status": self.status,
                "files": [f.to_json() for f in self.files], "blocked_by": self.blocked_by, "drift": self.drift,
                "refreshed": self.refreshed is not None, "changed": self.changed,
                "refreshed_sha256": self.refreshed.sha256 if self.refreshed else None, "note": self.note,
                "api": self.api, "ahead": self.ahead}


Reader = Callable[[str], bytes | None]


def _hunk_places(patch: Patch, fd: FileDiff, theirs: bytes | None) -> list[dict]:
    """Where each hunk's pre-image stands in the new text: exact, at an offset, or changed upstream."""
    out: list[dict[str, object]] = []
    for n, h in enumerate(fd.hunks, 1):
        one = FileDiff(fd.path, fd.old_mode, fd.new_mode, fd.old_index, fd.new_index, [h])
        if theirs is None:  # the file is gone upstream
            out.append({"hunk": n, "how": "changed", "offset": None})
            continue
        try:
            _, drift = apply_file(patch, one, theirs)
            off = drift[0].offset if drift else 0
            out.append({"hunk": n, "how": "offset" if off else "exact", "offset": off})
        except ApplyError:
            out.append({"hunk": n, "how": "changed", "offset": None})
    return out


def _reverse_applies(patch: Patch, fd: FileDiff, cur: bytes | None) -> bool:
    """True when the new upstream already holds this file's post-image (the change was upstreamed)."""
    if fd.is_new:
        return cur is not None and cur == b"".join(t for h in fd.hunks for t in h.new_lines())
    if fd.is_deleted:
        return cur is None
    if cur is None:
        return False
    rfd = FileDiff(fd.path, fd.new_mode, fd.old_mode, fd.new_index, fd.old_index, [reverse(h) for h in fd.hunks])
    try:
        apply_file(patch, rfd, cur)
    except ApplyError:
        return False
    return True


def _conflict_blocks(merged: bytes) -> list[dict]:
    """Each `<<<<<<< … >>>>>>>` block of a merge-file result, with its first line number."""
    blocks: list[dict] = []
    cur: list[str] | None = None
    start = 0
    for n, line in enumerate(merged.decode("utf-8", "replace").split("\n"), 1):
        if line.startswith("<<<<<<< "):
            cur, start = [], n
        if cur is not None:
            cur.append(line)
            if line.startswith(">>>>>>> "):
                blocks.append({"line": start, "text": "\n".join(cur)})
                cur = None
    return blocks


def own_side(merged: bytes) -> bytes:
    """A diff3 merge result with every conflict block replaced by its first side (the patch's): a stand-in for
    the resolution, so the patches after a conflict can still be tried."""
    out: list[bytes] = []
    part = None
    for line in merged.splitlines(keepends=True):
        if line.startswith(b"<<<<<<< "):
            part = "ours"
        elif part == "ours" and line.startswith(b"||||||| "):
            part = "base"
        elif part in ("ours", "base") and line.rstrip(b"\r\n") == b"=======":
            part = "theirs"
        elif part == "theirs" and line.startswith(b">>>>>>> "):
            part = None
        elif part in (None, "ours"):
            out.append(line)
    return b"".join(out)


def _patch_status(files: list[FileResult]) -> str:
    st = [f.status for f in files]
    if "conflict" in st:
        return "conflict"
    if st and all(s == "upstreamed" for s in st):
        return "upstreamed"
    if "merged" in st or "upstreamed" in st:
        return "merged"
    return "offset" if "offset" in st else "clean"


@dataclass
class Classified:
    """One patch tried on the new upstream: per-file results, the contents that went in, conflict texts."""

    files: list[FileResult]
    after: dict[str, bytes | None]  # files whose new content is known (clean, offset, merged, upstreamed)
    conflicted: dict[str, bytes]  # conflicting files: the 3-way result with diff3 conflict blocks
    drift: list[dict]

    @property
    def status(self) -> str:
        return _patch_status(self.files)


class OldSide:
    """The series applied cumulatively on the pinned upstream: each patch's pre- and post-images there."""

    def __init__(self, read: Reader):
        self.read = read
        self.state: dict[str, bytes | None] = {}

    def step(self, p: Patch) -> tuple[dict[str, bytes | None], dict[str, bytes | None], str]:
        """(pre-images, post-images, error); a patch that fails here leaves the state as it was."""
        pre = {fd.path: self.state[fd.path] if fd.path in self.state else self.read(fd.path) for fd in p.files}
        post: dict[str, bytes | None] = {}
        try:
            for fd in p.files:
                post[fd.path], _ = apply_file(p, fd, pre[fd.path])
        except ApplyError as e:
            # the series is already broken on the pin: later pre-images come without this patch
            return pre, {}, f"does not apply on the pinned upstream either: {e.what}"
        self.state.update(post)
        return pre, post, ""


class HunkSide:
    """A patch's own hunks as its pre- and post-images, for a base whose earlier text is not kept (a lower patch
    of the series was edited): the 3-way merge then takes the patch's change wherever its written context is
    still recognisable, and leaves a conflict block where the change meets the edit."""

    def step(self, p: Patch) -> tuple[dict[str, bytes | None], dict[str, bytes | None], str]:
        pre: dict[str, bytes | None] = {}
        post: dict[str, bytes | None] = {}
        for fd in p.files:
            pre[fd.path] = None if fd.is_new else b"".join(t for h in fd.hunks for t in h.old_lines())
            post[fd.path] = None if fd.is_deleted else b"".join(t for h in fd.hunks for t in h.new_lines())
        return pre, post, ""


def classify(p: Patch, old_pre: dict[str, bytes | None], old_post: dict[str, bytes | None], old_error: str,
             new_cur: Reader, labels: Callable[[str], tuple[str, str, str]] = lambda _rel: LABELS) -> Classified:
    """Apply p on the new upstream exactly, else reverse-check it, else merge it 3-way from the pinned side
    (labels(file) names the three sides of its conflict blocks)."""
    files: list[FileResult] = []
    after: dict[str, bytes | None] = {}
    conflicted: dict[str, bytes] = {}
    drift: list[dict] = []
    for fd in p.files:
        cur = new_cur(fd.path)
        try:
            after[fd.path], d = apply_file(p, fd, cur)
            drift += [x.to_json() for x in d]
            files.append(FileResult(fd.path, "offset" if d else "clean",
                                    [{"hunk": x.hunk, "how": "offset", "offset": x.offset} for x in d]))
            continue
        except ApplyError:
            pass
        places = _hunk_places(p, fd, cur)
        if _reverse_applies(p, fd, cur):
            after[fd.path] = cur
            files.append(FileResult(fd.path, "upstreamed", places, reason="the new upstream already has this change"))
            continue
        if old_error:
            files.append(FileResult(fd.path, "conflict", places, reason=old_error))
            continue
        if cur is None:
            files.append(FileResult(fd.path, "conflict", places, reason="the new upstream has no such file "
                                    "(removed or moved); search for its code elsewhere"))
            continue
        merged, n = fgit.merge_file(old_post[fd.path] or b"", old_pre[fd.path] or b"", cur, labels(fd.path))
        if n == 0:
            after[fd.path] = merged
            files.append(FileResult(fd.path, "merged", places, reason="3-way merge (git merge-file) without "
                                    "conflict; hunks marked 'changed' met new upstream text: review them"))
        else:
            conflicted[fd.path] = merged
            files.append(FileResult(fd.path, "conflict", places, _conflict_blocks(merged),
                                    reason=f"{n} conflict(s) in the 3-way merge"))
    return Classified(files, after, conflicted, drift)


def rebase(p: Patch, pre: dict[str, bytes | None], after: dict[str, bytes | None],
           mode_of: Callable[[str], str]) -> Patch:
    """p re-exported on the new base (message kept): the diff from pre to after, in the patch's file order."""
    fds = []
    for fd in p.files:
        if fd.path not in after:
            continue
        mode = mode_of(fd.path) if pre[fd.path] is not None else (fd.new_mode or REGULAR)
        new_fd = series.diff_file(fd.path, pre[fd.path], after[fd.path], mode, mode)
        if new_fd is not None:
            fds.append(new_fd)
    return series.with_files(p, fds)


def trial(patches: list[Patch], old_read: Reader, new_read: Reader, mode_of: Callable[[str], str]) -> list[PatchResult]:
    """Apply the series cumulatively on both upstreams; classify each patch on the new one, never stopping."""
    old = OldSide(old_read)
    new_state: dict[str, bytes | None] = {}
    # new_state with each conflict taken on its patch's own side: what the patches after a conflict are tried on
    ahead_state: dict[str, bytes | None] = {}
    tainted: dict[str, str] = {}  # path -> the failed patch that left it as it is
    results: list[PatchResult] = []

    def new_cur(rel: str) -> bytes | None:
        return new_state[rel] if rel in new_state else new_read(rel)

    def ahead_cur(rel: str) -> bytes | None:
        return ahead_state[rel] if rel in ahead_state else new_cur(rel)

    def went_ahead(c: Classified) -> None:
        ahead_state.update(c.after)
        ahead_state.update({rel: own_side(data) for rel, data in c.conflicted.items()})

    for p in patches:
        old_pre, old_post, old_error = old.step(p)
        blockers = sorted({tainted[f] for f in p.paths if f in tainted})
        if blockers:
            for f in p.paths:
                tainted.setdefault(f, p.id)
            res = PatchResult(p, "blocked", blocked_by=blockers,
                              note="touches " + ", ".join(f for f in p.paths if tainted[f] in blockers)
                              + " left unpatched by " + ", ".join(blockers))
            c = classify(p, old_pre, old_post, old_error, ahead_cur)
            went_ahead(c)
            res.ahead = {"status": c.status, "assumes": f"conflicts of {', '.join(blockers)} taken on the patch's own side",
                         "files": [f.to_json() for f in c.files if f.status != "clean"]}
            results.append(res)
            continue
        c = classify(p, old_pre, old_post, old_error, new_cur)
        went_ahead(c)
        res = PatchResult(p, c.status, c.files, drift=c.drift)
        if c.status == "conflict":
            for f in p.paths:
                tainted.setdefault(f, p.id)
            res.note = old_error
        elif c.status == "upstreamed":
            new_state.update(c.after)
            res.note = "every change is already in the new upstream: propose dropping it from the series"
        else:
            pre = {rel: new_cur(rel) for rel in c.after}
            new_state.update(c.after)
            res.refreshed = rebase(p, pre, c.after, mode_of)
            if c.status == "merged" and any(f.status == "upstreamed" for f in c.files):
                res.note = "part of it is already upstream; the refreshed patch carries only the rest"
        results.append(res)
    return results


def final_state(results: list[PatchResult], new_read: Reader) -> dict[str, bytes | None]:
    """Contents after the patches that went in (refreshed ones re-applied on the new upstream)."""
    return apply_series([r.refreshed for r in results if r.refreshed is not None], new_read).files


def name_api_drift(results: list[PatchResult], old_paths: Iterable[str], old_read: Reader, new_paths: Iterable[str],
                   new_read: Reader, cache_root: Path | None = None) -> None:
    """Fill each result's `api`: the upstream declarations its added lines use that changed between the two
    upstreams (forktool/sync/apidrift.py), whatever its status: a patch that applies cleanly can still use a
    struct that gained members."""
    from forktool.cache import Cache
    from forktool.sync.apidrift import Upstream, api_drift

    old, new = Upstream(frozenset(old_paths), old_read), Upstream(frozenset(new_paths), new_read)
    cache = Cache(cache_root, "declarations")
    for r in results:
        r.api = [d.to_json() for d in api_drift(old, new, r.patch, cache)]
