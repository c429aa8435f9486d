"""Where things live in a forktool project, and its vendor.yaml read once into typed objects."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from forktool.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from typing import Any

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# where an upstream comes from: a PyPI sdist by name, a tar archive by URL (sha256-pinned), a local directory,
# or a git commit
KINDS = ("sdist", "tarball", "dir", "git")


class Component(NamedTuple):
    """One upstream source tree materialised under the vendored root."""

    name: str
    kind: str  # one of KINDS
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    upstream_commit: str = ""
    # sdist
    package: str = ""
    version: str = ""
    sha256: str = ""
    subdir: str = ""
    # git (url, commit); tarball (url, sha256)
    url: str = ""
    commit: str = ""
    # dir: a local directory, relative to the project root or absolute
    path: str = ""

    @property
    def spec(self) -> str:
        if self.kind == "sdist":
            return f"{self.package}=={self.version}"
        if self.kind == "tarball":
            return self.url
        if self.kind == "dir":
            return self.path
        return f"{self.url}@{self.commit}"


class VendorConfig(NamedTuple):
    components: tuple[Component, ...]
    source: Path

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise ConfigError(f"no component named {name!r}", where=str(self.source),
                          hint=f"components: {', '.join(c.name for c in self.components)}")


def parse_component(raw: Any, where: str) -> Component:
    """One vendor.yaml component, checked against the schema of its kind."""
    from forktool import schema, schemas
    if not isinstance(raw, dict):
        raise ConfigError("a component must be a mapping", where=where, hint=schemas.fix("vendor", "it"))
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"unknown component kind {kind!r} (expected {', '.join(KINDS)})", where=f"{where}.kind",
                          hint=schemas.fix("vendor"))
    schema.check(raw, f"component-{kind}", where)
    return Component(
        name=raw["name"], kind=kind, include=tuple(raw["include"]), exclude=tuple(raw.get("exclude") or ()),
        upstream_commit=raw.get("upstream_commit", ""), package=raw.get("package", ""),
        version=raw.get("version", ""), sha256=raw.get("sha256", ""), subdir=raw.get("subdir", "").strip("/"),
        url=raw.get("url", ""), commit=raw.get("commit", ""), path=raw.get("path", ""),
    )


def read_yaml_mapping(path: Path, schema_name: str, missing_hint: str = "") -> dict[str, Any]:
    """A project config file (YAML) read safely and checked against its schema."""
    from forktool import schema
    root = path.parent.parent  # the project: its config files live one directory down
    return schema.load_yaml(path, schema_name, missing_hint, root=root)


def load_vendor_config(path: Path) -> VendorConfig:
    raw = read_yaml_mapping(path, "vendor", "is this a forktool project?")
    from forktool import schemas
    parsed = tuple(parse_component(c, f"{path}: components[{i}]") for i, c in enumerate(raw["components"]))
    names = [c.name for c in parsed]
    if len(set(names)) != len(names):
        raise ConfigError("component names must be unique", where=f"{path}: components",
                          hint=schemas.fix("vendor", "the `name:` of one of them"))
    return VendorConfig(parsed, path)


class Project:
    """Paths of one forktool project; everything else is derived from them."""

    __slots__ = ("root", "_vendor")

    def __init__(self, root: Path, _vendor: VendorConfig | None = None):
        self.root = root
        self._vendor = _vendor  # vendor.yaml, read on first use

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def series_file(self) -> Path:
        return self.patches_dir / "series"

    @property
    def vendor_yaml(self) -> Path:
        return self.root / "vendor" / "vendor.yaml"

    @property
    def vendor_lock(self) -> Path:
        return self.root / "vendor" / "vendor.lock"

    @property
    def tree(self) -> Path:
        """The vendored root: patches' a/ and b/ paths are relative to it."""
        return self.root / "vendor" / "llamafile"

    @property
    def state_dir(self) -> Path:
        return self.root / ".opencoti"

    @property
    def backups_dir(self) -> Path:
        return self.state_dir / "vendor-backups"

    @property
    def sync_dir(self) -> Path:
        """A sync's own state (state.json, undo.json) and journal (txn/)."""
        return self.state_dir / "sync"

    @property
    def sync_backups_dir(self) -> Path:
        """A sync's backups of the pin, lock, patches, state and registry (the tree's go to backups_dir)."""
        return self.state_dir / "sync-backups"

    @property
    def project_journal_dir(self) -> Path:
        """Where the journal of an update to the project's own files lives (its paths relative to root)."""
        return self.state_dir / "sync-txn"

    @property
    def registry_dir(self) -> Path:
        return self.root / "registry"

    @property
    def cache_dir(self) -> Path:
        env = os.environ.get("FORKTOOL_CACHE")
        if env:
            path = Path(env)
        else:
            xdg = os.environ.get("XDG_CACHE_HOME")
            path = (Path(xdg) if xdg else Path.home() / ".cache") / "forktool"
        check_cache_dir(path, "FORKTOOL_CACHE" if env else "the user cache directory")
        return path

    @property
    def vendor(self) -> VendorConfig:
        if self._vendor is None:
            self._vendor = load_vendor_config(self.vendor_yaml)
        return self._vendor


def check_cache_dir(path: Path, source: str) -> None:
    """The cache directory must be a directory (or not exist yet): anything else is refused before it is used."""
    try:
        bad = os.path.lexists(path) and not path.is_dir()
    except OSError as e:
        raise ConfigError(f"{source} ({str(path)[:120]}) cannot be used as the cache: {e.strerror}", where=source,
                          hint="point FORKTOOL_CACHE at a directory (it is created when missing)") from None
    if bad:
        raise ConfigError(f"{source} ({path}) is not a directory, so it cannot hold the cache", where=str(path),
                          hint="point FORKTOOL_CACHE at a directory (it is created when missing), or move the file "
                               "away")


def find_project(start: Path | None = None) -> Project:
    env = os.environ.get("FORKTOOL_ROOT")
    here = Path(env) if env else (start or Path.cwd())
    here = here.resolve()
    for candidate in (here, *here.parents):
        try:
            found = (candidate / "patches" / "series").is_file() and (candidate / "vendor" / "vendor.yaml").is_file()
        except OSError as e:  # a name the system cannot look up (too long, a loop of links)
            source = "FORKTOOL_ROOT" if env else "the current directory"
            raise UsageError(f"{source} cannot be used as a project directory: {e.strerror}",
                             where=f"{str(candidate)[:120]}{'...' if len(str(candidate)) > 120 else ''}",
                             hint="set FORKTOOL_ROOT to the project's directory (the one holding patches/series), "
                                  "or unset it and run from inside the project") from None
        if found:
            return Project(candidate)
    raise UsageError("not inside a forktool project", where=str(here),
                     hint="run from a directory holding patches/series and vendor/vendor.yaml, or set FORKTOOL_ROOT")
