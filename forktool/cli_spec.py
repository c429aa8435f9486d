"""Every command declared once: its words, options, help and call; the fast parser and the typer app read it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from forktool.output import Report
    from forktool.project import Project

    Opts = dict[str, str | int | bool | None]

REQUIRED = object()  # the default of an argument that must be given


class Param:
    """One option or positional argument. kind: "flag" (bool), "str" or "int" (an option taking a value), or
    "arg" (positional text). `dest` is the key the call reads; `names` the spellings on the command line."""

    __slots__ = ("dest", "names", "kind", "default", "help", "metavar", "off")

    def __init__(self, dest: str, *names: str, kind: str = "flag", default: object = None, help: str = "",
                 metavar: str | None = None, off: str | None = None) -> None:
        self.dest, self.names, self.kind, self.help, self.metavar, self.off = dest, names, kind, help, metavar, off
        self.default = False if kind == "flag" and default is None else default


class Command:
    """A command: the words that name it, its help, its parameters and the call that runs it.

    `quick`: an everyday tree command after which the process may leave without the interpreter's teardown
    (cli.entry says why). `moves`: it may change the project, so a run whose output cannot be written says that
    the command itself completed."""

    __slots__ = ("words", "help", "params", "call", "quick", "moves")

    def __init__(self, words: tuple[str, ...], help: str, params: list[Param],
                 call: Callable[[Project, Opts], Report], quick: bool = False, moves: bool = False) -> None:
        self.words, self.help, self.params, self.call, self.quick, self.moves = words, help, params, call, quick, moves


class Call:
    """A parsed command line: the command and every parameter's value (defaults filled in)."""

    __slots__ = ("command", "opts")

    def __init__(self, command: Command, opts: Opts) -> None:
        self.command, self.opts = command, opts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Call) and (self.command, self.opts) == (other.command, other.opts)

    def __repr__(self) -> str:
        return f"Call({' '.join(self.command.words)}, {self.opts})"


# ---------------------------------------------------------------- the calls (command modules load on use)


def _str(o: Opts, key: str) -> str:
    return str(o[key])


def _opt(o: Opts, key: str) -> str | None:
    v = o[key]
    return None if v is None else str(v)


