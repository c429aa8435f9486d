"""Build profiles, the rebuild each patch forces, and make runs that prove the rest kept its bytes.

config: registry/build.yaml; impact: one patch's rebuild; plan: what a build will do; run: cmake and make;
progress: the objects to do; cachestats: the compiler cache's counters; check: the scoped compile check;
cuda: the toolkit; cmakeapi: CMake's codemodel; diagnose: a failed run's cause."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forktool.build.cachestats import CacheStats, cache_stats, parse_ccache_stats, parse_sccache_stats
    from forktool.build.config import IMPACTS, ArtifactSpec, BuildConfig, Profile, _parse_profiles, load_config
    from forktool.build.impact import PatchImpact, patch_impact, touched_paths
    from forktool.build.plan import (
        CONFIGURE_RECORD,
        CUDA_COMPILER_CHANGED,
        FRESH,
        LAUNCHERS,
        RECORD,
        RUNNING,
        UNFINISHED,
        Plan,
        _flags_key,
        _which,
        build_dir,
        cmake_inputs_digest,
        configure_flags,
        forget_unfinished,
        launcher,
        make_plan,
        plan_lines,
        read_record,
        stamp,
    )
    from forktool.build.progress import OBJECT_RE, MakeProgress
    from forktool.build.run import (
        MAKE_LOG,
        OUTPUTS_INDEX,
        BuildEvent,
        BuildResult,
        cmake_argv,
        configure,
        last_error,
        make_env,
        release_files,
        run_build,
    )

# each name from the module that holds it, loaded on first use: `forktool verify` reads the compile record
# without importing make's machinery
_HOME = {
    "ArtifactSpec": "config",
    "BuildConfig": "config",
    "BuildEvent": "run",
    "BuildResult": "run",
    "CONFIGURE_RECORD": "plan",
    "CUDA_COMPILER_CHANGED": "plan",
    "FRESH": "plan",
    "CacheStats": "cachestats",
    "IMPACTS": "config",
    "LAUNCHERS": "plan",
    "MAKE_LOG": "run",
    "OUTPUTS_INDEX": "run",
    "PatchImpact": "impact",
    "Plan": "plan",
    "Profile": "config",
    "RECORD": "plan",
    "RUNNING": "plan",
    "UNFINISHED": "plan",
    "MakeProgress": "progress",
    "OBJECT_RE": "progress",
    "_flags_key": "plan",
    "_parse_profiles": "config",
    "_which": "plan",
    "build_dir": "plan",
    "cache_stats": "cachestats",
    "cmake_argv": "run",
    "cmake_inputs_digest": "plan",
    "configure": "run",
    "configure_flags": "plan",
    "forget_unfinished": "plan",
    "last_error": "run",
    "launcher": "plan",
    "load_config": "config",
    "make_env": "run",
    "make_plan": "plan",
    "parse_ccache_stats": "cachestats",
    "parse_sccache_stats": "cachestats",
    "patch_impact": "impact",
    "plan_lines": "plan",
    "read_record": "plan",
    "release_files": "run",
    "run_build": "run",
    "stamp": "plan",
    "touched_paths": "impact",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(f"forktool.build.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'forktool.build' has no attribute {name!r}")


__all__ = [
    "CONFIGURE_RECORD", "CUDA_COMPILER_CHANGED", "FRESH",
    "IMPACTS", "LAUNCHERS", "MAKE_LOG", "OBJECT_RE", "OUTPUTS_INDEX", "RECORD", "RUNNING",
    "UNFINISHED", "ArtifactSpec", "BuildConfig", "BuildEvent", "BuildResult", "CacheStats", "MakeProgress",
    "PatchImpact", "Plan", "Profile",
    "_flags_key", "_parse_profiles", "_which", "build_dir", "cache_stats", "cmake_argv", "cmake_inputs_digest",
    "configure", "configure_flags", "forget_unfinished", "launcher", "last_error", "load_config", "make_env", "make_plan",
    "parse_ccache_stats", "parse_sccache_stats", "patch_impact", "plan_lines", "read_record", "release_files",
    "run_build", "stamp", "touched_paths",
]
