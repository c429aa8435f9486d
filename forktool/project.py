"""Where things live in a forktool project, and its vendor.yaml read once into typed objects."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from forktool.errors import ConfigError, UsageError

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Component:
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


@dataclass(frozen=True)
class VendorConfig:
    components: tuple[Component, ...]
    source: Path

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise ConfigError(f"no component named {name!r}", where=str(self.source))


_COMPONENT_KEYS = {
    "sdist": {"name", "kind", "package", "version", "sha256", "subdir", "upstream_commit", "include", "exclude"},
    "git": {"name", "kind", "url", "commit", "subdir", "upstream_commit", "include", "exclude"},
}
_REQUIRED = {
    "sdist": {"name", "kind", "package", "version", "sha256", "include"},
    "git": {"name", "kind", "url", "commit", "include"},
}


def _patterns(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError("expected a list of glob patterns", where=where)
    for v in value:
        if v.startswith("/") or ".." in v.split("/"):
            raise ConfigError(f"pattern {v!r} must be relative and stay inside the component", where=where)
    return tuple(value)


def parse_component(raw: Any, where: str) -> Component:
    if not isinstance(raw, dict):
        raise ConfigError("a component must be a mapping", where=where)
    kind = raw.get("kind")
    if kind not in _COMPONENT_KEYS:
        raise ConfigError(f"unknown component kind {kind!r} (expected sdist or git)", where=f"{where}.kind")
    unknown = sorted(set(raw) - _COMPONENT_KEYS[kind])
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)} for a {kind} component", where=where,
                          hint=f"allowed keys: {', '.join(sorted(_COMPONENT_KEYS[kind]))}")
    missing = sorted(_REQUIRED[kind] - set(raw))
    if missing:
        raise ConfigError(f"missing key(s) {', '.join(missing)}", where=where)
    name = str(raw["name"])
    if not NAME_RE.match(name):
        raise ConfigError(f"component name {name!r} must be a plain directory name", where=f"{where}.name")
    sha = str(raw.get("sha256", ""))
    if kind == "sdist" and not SHA256_RE.match(sha):
        raise ConfigError("sha256 must be 64 lowercase hex digits", where=f"{where}.sha256")
    commit = str(raw.get("commit", ""))
    if kind == "git" and not COMMIT_RE.match(commit):
        raise ConfigError("commit must be a full 40-hex commit id", where=f"{where}.commit")
    up = str(raw.get("upstream_commit", ""))
    if up and not COMMIT_RE.match(up):
        raise ConfigError("upstream_commit must be a full 40-hex commit id", where=f"{where}.upstream_commit")
    subdir = str(raw.get("subdir", "")).strip("/")
    if subdir and ".." in subdir.split("/"):
        raise ConfigError("subdir must stay inside the archive", where=f"{where}.subdir")
    return Component(
        name=name, kind=kind, include=_patterns(raw.get("include"), f"{where}.include"),
        exclude=_patterns(raw.get("exclude"), f"{where}.exclude"), upstream_commit=up,
        package=str(raw.get("package", "")), version=str(raw.get("version", "")), sha256=sha,
        subdir=subdir, url=str(raw.get("url", "")), commit=commit,
    )


def read_yaml_mapping(path: Path, keys: set[str], missing_hint: str = "") -> dict[str, Any]:
    """A YAML file whose top level is a mapping with only the given keys; errors name the file and key."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(f"{path} not found", where=str(path), hint=missing_hint) from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}", where=str(path)) from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path.name} must be a mapping", where=str(path))
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {', '.join(unknown)}", where=f"{path}: {unknown[0]}",
                          hint=f"allowed: {', '.join(sorted(keys))}")
    return raw


def load_vendor_config(path: Path) -> VendorConfig:
    raw = read_yaml_mapping(path, {"components"}, "is this a forktool project?")
    comps = raw.get("components")
    if not isinstance(comps, list) or not comps:
        raise ConfigError("components must be a non-empty list", where=f"{path}: components")
    parsed = tuple(parse_component(c, f"{path}: components[{i}]") for i, c in enumerate(comps))
    names = [c.name for c in parsed]
    if len(set(names)) != len(names):
        raise ConfigError("component names must be unique", where=str(path))
    return VendorConfig(parsed, path)


@dataclass
class Project:
    """Paths of one forktool project; everything else is derived from them."""

    root: Path
    _vendor: VendorConfig | None = field(default=None, repr=False)

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