def _vendor_fetch(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.vendor_fetch(p, _opt(o, "sdist"), not o["no_cache"])


def _vendor_status(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.vendor_status(p)


def _apply(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.apply(p, _opt(o, "upto"), bool(o["force"]), bool(o["reanchor"]))


def _unapply(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.unapply(p, _opt(o, "to"), bool(o["force"]))


def _status(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.status(p)


def _verify(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.verify(p, not o["no_cache"])


def _refresh(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    return tree_cmds.refresh(p, _str(o, "patch_id"))


def _new(p: Project, o: Opts) -> Report:
    from forktool.commands import tree_cmds
    slug = _str(o, "slug")
    return tree_cmds.new(p, slug, _str(o, "title") or slug, _str(o, "author"), _opt(o, "patch_id"))


def _backup_create(p: Project, o: Opts) -> Report:
    from forktool.commands import backup_cmds
    return backup_cmds.create(p, _str(o, "slug"))


def _backup_list(p: Project, o: Opts) -> Report:
    from forktool.commands import backup_cmds
    return backup_cmds.list_(p)


def _backup_restore(p: Project, o: Opts) -> Report:
    from forktool.commands import backup_cmds
    return backup_cmds.restore(p, _str(o, "name"))


def _backup_prune(p: Project, o: Opts) -> Report:
    from forktool.commands import backup_cmds
    return backup_cmds.prune(p, int(o["keep"]))  # type: ignore[arg-type]


def _recover(p: Project, o: Opts) -> Report:
    from forktool.commands import recover_cmds
    return recover_cmds.recover(p, bool(o["discard"]), _opt(o, "backup"))


def _build(p: Project, o: Opts) -> Report:
    from forktool.commands import build_cmds
    jobs = o["jobs"]
    return build_cmds.dispatch(p, _opt(o, "profile"), bool(o["plan"]), bool(o["check"]), bool(o["every"]),
                               None if jobs is None else int(jobs))


def _package(p: Project, o: Opts) -> Report:
    from forktool.commands import package_cmds
    return package_cmds.package(p, _str(o, "profile"), _opt(o, "out"))


def _package_verify(p: Project, o: Opts) -> Report:
    from forktool.commands import package_cmds
    return package_cmds.verify(p, _str(o, "directory"))


def _gates(p: Project, o: Opts) -> Report:
    from forktool.commands import gates_cmds
    return gates_cmds.gates(p, _opt(o, "patch_id"), _opt(o, "gate"), bool(o["list_only"]))


def _sync(p: Project, o: Opts) -> Report:
    from forktool.commands import sync_cmds
    actions = [a for a in ("start", "continue", "skip", "abort", "undo") if o[a.replace("continue", "cont")]]
    from forktool.sync.fetch import spec_with
    to = spec_with(_opt(o, "to"), _opt(o, "subdir"), _opt(o, "sha256"), _opt(o, "upstream_commit"))
    return sync_cmds.dispatch(p, to, bool(o["accept"]), bool(o["build"]), _str(o, "out"), actions,
                              bool(o["review_merged"]))


def _markers(p: Project, o: Opts) -> Report:
    from forktool.commands import registry_cmds
    return registry_cmds.markers(p)


def _registry_check(p: Project, o: Opts) -> Report:
    from forktool.commands import registry_cmds
    return registry_cmds.check(p)


def _registry_render(p: Project, o: Opts) -> Report:
    from forktool.commands import registry_cmds
    return registry_cmds.render(p, bool(o["check_only"]))


# ---------------------------------------------------------------- the declaration

APP_HELP = "Keep a soft fork of llama.cpp alive as a numbered patch series."
VERSION = Param("version", "--version", help="Print the tool version and the stamp of the applied series, then exit.")
GROUPS = {"vendor": "The pinned upstream.",
          "backup": "Vendor backups under .opencoti/vendor-backups/.",
          "registry": "The UPSTREAM_SYNC registry.",
          "package": ""}  # a command of its own: its help is the command's

JSON = Param("json", "--json", help="Print the result as JSON on stdout.")
FORCE = Param("force", "--force", help="Back up local edits in the vendored tree, then overwrite them.")

COMMANDS = [
    # the tree
    Command(("vendor", "fetch"), "Download the pinned upstream with pip, check its sha256, fill the pristine cache, "
            "materialise the tree.",
            [Param("sdist", "--sdist", kind="str", help="Use this local sdist file instead of pip (its sha256 is still "
                   "checked)."),
             Param("no_cache", "--no-cache", help="Extract the pinned archive and compare its digest with "
                   "vendor.lock's even when the cache holds that pristine (a lock from a checkout someone else "
                   "made: a shared cache cannot choose the upstream)."), JSON], _vendor_fetch, moves=True),
    Command(("vendor", "status"), "Show the pin, the lock and the pristine cache's health.", [JSON], _vendor_status),
    Command(("apply",), "Apply the series (exact context, atomic, writing only changed files).",
            [Param("upto", "--upto", kind="str", help="Stop after this patch id (e.g. 0072)."), FORCE,
             Param("reanchor", "--reanchor", help="Rewrite patches that now apply at an offset or over changed blobs "
                   "into canonical form (same changes); one that no longer applies is carried by the sync loop, "
                   "which compiles what the series feeds."), JSON], _apply, quick=True, moves=True),
    Command(("unapply",), "Remove applied patches from the top (all of them without --to).",
            [Param("to", "--to", kind="str", help="Keep patches up to and including this id."), FORCE, JSON], _unapply,
            quick=True, moves=True),
    Command(("status",), "Show the series (applied, drift, files) and the tree state.", [JSON], _status, quick=True),
    Command(("verify",), "Prove the tree: pristine cache = lock, patches re-export byte for byte, tree digest = lock, "
            "registry.\n\nEvery difference is listed in one report; --json carries tree_digest and problems[] pass or "
            "fail.",
            [Param("no_cache", "--no-cache", help="Prove everything from scratch: no stat index, no cached re-exports, "
                   "scopes or verdict."), JSON], _verify, quick=True),
    Command(("refresh",), "Rewrite one applied patch from the current tree (below the top: the patches above are "
            "re-applied on it).",
            [Param("patch_id", kind="arg", default=REQUIRED, metavar="ID", help="An applied patch."), JSON], _refresh,
            quick=True, moves=True),
    Command(("new",), "Insert an empty patch after the current top and register it in the series.",
            [Param("slug", kind="arg", default=REQUIRED, help="Lowercase slug, e.g. kv-window-sizer."),
             Param("title", "--title", kind="str", default="", help="Patch title (Subject)."),
             Param("author", "--author", kind="str", default="opencoti <fork@opencoti.invalid>", help="From: line."),
             Param("patch_id", "--id", kind="str", help="Use this four-digit id (must be free)."), JSON], _new,
            moves=True),
    # backups
    Command(("backup", "create"), "Back up the vendored tree (only files that differ from pristine are stored).",
            [Param("slug", kind="arg", default="manual", help="Name part after the timestamp: lowercased, each run of "
                   "characters other than a-z and 0-9 made one '-', at most 60 (the backup's name is printed)."),
             JSON], _backup_create,
            moves=True),
    Command(("backup", "list"), "List backups, oldest first.", [JSON], _backup_list),
    Command(("backup", "restore"), "Verify a backup's checksums and return the tree to it, byte for byte.",
            [Param("name", kind="arg", default=REQUIRED, help="Backup directory name."), JSON], _backup_restore,
            moves=True),
    Command(("backup", "prune"), "Delete all but the newest N backups.",
            [Param("keep", "--keep", kind="int", default=10, help="How many of the newest to keep."), JSON],
            _backup_prune, moves=True),
    Command(("recover",), "Show an interrupted update's journal; finish it, or roll the tree back from its backup, or "
            "discard it.",
            [Param("discard", "--discard", help="Drop the journal and keep the tree as it is."),
             Param("backup", "--backup", kind="str", help="Roll back to this backup instead of the one taken before "
                   "the update."), JSON], _recover, moves=True),
    # build, package, gates, sync
    Command(("build",), "Configure once, then make only the targets the applied patches impact; check the rest kept "
            "its bytes.",
            [Param("profile", "--profile", kind="str", help="Build profile from registry/build.yaml (cpu, cuda); "
                   "default cpu."),
             Param("plan", "--plan", help="Only show what would be rebuilt and why."),
             Param("check", "--check", help="Only compile the translation units the series' files feed, and record "
                   "it."),
             Param("every", "--all", help="With --check: every profile."),
             Param("jobs", "-j", "--jobs", kind="int", help="make -jN (default: CPU count)."), JSON], _build,
            moves=True),
    Command(("package",), "Deterministic release directory and archive.",
            [Param("profile", "--profile", kind="str", default="cpu", help="Build profile whose outputs are packaged."),
             Param("out", "--out", kind="str", help="Output directory (default dist/)."), JSON], _package, moves=True),
    Command(("package", "verify"), "Re-check a release's sums and manifest; fails on any tampering.",
            [Param("directory", kind="arg", default=REQUIRED, help="A release directory made by `forktool package`."),
             JSON], _package_verify),
    Command(("gates",), "Run the gates the registry records (those needing a GPU are skipped elsewhere, with the "
            "reason,\nand the run exits 1: not checked).",
            [Param("patch_id", kind="arg", metavar="[ID]", help="Only this patch's gates."),
             Param("gate", "--gate", kind="str", help="Only the gate with this name."),
             Param("list_only", "--list", help="List the gates and what they need."), JSON], _gates, moves=True),
    Command(("sync",), "Trial the whole series on another upstream (report + refreshed patches), or move the fork "
            "there\n(--start, then --continue / --skip / --abort; --undo after the finish).",
            [Param("to", "--to", kind="str", help="Another upstream, e.g. llama-cpp-python==0.3.35."),
             Param("accept", "--accept", help="Move the pin and the patches to SPEC when clean."),
             Param("build", "--build", off="--no-build", help="cpu build of the applied result."),
             Param("out", "--out", kind="str", default="dist/sync", help="Directory for the report and refreshed "
                   "patches."),
             Param("start", "--start", help="Move the fork to SPEC: back up, materialise it, apply the series in "
                   "order, stop at the first conflict."),
             Param("cont", "--continue", help="Take the resolved tree for the stopped patch and go on."),
             Param("skip", "--skip", help="Drop the stopped patch (the series comments it out) and go on."),
             Param("abort", "--abort", help="Put pin, lock, patches, series and tree back as before --start."),
             Param("undo", "--undo", help="Put a finished sync's pin, lock, patches, series, registry and tree back "
                   "as before its start (until the next sync)."),
             Param("review_merged", "--review-merged", off="--no-review-merged", default=True, help="With --start: "
                   "stop at each patch carried by a 3-way merge for review."),
             Param("subdir", "--subdir", kind="str", help="Where the llama.cpp tree sits inside the --to source "
                   "(e.g. llama.cpp); found in it when not given."),
             Param("sha256", "--sha256", kind="str", help="The sha256 of a --to archive URL (required for one)."),
             Param("upstream_commit", "--upstream-commit", kind="str", help="The llama.cpp commit the --to source "
                   "carries, when it does not say."),
             JSON], _sync, moves=True),
    Command(("markers",), "List every opencoti-hook marker in the vendored tree as file:line:hook.", [JSON], _markers),
    Command(("registry", "check"), "Registry, series and tree agree both ways (hooks, sites, files, build impact).",
            [JSON], _registry_check),
    Command(("registry", "render"), "Render registry/UPSTREAM_SYNC.md from the YAML (jinja2).",
            [Param("check_only", "--check", help="Fail if UPSTREAM_SYNC.md is stale."), JSON], _registry_render,
            moves=True),
]


def find(argv: list[str]) -> Command | None:
    """The command the line names (its longest matching words), whether or not the rest of the line parses."""
    best = None
    for c in COMMANDS:
        if tuple(argv[:len(c.words)]) == c.words and (best is None or len(c.words) > len(best.words)):
            best = c
    return best


def parse(argv: list[str]) -> Call | None:
    """The command line read by the declaration alone (no typer), or None for anything it does not read plainly:
    help, a usage error, a repeated option, a value that looks like an option. typer then owns the line."""
    command = find(argv)
    if command is None:
        return None
    by_name: dict[str, Param] = {}
    positional: list[Param] = []
    for each in command.params:
        if each.kind == "arg":
            positional.append(each)
        for n in (*each.names, *((each.off,) if each.off else ())):
            by_name[n] = each
    opts: Opts = {}
    args = argv[len(command.words):]
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        p = by_name.get(name)
        if p is not None and p.kind in ("str", "int"):
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("-"):
                    return None
                i += 1
                value = args[i]
            if p.dest in opts or (p.kind == "int" and not (value.isascii() and value.isdigit())):
                return None
            opts[p.dest] = int(value) if p.kind == "int" else value
        elif p is not None and not eq and p.dest not in opts:
            opts[p.dest] = a != p.off
        elif p is None and positional and not a.startswith("-"):
            opts[positional.pop(0).dest] = a
        else:
            return None
        i += 1
    for each in command.params:
        if each.dest not in opts:
            if each.default is REQUIRED:
                return None
            opts[each.dest] = each.default  # type: ignore[assignment]  # the declared default of its kind
    return Call(command, opts)


def reference() -> str:
    """Every command and option as Markdown, from COMMANDS: the generated part of docs/manual-cli.md."""
    out = [f"`forktool --version`: {VERSION.help} Every command takes `--help`."]
    for c in COMMANDS:
        words = " ".join(c.words)
        args = " ".join(name if p.default is REQUIRED or name.startswith("[") else f"[{name}]"
                        for p in c.params if p.kind == "arg" for name in [p.metavar or p.dest.upper()])
        out += ["", f"### `forktool {words}{' ' + args if args else ''}`", "", " ".join(c.help.split()), ""]
        rows = []
        for p in c.params:
            if p.kind == "arg":
                name = (p.metavar or p.dest.upper()).strip("[]")
            else:
                name = ", ".join(p.names) + (f" / {p.off}" if p.off else "")
                name += {"str": " TEXT", "int": " N"}.get(p.kind, "")
            default = p.default not in (None, False, "", REQUIRED) and not (p.kind == "arg" and p.default is None)
            shown = (p.names[0] if p.default is True else p.default) if default else None
            rows.append(f"| `{name}` | {p.help}{f' Default: `{shown}`.' if shown is not None else ''} |")
        out += ["| argument or option | what |", "| --- | --- |", *rows]
    return "\n".join(out) + "\n"
