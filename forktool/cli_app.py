"""The typer app: every command's options and help, each a call into forktool.commands."""

from __future__ import annotations

from typing import Annotated

import typer

from forktool.cli import run as _run

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Keep a soft fork of llama.cpp alive as a numbered patch series.")
vendor_app = typer.Typer(no_args_is_help=True, help="The pinned upstream.")
backup_app = typer.Typer(no_args_is_help=True, help="Vendor backups under .opencoti/vendor-backups/.")
registry_app = typer.Typer(no_args_is_help=True, help="The UPSTREAM_SYNC registry.")
app.add_typer(vendor_app, name="vendor")
app.add_typer(backup_app, name="backup")
app.add_typer(registry_app, name="registry")

def _version(flag: bool) -> None:
    if flag:
        from forktool.cli import version_text

        typer.echo(version_text())
        raise typer.Exit(0)


@app.callback()
def root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                               help="Print the tool version and the stamp of the applied series, "
                                                    "then exit.")] = False) -> None:
    """Keep a soft fork of llama.cpp alive as a numbered patch series."""


Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
Force = Annotated[bool, typer.Option("--force", help="Back up local edits in the vendored tree, then overwrite them.")]


# ---------------------------------------------------------------- the tree


@vendor_app.command("fetch")
def vendor_fetch(sdist: Annotated[str | None, typer.Option(help="Use this local sdist file instead of pip "
                                                            "(its sha256 is still checked).")] = None,
                 json: Json = False) -> None:
    """Download the pinned upstream with pip, check its sha256, fill the pristine cache, materialise the tree."""
    from forktool.commands import tree_cmds
    _run(json, lambda p: tree_cmds.vendor_fetch(p, sdist))


@vendor_app.command("status")
def vendor_status(json: Json = False) -> None:
    """Show the pin, the lock and the pristine cache's health."""
    from forktool.commands import tree_cmds
    _run(json, tree_cmds.vendor_status)


@app.command()
def apply(upto: Annotated[str | None, typer.Option(help="Stop after this patch id (e.g. 0072).")] = None,
          force: Force = False,
          reanchor: Annotated[bool, typer.Option("--reanchor", help="Rewrite patches that now apply at an offset or "
                                                 "over changed blobs into canonical form (same changes).")] = False,
          json: Json = False) -> None:
    """Apply the series (exact context, atomic, writing only changed files)."""
    from forktool.commands import tree_cmds
    _run(json, lambda p: tree_cmds.apply(p, upto, force, reanchor))


@app.command()
def unapply(to: Annotated[str | None, typer.Option(help="Keep patches up to and including this id.")] = None,
            force: Force = False, json: Json = False) -> None:
    """Remove applied patches from the top (all of them without --to)."""
    from forktool.commands import tree_cmds
    _run(json, lambda p: tree_cmds.unapply(p, to, force))


@app.command()
def status(json: Json = False) -> None:
    """Show the series (applied, drift, files) and the tree state."""
    from forktool.commands import tree_cmds
    _run(json, tree_cmds.status)


@app.command()
def verify(no_cache: Annotated[bool, typer.Option("--no-cache", help="Prove everything from scratch: no stat index, "
                                                  "no cached re-exports, scopes or verdict.")] = False,
           json: Json = False) -> None:
    """Prove the tree: pristine cache = lock, patches re-export byte for byte, tree digest = lock, registry.

    Every difference is listed in one report; --json carries tree_digest and problems[] pass or fail."""
    from forktool.commands import tree_cmds
    _run(json, lambda p: tree_cmds.verify(p, not no_cache))


@app.command()
def refresh(patch_id: Annotated[str, typer.Argument(metavar="ID", help="An applied patch.")],
            json: Json = False) -> None:
    """Rewrite one applied patch from the current tree (below the top: the patches above are re-applied on it)."""
    from forktool.commands import tree_cmds
    _run(json, lambda p: tree_cmds.refresh(p, patch_id))


@app.command()
def new(slug: Annotated[str, typer.Argument(help="Lowercase slug, e.g. kv-window-sizer.")],
        title: Annotated[str, typer.Option(help="Patch title (Subject).")] = "",
        author: Annotated[str, typer.Option(help="From: line.")] = "opencoti <fork@opencoti.invalid>",
        patch_id: Annotated[str | None, typer.Option("--id", help="Use this four-digit id (must be free).")] = None,
        json: Json = False) -> None:
    """Insert an empty patch after the current top and register it in the series."""
    from forktool.commands import tree_cmds
    _run(json, lambda p: tree_cmds.new(p, slug, title or slug, author, patch_id))


# ---------------------------------------------------------------- backups


@backup_app.command("create")
def backup_create(slug: Annotated[str, typer.Argument(help="Name part after the timestamp.")] = "manual",
                  json: Json = False) -> None:
    """Back up the vendored tree (only files that differ from pristine are stored)."""
    from forktool.commands import backup_cmds
    _run(json, lambda p: backup_cmds.create(p, slug))


@backup_app.command("list")
def backup_list(json: Json = False) -> None:
    """List backups, oldest first."""
    from forktool.commands import backup_cmds
    _run(json, backup_cmds.list_)


