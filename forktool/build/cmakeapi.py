"""CMake's file API (codemodel v2): the targets a configured build directory has, their sources and dependencies."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

QUERY = Path(".cmake", "api", "v1", "query", "codemodel-v2")
REPLY = Path(".cmake", "api", "v1", "reply")
BUILD = "<build>"  # how a source written into the build directory is named


@dataclass(frozen=True)
class Target:
    name: str
    type: str  # EXECUTABLE, SHARED_LIBRARY, STATIC_LIBRARY, OBJECT_LIBRARY, MODULE_LIBRARY, UTILITY, ...
    sources: tuple[str, ...]  # relative to the top source directory; BUILD/... in the build directory
    depends: tuple[str, ...]  # names of the targets it needs first
    build_dir: str = "."  # its directory in the build tree, relative to the top

    @property
    def makefile(self) -> str:
        """Its rules (Makefile generator), relative to the top of the build tree."""
        return os.path.normpath(f"{self.build_dir}/CMakeFiles/{self.name}.dir/build.make")


def request(bdir: Path) -> None:
    """Ask the next CMake run to write the codemodel (an empty query file is the request)."""
    q = bdir / QUERY
    if not q.is_file():
        q.parent.mkdir(parents=True, exist_ok=True)
        q.write_bytes(b"")


def targets(bdir: Path) -> dict[str, Target] | None:
    """name -> target from the newest reply, None when CMake has written none (not asked, or older than 3.14)."""
    reply = bdir / REPLY
    try:
        index_name = max(n for n in os.listdir(reply) if n.startswith("index-") and n.endswith(".json"))
        index = json.loads((reply / index_name).read_bytes())
        model_file = index["reply"]["codemodel-v2"]["jsonFile"]
        model = json.loads((reply / model_file).read_bytes())
        config = model["configurations"][0]
        source_root = model["paths"]["source"]
        build_root = model["paths"]["build"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    ids: dict[str, str] = {}
    raw: list[dict] = []
    for t in config.get("targets", []):
        try:
            body = json.loads((reply / t["jsonFile"]).read_bytes())
        except (OSError, ValueError, KeyError):
            return None
        ids[body["id"]] = body["name"]
        raw.append(body)
    out = {}
    for body in raw:
        srcs = []
        for s in body.get("sources", []):
            p = s["path"]
            if os.path.isabs(p) and p.startswith(source_root.rstrip("/") + "/"):
                p = os.path.relpath(p, source_root)
            elif os.path.isabs(p) and p.startswith(build_root.rstrip("/") + "/"):
                # written into the build directory (unity files, build-info.cpp): named where it is in any build
                p = BUILD + "/" + os.path.relpath(p, build_root)
            srcs.append(p)
        deps = tuple(ids[d["id"]] for d in body.get("dependencies", []) if d.get("id") in ids)
        out[body["name"]] = Target(body["name"], body.get("type", ""), tuple(srcs), deps,
                                   str(body.get("paths", {}).get("build", ".")))
    return out


def closure(model: dict[str, Target], names: list[str]) -> set[str]:
    """The named targets and every target they need, transitively (names CMake does not know are left out)."""
    seen: set[str] = set()
    todo = [n for n in names if n in model]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(model[n].depends)
    return seen


def in_order(model: dict[str, Target], names: list[str]) -> list[str]:
    """closure(names), each target after the targets it needs."""
    out: list[str] = []
    seen: set[str] = set()

    def visit(n: str) -> None:
        if n in seen or n not in model:
            return
        seen.add(n)
        for d in model[n].depends:
            visit(d)
        out.append(n)

    for n in names:
        visit(n)
    return out
