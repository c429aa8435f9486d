"""The rebuild one patch forces: the artifacts its files feed and their impacts."""

from __future__ import annotations

from dataclasses import dataclass

from forktool.build.config import BuildConfig
from forktool.series import parse_patch
from forktool.tree import sha256_bytes


def touched_paths(raw: bytes, name: str = "0000-patch.patch") -> list[str]:
    """The vendored paths a patch touches, read from its diff (new, changed and deleted files)."""
    return sorted(parse_patch(raw, name).paths)


@dataclass
class PatchImpact:
    id: str
    name: str
    title: str
    sha256: str
    files: list[str]
    artifacts: dict[str, list[str]]
    impacts: list[str]
    unmatched: list[str]
    declared: str  # the Build-Impact trailer, "" when absent

    @property
    def label(self) -> str:
        return ", ".join(self.impacts) or "none"

    @property
    def declared_mismatch(self) -> bool:
        if not self.declared:
            return False
        return {x.strip() for x in self.declared.split(",") if x.strip() and x.strip() != "none"} != set(self.impacts)

    def describe(self) -> str:
        kind = {("host",): "host-only", ("cuda-dso",): "CUDA DSO only",
                ("host", "cuda-dso"): "host + CUDA DSO"}.get(tuple(self.impacts), "no build impact")
        n = len(self.files)
        arts = ", ".join(self.artifacts) or "no artifact"
        tail = "CUDA DSO rebuild" if "cuda-dso" in self.impacts else "CUDA DSO untouched, no restamp"
        text = f"{self.id}: {kind}, {n} file{'s' if n != 1 else ''} -> {arts}; {tail}"
        if self.unmatched:
            text += f"; {len(self.unmatched)} file(s) match no artifact rule"
        if self.declared_mismatch:
            text += f" (declares Build-Impact: {self.declared})"
        return text

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "title": self.title, "sha256": self.sha256, "files": self.files,
                "artifacts": self.artifacts, "impacts": self.impacts, "unmatched": self.unmatched,
                "declared": self.declared, "declared_mismatch": self.declared_mismatch, "summary": self.describe()}


def patch_impact(cfg: BuildConfig, pid: str, name: str, title: str, raw: bytes, declared: str = "") -> PatchImpact:
    files = touched_paths(raw, name)
    arts, unmatched = cfg.feeding(files)
    return PatchImpact(pid, name, title, sha256_bytes(raw), files, arts, cfg.impacts(arts), unmatched, declared)
