"""The only place that talks to git (through gitpython)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import git

from forktool.errors import ForktoolError


def archive_commit(url: str, commit: str, cache: Path) -> bytes:
    """A tar archive of `commit` from `url`, through a bare mirror kept in the cache."""
    mirror = cache / "git" / hashlib.sha256(url.encode()).hexdigest()[:16]
    try:
        if mirror.is_dir():
            repo = git.Repo(mirror)
        else:
            repo = git.Repo.clone_from(url, mirror, bare=True, no_checkout=True)
        try:
            repo.commit(commit)
        except (ValueError, git.BadName):
            repo.git.fetch(url, commit)
        buf = io.BytesIO()
        repo.archive(buf, treeish=commit, format="tar")
    except git.GitCommandError as e:
        raise ForktoolError(f"git could not provide {url}@{commit}: {e.stderr.strip()}", where=url,
                            hint="check the url and that the commit exists there") from e
    return buf.getvalue()


def init_repo(path: Path) -> git.Repo:
    return git.Repo.init(path)