@backup_app.command("restore")
def backup_restore(name: Annotated[str, typer.Argument(help="Backup directory name.")], json: Json = False) -> None:
    """Verify a backup's checksums and return the tree to it, byte for byte."""
    from forktool.commands import backup_cmds
    _run(json, lambda p: backup_cmds.restore(p, name))


@backup_app.command("prune")
def backup_prune(keep: Annotated[int, typer.Option(help="How many of the newest to keep.")] = 10,
                 json: Json = False) -> None:
    """Delete all but the newest N backups."""
    from forktool.commands import backup_cmds
    _run(json, lambda p: backup_cmds.prune(p, keep))


# ---------------------------------------------------------------- build, package, gates, sync


@app.command()
def build(profile: Annotated[str | None, typer.Option(
              help="Build profile from registry/build.yaml (cpu, cuda); default cpu.")] = None,
          plan: Annotated[bool, typer.Option("--plan", help="Only show what would be rebuilt and why.")] = False,
          check: Annotated[bool, typer.Option(
              "--check", help="Only compile the translation units the series' files feed, and record it.")] = False,
          every: Annotated[bool, typer.Option("--all", help="With --check: every profile.")] = False,
          jobs: Annotated[int | None, typer.Option("-j", "--jobs", help="make -jN (default: CPU count).")] = None,
          json: Json = False) -> None:
    """Configure once, then make only the targets the applied patches impact; check the rest kept its bytes."""
    from forktool.commands import build_cmds
    _run(json, lambda p: build_cmds.dispatch(p, profile, plan, check, every, jobs))


package_app = typer.Typer(invoke_without_command=True, help="Deterministic release directory and archive.")
app.add_typer(package_app, name="package")


@package_app.callback()
def package(ctx: typer.Context,
            profile: Annotated[str, typer.Option(help="Build profile whose outputs are packaged.")] = "cpu",
            out: Annotated[str | None, typer.Option(help="Output directory (default dist/).")] = None,
            json: Json = False) -> None:
    """Package the built binaries, manifest, SHA256SUMS, release notes and the patched source archive."""
    if ctx.invoked_subcommand is not None:
        return
    from forktool.commands import package_cmds
    _run(json, lambda p: package_cmds.package(p, profile, out))


@package_app.command("verify")
def package_verify(directory: Annotated[str, typer.Argument(help="A release directory made by `forktool package`.")],
                   json: Json = False) -> None:
    """Re-check a release's sums and manifest; fails on any tampering."""
    from forktool.commands import package_cmds
    _run(json, lambda p: package_cmds.verify(p, directory))


@app.command()
def gates(patch_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="Only this patch's gates.")] = None,
          gate: Annotated[str | None, typer.Option(help="Only the gate with this name.")] = None,
          list_only: Annotated[bool, typer.Option("--list", help="List the gates and what they need.")] = False,
          json: Json = False) -> None:
    """Run the gates the registry records (those needing a GPU are skipped, with the reason, elsewhere)."""
    from forktool.commands import gates_cmds
    _run(json, lambda p: gates_cmds.gates(p, patch_id, gate, list_only))


@app.command()
def sync(to: Annotated[str | None, typer.Option("--to", help="Another upstream, e.g. llama-cpp-python==0.3.35.")] = None,
         accept: Annotated[bool, typer.Option("--accept", help="Move the pin and the patches to SPEC when clean.")] = False,
         build_flag: Annotated[bool, typer.Option("--build/--no-build", help="cpu build of the applied result.")] = False,
         out: Annotated[str, typer.Option(help="Directory for the report and refreshed patches.")] = "dist/sync",
         start: Annotated[bool, typer.Option("--start", help="Move the fork to SPEC: back up, materialise it, "
                                             "apply the series in order, stop at the first conflict.")] = False,
         cont: Annotated[bool, typer.Option("--continue", help="Take the resolved tree for the stopped patch "
                                            "and go on.")] = False,
         skip: Annotated[bool, typer.Option("--skip", help="Drop the stopped patch (the series comments it "
                                            "out) and go on.")] = False,
         abort: Annotated[bool, typer.Option("--abort", help="Put pin, lock, patches, series and tree back as "
                                             "before --start.")] = False,
         json: Json = False) -> None:
    """Trial the whole series on another upstream (report + refreshed patches), or move the fork there
    (--start, then --continue / --skip / --abort)."""
    from forktool.commands import sync_cmds
    actions = [name for name, on in (("start", start), ("continue", cont), ("skip", skip), ("abort", abort)) if on]
    _run(json, lambda p: sync_cmds.dispatch(p, to, accept, build_flag, out, actions))


@app.command()
def markers(json: Json = False) -> None:
    """List every opencoti-hook marker in the vendored tree as file:line:hook."""
    from forktool.commands import registry_cmds
    _run(json, registry_cmds.markers)


@registry_app.command("check")
def registry_check(json: Json = False) -> None:
    """Registry, series and tree agree both ways (hooks, sites, files, build impact)."""
    from forktool.commands import registry_cmds
    _run(json, registry_cmds.check)


@registry_app.command("render")
def registry_render(check_only: Annotated[bool, typer.Option("--check", help="Fail if UPSTREAM_SYNC.md is stale.")] = False,
                    json: Json = False) -> None:
    """Render registry/UPSTREAM_SYNC.md from the YAML (jinja2)."""
    from forktool.commands import registry_cmds
    _run(json, lambda p: registry_cmds.render(p, check_only))
