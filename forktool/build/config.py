"""Build profiles and artifact rules (registry/build.yaml), read once into typed objects."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forktool import schema, schemas
from forktool.errors import ConfigError, UsageError
from forktool.project import Project
from forktool.vendor import matches

IMPACTS = ("host", "cuda-dso")


@dataclass(frozen=True)
class ArtifactSpec:
    name: str
    impact: tuple[str, ...]
    paths: tuple[str, ...]
    targets: tuple[str, ...]
    outputs: tuple[str, ...]
    profiles: tuple[str, ...]  # empty: every profile builds it


@dataclass(frozen=True)
class Profile:
    name: str
    generator: str
    flags: tuple[str, ...]
    targets: tuple[str, ...]
    cuda_architectures: str = ""

    @property
    def has_cuda(self) -> bool:
        return bool(self.cuda_architectures) or "-DGGML_CUDA=ON" in self.flags


@dataclass(frozen=True)
class BuildConfig:
    source: Path
    artifacts: tuple[ArtifactSpec, ...]
    profiles: dict[str, Profile]
    links: dict[str, tuple[str, ...]]
    stamped: tuple[str, ...]

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise UsageError(f"no build profile {name!r}", where=str(self.source),
                             hint=f"profiles: {', '.join(sorted(self.profiles))}")
        return self.profiles[name]

    def artifacts_in(self, profile: Profile) -> list[ArtifactSpec]:
        return [a for a in self.artifacts if not a.profiles or profile.name in a.profiles]

    def feeding(self, paths: list[str]) -> tuple[dict[str, list[str]], list[str]]:
        """artifact name -> paths feeding it (first matching rule wins), and the paths no rule matches."""
        out: dict[str, list[str]] = {}
        unmatched = []
        for rel in paths:
            for a in self.artifacts:
                if matches(rel, a.paths):
                    out.setdefault(a.name, []).append(rel)
                    break
            else:
                unmatched.append(rel)
        return out, unmatched

    def impacts(self, artifact_names: list[str] | dict[str, list[str]]) -> list[str]:
        """The impacts (in IMPACTS order) of the named artifacts: the one place impact is computed."""
        by_name = {a.name: a for a in self.artifacts}
        found = {i for n in artifact_names for i in by_name[n].impact}
        return [i for i in IMPACTS if i in found]

    def may_change(self, names: set[str]) -> set[str]:
        """names plus every artifact that links one of them, transitively: their bytes may move on a relink."""
        out = set(names)
        grew = True
        while grew:
            grew = False
            for art, deps in self.links.items():
                if art not in out and out.intersection(deps):
                    out.add(art)
                    grew = True
        return out


def _parse_artifact(raw: Any, where: str, profile_names: set[str]) -> ArtifactSpec:
    schema.check(raw, "build-artifact", where)
    imp = raw["impact"]
    profiles = tuple(raw.get("profiles") or ())
    bad = sorted(set(profiles) - profile_names)
    if bad:
        raise ConfigError(f"unknown profile(s) {', '.join(bad)}", where=f"{where}.profiles",
                          hint=f"profiles: {', '.join(sorted(profile_names))}; " + schemas.fix("build"))
    return ArtifactSpec(raw["name"], tuple(imp) if isinstance(imp, list) else (imp,), tuple(raw.get("paths") or ()),
                        tuple(raw.get("targets") or ()), tuple(raw.get("outputs") or ()), profiles)


def _parse_profiles(raw: dict[str, Any], where: str) -> dict[str, Profile]:
    for name, body in raw.items():
        schema.check(body, "build-profile", f"{where}.{name}")
    out: dict[str, Profile] = {}

    def resolve(name: str, seen: tuple[str, ...]) -> Profile:
        if name in out:
            return out[name]
        if name in seen:
            raise ConfigError(f"profile inheritance loops: {' -> '.join(seen + (name,))}", where=where,
                              hint=schemas.fix("build", "one of those `inherits:`"))
        if name not in raw:
            raise ConfigError(f"profile {seen[-1]!r} inherits unknown profile {name!r}", where=f"{where}.{seen[-1]}",
                              hint=f"profiles: {', '.join(sorted(raw))}; " + schemas.fix("build", "its `inherits:`"))
        body = raw[name]
        base = resolve(body["inherits"], seen + (name,)) if body.get("inherits") else None
        w = f"{where}.{name}"
        generator = body.get("generator", base.generator if base else "Unix Makefiles")
        if generator != "Unix Makefiles":
            # the incremental rebuild and the object count read make's output
            raise ConfigError(f"generator {generator!r} is not supported", where=f"{w}.generator",
                              hint="use \"Unix Makefiles\"")
        flags = (base.flags if base else ()) + tuple(body.get("flags") or ())
        targets = tuple(body.get("targets") or ()) or (base.targets if base else ())
        if not targets:
            raise ConfigError("a profile needs make targets", where=f"{w}.targets",
                              hint=schemas.fix("build", "its `targets:` (or those of the profile it inherits)"))
        archs = str(body.get("cuda_architectures", base.cuda_architectures if base else ""))
        out[name] = Profile(name, generator, flags, targets, archs)
        return out[name]

    for name in raw:
        resolve(name, ())
    return out


def load_config(project: Project) -> BuildConfig:
    """registry/build.yaml checked against its schema (forktool/schemas.py), then cross-checked."""
    path = project.registry_dir / "build.yaml"
    raw = schema.load_yaml(path, "build", "the build profiles live there", root=project.root)
    profiles = _parse_profiles(raw["profiles"], f"{path}: profiles")
    artifacts = tuple(_parse_artifact(a, f"{path}: artifacts[{i}]", set(profiles))
                      for i, a in enumerate(raw["artifacts"]))
    names = {a.name for a in artifacts}
    if len(names) != len(artifacts):
        raise ConfigError("artifact names must be unique", where=f"{path}: artifacts",
                          hint=schemas.fix("build", "the `name:` of one of them"))
    links = {str(k): tuple(v) for k, v in (raw.get("links") or {}).items()}
    stamped = tuple(raw.get("stamped") or ())
    for n in set(links) | {d for v in links.values() for d in v} | set(stamped):
        if n not in names:
            raise ConfigError(f"unknown artifact {n!r}", where=f"{path}: links/stamped",
                              hint=f"artifacts: {', '.join(sorted(names))}; " + schemas.fix("build", "that name"))
    return BuildConfig(path, artifacts, profiles, links, stamped)
