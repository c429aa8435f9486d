"""Projects and series for the sync tests: patches as objects, a written project, a newer synthetic upstream."""

from __future__ import annotations

from pathlib import Path

from forktool.project import Project
from forktool.series import Patch, parse_patch
from forktool.tree import digest, scan
from tests.helpers.patches import make_patch
from tests.helpers.project import UPSTREAM, Proj, git

DATE = "Mon, 30 Nov 2026 00:00:00 +0000"


def sync_patch(name: str, title: str, changes: list[tuple[str, bytes | None, bytes | None]]) -> Patch:
    """A patch object from (path, old, new) triples, with the header `forktool refresh` writes (tests.helpers.patches)."""
    text = make_patch(name, {rel: (old, new) for rel, old, new in changes}, title, impact="host",
                      author="opencoti <fork@opencoti.invalid>", date=DATE)
    return parse_patch(text.encode(), name)


def write_project(root: Path, component: str, patches: list[Patch]) -> Project:
    """A project of one vendor.yaml (its text) and these patches in the series."""
    (root / "vendor").mkdir(parents=True, exist_ok=True)
    (root / "patches").mkdir(exist_ok=True)
    (root / "registry").mkdir(exist_ok=True)
    (root / "vendor" / "vendor.yaml").write_text(component)
    for p in patches:
        (root / "patches" / p.name).write_bytes(p.raw)
    (root / "patches" / "series").write_text("# the series\n" + "".join(p.name + "\n" for p in patches))
    return Project(root)


# the newer upstream: five lines added above b.c's patched line (offset), a.c's patched line changed (conflict)
NEW = dict(UPSTREAM)
NEW["src/b.c"] = "".join(f"new {i}\n" for i in range(5)) + UPSTREAM["src/b.c"]
NEW["src/a.c"] = UPSTREAM["src/a.c"].replace("    return 1;\n", "    return 2; /* upstream */\n")
A_PATCHED = UPSTREAM["src/a.c"].replace("    return 1;\n", "    return 10; // opencoti-hook: a-ten\n")
A_TAIL = A_PATCHED.replace("int tail(void) { return 0; }\n", "int tail(void) { return 3; }\n")


def loop_series(proj: Proj) -> list[str]:
    """Four patches over UPSTREAM, applied: 0002 conflicts with NEW, 0001 moves by an offset."""
    b = UPSTREAM["src/b.c"]
    patches = [
        sync_patch("0001-b.patch", "b: line ten", [("up/src/b.c", b.encode(),
                                                      b.replace("line 10\n", "line 10 patched\n").encode())]),
        sync_patch("0002-a.patch", "a: return ten", [("up/src/a.c", UPSTREAM["src/a.c"].encode(),
                                                        A_PATCHED.encode())]),
        sync_patch("0003-tail.patch", "a: tail returns three", [("up/src/a.c", A_PATCHED.encode(), A_TAIL.encode())]),
        sync_patch("0004-d.patch", "new header", [("up/include/d.h", None, b"#pragma once\nint d(void);\n")]),
    ]
    for p in patches:
        proj.write_patch(p.name, p.raw.decode())
    proj.run("apply")
    return [p.name for p in patches]


def new_upstream(proj: Proj) -> str:
    """Commit NEW over the project's upstream repository; its commit id."""
    for rel, text in NEW.items():
        (proj.upstream / rel).write_text(text)
    git(proj.upstream, "commit", "-qam", "newer upstream")
    return git(proj.upstream, "rev-parse", "HEAD")


def everything(proj: Proj) -> dict[str, str]:
    """Digest of what --abort must restore: tree, pin, lock, patches, series, workspace state."""
    root = proj.root
    out = {"tree": digest(scan(proj.tree)), "patches": digest(scan(root / "patches"))}
    for rel in ("vendor/vendor.yaml", "vendor/vendor.lock", ".opencoti/state.json"):
        out[rel] = (root / rel).read_text()
    return out


def pushed_copy(proj: Proj, dest: Path) -> Proj:
    """What the CI job pushes of a stopped sync (pin, lock, registry's build.yaml, the sync's state, the patches
    carried so far), copied to dest as a fresh checkout over the same upstream; no vendored tree."""
    for rel in ("vendor/vendor.yaml", "vendor/vendor.lock", "registry/build.yaml", ".opencoti/sync/state.json"):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes((proj.root / rel).read_bytes())
    (dest / "patches").mkdir()
    for p in (proj.root / "patches").iterdir():
        (dest / "patches" / p.name).write_bytes(p.read_bytes())
    return Proj(dest, proj.upstream)


def resolve(proj: Proj) -> None:
    text = (proj.tree / "up/src/a.c").read_text()
    start, end = text.index("<<<<<<< "), text.index(">>>>>>> ")
    end = text.index("\n", end) + 1
    (proj.tree / "up/src/a.c").write_text(text[:start] + "    return 20; // opencoti-hook: a-ten\n" + text[end:])
