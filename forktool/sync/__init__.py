"""Upstream sync: trial the series on another upstream and say what needs a human; carry it across in a loop."""

from forktool.sync.accept import _repin_text as _repin_text
from forktool.sync.accept import _series_text as _series_text
from forktool.sync.accept import accept as accept
from forktool.sync.buildfiles import build_file_drift as build_file_drift
from forktool.sync.buildfiles import cmake_sources as cmake_sources
from forktool.sync.fetch import Target as Target
from forktool.sync.fetch import _sdist_upstream_commit as _sdist_upstream_commit
from forktool.sync.fetch import component_manifest as component_manifest
from forktool.sync.fetch import fetch_target as fetch_target
from forktool.sync.fetch import pinned_manifest as pinned_manifest
from forktool.sync.fetch import resolve_spec as resolve_spec
from forktool.sync.job import sync as sync
from forktool.sync.relocate import relocate_hooks as relocate_hooks
from forktool.sync.report import SyncResult as SyncResult
from forktool.sync.report import render_markdown as render_markdown
from forktool.sync.report import write_outputs as write_outputs
from forktool.sync.trial import STATUSES as STATUSES
from forktool.sync.trial import PatchResult as PatchResult
from forktool.sync.trial import final_state as final_state
from forktool.sync.trial import own_side as own_side
from forktool.sync.trial import trial as trial

_final_state = final_state
