"""Where things live in a forktool project, and its vendor.yaml read once into typed objects."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from forktool.errors import ConfigError, UsageError
from forktool.record import NamedTuple, Record

if TYPE_CHECKING:
    from typing import Any

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class Component(NamedTuple):
    """One upstream source tree materialised under the vendored root."""

    name: str
    kind: str  # "sdist" or "git"
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    upstream_commit: str = ""
    # sdist
    package: str = ""
    version: str = ""
    sha256: str = ""
    subdir: str = ""
    # git
    url: str = ""
    commit: str = ""

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}" if self.kind == "sdist" else f"{self.url}@{self.commit}"


class VendorConfig(NamedTuple):
    components: tuple[Component, ...]
    source: Path

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise ConfigError(f"no component named {name!r}", where=str(self.source))


def parse_component(raw: Any, where: str) -> Component:
    """One vendor.yaml component, checked against the schema of its kind."""
    from forktool import schema
    if not isinstance(raw, dict):
        raise ConfigError("a component must be a mapping", where=where)
    kind = raw.get("kind")
    if kind not in ("sdist", "git"):
        raise ConfigError(f"unknown component kind {kind!r} (expected sdist or git)", where=f"{where}.kind")
    schema.check(raw, f"component-{kind}", where)
    return Component(
        name=raw["name"], kind=kind, include=tuple(raw["include"]), exclude=tuple(raw.get("exclude") or ()),
        upstream_commit=raw.get("upstream_commit", ""), package=raw.get("package", ""),
        version=raw.get("version", ""), sha256=raw.get("sha256", ""), subdir=raw.get("subdir", "").strip("/"),
        url=raw.get("url", ""), commit=raw.get("commit", ""),
    )


def read_yaml_mapping(path: Path, schema_name: str, missing_hint: str = "") -> dict[str, Any]:
    """A project config file (YAML) read safely and checked against its schema."""
    from forktool import schema
    root = path.parent.parent  # the project: its config files live one directory down
    return schema.load_yaml(path, schema_name, missing_hint, root=root)


def load_vendor_config(path: Path) -> VendorConfig:
    raw = read_yaml_mapping(path, "vendor", "is this a forktool project?")
    parsed = tuple(parse_component(c, f"{path}: components[{i}]") for i, c in enumerate(raw["components"]))
    names = [c.name for c in parsed]
    if len(set(names)) != len(names):
        raise ConfigError("component names must be unique", where=f"{path}: components")
    return VendorConfig(parsed, path)


class Project(Record):
    """Paths of one forktool project; everything else is derived from them."""

    FIELDS = ("root",)

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
    def registry_dir(self) -> Path:
        return self.root / "registry"

    @property
    def cache_dir(self) -> Path:
        env = os.environ.get("FORKTOOL_CACHE")
        if env:
            return Path(env)
        xdg = os.environ.get("XDG_CACHE_HOME")
        return (Path(xdg) if xdg else Path.home() / ".cache") / "forktool"

    @property
    def vendor(self) -> VendorConfig:
        if self._vendor is None:
            self._vendor = load_vendor_config(self.vendor_yaml)
        return self._vendor


def find_project(start: Path | None = None) -> Project:
    env = os.environ.get("FORKTOOL_ROOT")
    here = Path(env) if env else (start or Path.cwd())
    here = here.resolve()
    for candidate in (here, *here.parents):
        if (candidate / "patches" / "series").is_file() and (candidate / "vendor" / "vendor.yaml").is_file():
            return Project(candidate)
    raise UsageError("not inside a forktool project", where=str(here),
                     hint="run from a directory holding patches/series and vendor/vendor.yaml, or set FORKTOOL_ROOT")
