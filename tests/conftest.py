"""Fixtures every test module may ask for; what they are made of lives in tests/helpers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from forktool import cache as fcache
from tests.helpers.build import private_sccache
from tests.helpers.project import UPSTREAM, Proj, make_project
from tests.helpers.registry import registry_project

# read before any test changes it: a cache the caller names (CI restores one) is used as it is
_ENV_CACHE = os.environ.get("FORKTOOL_CACHE")


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """FORKTOOL_CACHE for the whole session: the caller's when set, else a fresh one under pytest's basetemp.

    Tests on the real pinned upstream download its sdist into it at most once per session, and no test reads
    or writes the user's own cache (~/.cache/forktool)."""
    path = Path(_ENV_CACHE) if _ENV_CACHE else tmp_path_factory.mktemp("forktool-cache")
    path.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("FORKTOOL_CACHE")
    os.environ["FORKTOOL_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("FORKTOOL_CACHE", None)
    else:
        os.environ["FORKTOOL_CACHE"] = old




@pytest.fixture
def cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty FORKTOOL_CACHE for one test."""
    c = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("FORKTOOL_CACHE", str(c))
    return c


@pytest.fixture
def proj(tmp_path: Path, cache: Path) -> Proj:
    """A fetched project over a small git upstream (tests.helpers.project.UPSTREAM), no patches yet."""
    return make_project(tmp_path, UPSTREAM)


@pytest.fixture
def rp(tmp_path: Path, cache: Path) -> Proj:
    """A project with one patch applied and a registry that agrees with it (tests.helpers.registry)."""
    return registry_project(tmp_path)


@pytest.fixture
def memo(tmp_path: Path) -> Iterator[fcache.Checks]:
    """Checks remembered under tmp_path, as during a command of a project whose state is there."""
    with fcache.remembering(tmp_path) as m:
        yield m


@pytest.fixture
def sccache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private sccache server (own port, own empty local cache), stopped afterwards."""
    yield from private_sccache(tmp_path, monkeypatch)
