"""The only place that talks to git (through gitpython)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from forktool.errors import ForktoolError


def _git() -> Any:
    """gitpython, imported by the commands that talk to git only (it costs a noticeable part of a start-up)."""
    import git

    return git


# The whole config of a mirror forktool made: git runs what a repository's own config names (a url rewritten to an
# ext:: command, a hook), so a mirror in the shared cache is used only with these settings; repositoryformatversion 1
# with the extensions git may have cloned it with (a sha256 upstream, reftable) is the one other form kept.
MIRROR_CONFIG = "[core]\n\trepositoryformatversion = {version}\n\tbare = true\n\thooksPath = /dev/null\n{extensions}"
_MIRROR_CONFIG_RE = re.compile(r"\[core\]\n\trepositoryformatversion = [01]\n\tbare = true\n\thooksPath = /dev/null\n"
                               r"(\[extensions\]\n(\tobjectformat = sha(1|256)\n)?(\trefstorage = (files|reftable)\n)?)?")
_EXTENSION_RE = re.compile(r"^\s*(objectformat|refstorage)\s*=\s*(sha1|sha256|files|reftable)\s*$", re.M | re.I)


def _own_config(mirror: Path) -> None:
    """Replace the config of a mirror forktool has just cloned with MIRROR_CONFIG (its format kept)."""
    text = (mirror / "config").read_text()
    found = {k.lower(): v.lower() for k, v in _EXTENSION_RE.findall(text)}
    ext = "".join(f"\t{k} = {found[k]}\n" for k in ("objectformat", "refstorage") if k in found)
    cfg = MIRROR_CONFIG.format(version=1 if ext else 0, extensions=f"[extensions]\n{ext}" if ext else "")
    (mirror / "config").write_text(cfg)


def _usable_mirror(mirror: Path) -> bool:
    """Is mirror a directory holding only what forktool leaves there to read as data (MIRROR_CONFIG, no commondir
    naming another repository's config)? One that is not is removed, to be cloned again."""
    from forktool.tree import remove_tree

    if not os.path.lexists(mirror):
        return False
    try:
        ok = (mirror.is_dir() and not mirror.is_symlink() and not os.path.lexists(mirror / "commondir")
              and _MIRROR_CONFIG_RE.fullmatch((mirror / "config").read_text()) is not None)
    except (OSError, UnicodeDecodeError):
        ok = False
    if not ok:
        if mirror.is_dir() and not mirror.is_symlink():
            remove_tree(mirror)
        else:
            mirror.unlink()
    return ok


def _clone(git: Any, url: str, mirror: Path) -> Any:
    """Clone url beside mirror, give the clone MIRROR_CONFIG, then rename it into place whole: a clone in progress
    never stands under the mirror's name, where another forktool sharing the cache would take it (git's config) for
    a mirror not forktool's and remove it mid-clone. Where another clone was renamed there first, that one is used."""
    import errno

    from forktool.tree import remove_dead_work_dirs, remove_tree

    # named .MIRROR-PID-RANDOM: one that a kill left is removed by the next clone, once its process is gone
    remove_dead_work_dirs(mirror.parent, re.compile(rf"^\.{re.escape(mirror.name)}-(\d+)-[0-9a-f]{{12}}$"))
    work = mirror.parent / f".{mirror.name}-{os.getpid()}-{os.urandom(6).hex()}"
    try:
        git.Repo.clone_from(url, work, bare=True, no_checkout=True).close()
        _own_config(work)
        try:
            os.rename(work, mirror)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    finally:
        if os.path.lexists(work):
            remove_tree(work)
    return git.Repo(mirror)


def _check_objects(repo: Any, mirror: Path, commit: str) -> None:
    """Every object the archive of commit is made of (the commit, its trees, its files) hashes to its name. git does
    not re-hash objects it reads, so a mirror in the shared cache could otherwise give other bytes under the pinned
    commit; with each object checked, the commit id names the tree exactly."""
    full = repo.git.rev_parse("--verify", f"{commit}^{{commit}}")
    listing = repo.git.ls_tree("-r", "-t", "-z", "--full-tree", full)
    ids = [(full, "commit")] + [(line.split()[2], line.split()[1]) for line in listing.split("\0")
                                if line and line.split()[1] in ("tree", "blob")]
    text = _object(repo, mirror, full, "commit")
    root = text.split(b"\n", 1)[0].removeprefix(b"tree ").decode()
    for oid, kind in [(root, "tree"), *ids[1:]]:
        _object(repo, mirror, oid, kind)


def _object(repo: Any, mirror: Path, oid: str, kind: str) -> bytes:
    """The bytes of object oid of the given kind, refused unless they hash to oid as git names objects."""
    try:
        stream = repo.odb.stream(bytes.fromhex(oid))
        data = stream.read()
    except (ValueError, _git().BadObject):  # `git cat-file` does not have it: "SHA ... could not be resolved"
        raise ForktoolError(f"the git mirror lacks object {oid[:12]} ({kind}) of the commit", where=str(mirror),
                            hint=f"remove {mirror} (forktool clones it again)") from None
    header = f"{stream.type.decode() if isinstance(stream.type, bytes) else stream.type} {len(data)}\0".encode()
    if hashlib.new("sha1" if len(oid) == 40 else "sha256", header + data).hexdigest() != oid or \
            not header.startswith(kind.encode() + b" "):
        raise ForktoolError(f"the git mirror holds object {oid[:12]} ({kind}) with bytes that do not hash to its name",
                            where=str(mirror), hint=f"remove {mirror} (forktool clones it again), and find out who "
                            "wrote it: the mirror is in the shared cache")
    return data


def archive_commit(url: str, commit: str, cache: Path) -> bytes:
    """A tar archive of `commit` from `url`, through a bare mirror kept in the cache (a mirror whose settings are not
    forktool's is cloned again: see MIRROR_CONFIG)."""
    git = _git()
    mirror = cache / "git" / hashlib.sha256(url.encode()).hexdigest()[:16]
    repo = None
    try:
        if _usable_mirror(mirror):
            try:
                repo = git.Repo(mirror)
            except git.InvalidGitRepositoryError:
                # forktool's config in a directory git does not take for a repository (its HEAD or objects gone):
                # only a cache, cloned again (a clone killed before it ended is left beside it, never under its name)
                from forktool.tree import remove_tree

                remove_tree(mirror)
        if repo is None:
            repo = _clone(git, url, mirror)
        try:
            repo.commit(commit)
        except (ValueError, git.BadName):
            repo.git.fetch(url, commit)
        _check_objects(repo, mirror, commit)
        buf = io.BytesIO()
        repo.archive(buf, treeish=commit, format="tar")
    except git.GitCommandError as e:
        if isinstance(e.status, int) and e.status < 0:  # a signal ended git: nothing says the url or commit is wrong
            from forktool import proc

            raise ForktoolError(f"git could not provide {url}@{commit}: git {proc.ended(e.status)}", where=url,
                                hint="run the command again; if git keeps being killed, look for what kills it "
                                     "(out of memory, a timeout)") from e
        raise ForktoolError(f"git could not provide {url}@{commit}: {e.stderr.strip()}", where=url,
                            hint="check the url and that the commit exists there") from e
    finally:
        if repo is not None:  # the object check reads through `git cat-file` processes that live until closed
            repo.close()
    return buf.getvalue()


def merge_file(ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str]) -> tuple[bytes, int]:
    """3-way merge of one file's bytes with `git merge-file -p --diff3`: (result, number of conflicts)."""
    git = _git()
    inputs = (("ours", ours), ("base", base), ("theirs", theirs))
    if hasattr(os, "memfd_create"):
        # the three inputs live in anonymous memory files handed to git by descriptor: nothing is written to
        # disk, so nothing is left behind on any path out of here, a SIGKILL included
        fds = []
        try:
            for name, data in inputs:
                fd = os.memfd_create(f"forktool-merge-{name}", 0)
                fds.append(fd)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            argv = ["git", "merge-file", "-p", "--diff3", "-L", labels[0], "-L", labels[1], "-L", labels[2],
                    *(f"/dev/fd/{fd}" for fd in fds)]
            status, out, err = git.Git().execute(argv, with_extended_output=True, with_exceptions=False,
                                                 stdout_as_string=False, strip_newline_in_stdout=False,
                                                 pass_fds=tuple(fds))
        finally:
            for fd in fds:
                os.close(fd)
    else:
        with tempfile.TemporaryDirectory(prefix="forktool-merge-") as tmp:
            paths = []
            for name, data in inputs:
                p = Path(tmp) / name
                p.write_bytes(data)
                paths.append(str(p))
            argv = ["git", "merge-file", "-p", "--diff3",
                    "-L", labels[0], "-L", labels[1], "-L", labels[2], *paths]
            # exit status is the conflict count (capped at 127); a negative status (255) is an error
            status, out, err = git.Git(tmp).execute(argv, with_extended_output=True, with_exceptions=False,
                                                    stdout_as_string=False, strip_newline_in_stdout=False)
    if status < 0:  # a signal ended it (a crash, an OOM kill): no merge was made
        from forktool import proc

        raise ForktoolError(f"git merge-file {proc.ended(status)}", where=labels[0],
                            hint="run the command again; if git keeps being killed, look for what kills it "
                                 "(out of memory, a timeout)")
    if status > 127:
        msg = err.decode("utf-8", "replace") if isinstance(err, bytes) else str(err)
        raise ForktoolError(f"git merge-file failed: {msg.strip()}",
                            where=labels[0], hint="check that git is installed and the inputs are text")
    return out, status


def gitlink_commit(git_dir: Path, path: str) -> str | None:
    """The commit a submodule at `path` points to in HEAD of the repository at git_dir (None if unknown)."""
    git = _git()
    # a bare --git-dir call: the sdist's .git may carry worktree settings gitpython's Repo cannot open
    status, line, _ = git.Git(git_dir).execute(["git", "--git-dir", str(git_dir), "ls-tree", "HEAD", "--", path],
                                               with_extended_output=True, with_exceptions=False)
    if status != 0:
        return None
    parts = line.split()
    return parts[2] if len(parts) >= 3 and parts[1] == "commit" else None


def head_commit(worktree: Path) -> str | None:
    """The commit HEAD names in the git checkout at worktree (None if it is not one or has no commit)."""
    git = _git()
    status, line, _ = git.Git(worktree).execute(["git", "-C", str(worktree), "rev-parse", "--verify", "-q", "HEAD"],
                                                with_extended_output=True, with_exceptions=False)
    line = line.strip()
    return line if status == 0 and len(line) == 40 else None
