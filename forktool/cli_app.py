"""The typer app, built from cli_spec: help, usage errors and every command line the fast parser leaves."""

from __future__ import annotations

import inspect
import sys
from typing import Annotated, Any

import typer
import typer.main

from forktool.cli_spec import APP_HELP, COMMANDS, GROUPS, REQUIRED, VERSION, Call, Command, Param, find

try:  # typer >= 0.16 vendors its own click
    from typer._click.exceptions import ClickException  # type: ignore[import-not-found]
    from typer._click.utils import _detect_program_name  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException  # type: ignore[assignment]
    from click.utils import _detect_program_name  # type: ignore[no-redef]

_TYPES = {"flag": bool, "str": str, "int": int, "arg": str}


class Picked(Exception):
    """How a command's callback hands the parsed line back: the app parses, cli runs."""

    def __init__(self, call: Call | None) -> None:
        self.call = call  # None: --version


def _annotation(p: Param) -> Any:
    """The parameter as typer reads it: its type (optional when it has no default) and its typer.Option/Argument."""
    kind: Any = _TYPES[p.kind]
    if p.kind != "flag" and p.default is None:
        kind = kind | None
    if p.kind == "arg":
        info: Any = typer.Argument(help=p.help, metavar=p.metavar)
    else:
        names = (f"{p.names[0]}/{p.off}",) if p.off else p.names
        info = typer.Option(*names, help=p.help)
    return Annotated[kind, info]


def _callback(command: Command, with_context: bool = False) -> Any:
    """A function typer reads like a hand-written one: one parameter per Param, raising Picked when called."""
    params = []
    annotations = {}
    if with_context:
        params.append(inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context))
        annotations["ctx"] = typer.Context
    for p in command.params:
        ann = _annotation(p)
        default = inspect.Parameter.empty if p.default is REQUIRED else p.default
        params.append(inspect.Parameter(p.dest, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                        annotation=ann))
        annotations[p.dest] = ann

    def picked(**values: Any) -> None:
        ctx = values.pop("ctx", None)
        if ctx is not None and ctx.invoked_subcommand is not None:
            return  # a group's own options, then one of its commands: that command is the call
        raise Picked(Call(command, values))

    picked.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    picked.__annotations__ = annotations
    picked.__name__ = "_".join(command.words)
    return picked


def _version(flag: bool) -> None:
    if flag:
        raise Picked(None)


def build_app() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, help=APP_HELP)

    def root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                                   help=VERSION.help)] = False) -> None:
        pass

    root.__doc__ = APP_HELP
    app.callback()(root)
    own = {c.words[0]: c for c in COMMANDS if len(c.words) == 1}
    groups: dict[str, typer.Typer] = {}
    for head, help_text in GROUPS.items():
        base = own.get(head)
        groups[head] = typer.Typer(no_args_is_help=base is None, invoke_without_command=base is not None,
                                   help=base.help if base is not None else help_text)
        if base is not None:  # a command of its own, with commands under it (package, package verify)
            groups[head].callback()(_callback(base, with_context=True))
    for c in COMMANDS:
        if len(c.words) == 1 and c.words[0] not in GROUPS:
            app.command(c.words[0], help=c.help)(_callback(c))
        elif len(c.words) == 2:
            groups[c.words[0]].command(c.words[1], help=c.help)(_callback(c))
    for head, group in groups.items():
        app.add_typer(group, name=head)
    return app


def parse(argv: list[str]) -> Call | None | int:
    """The call the line asks for (None: --version), or the exit code once typer has shown help or a usage error.
    Nothing runs here; a write error while showing help propagates as the OSError it is."""
    group = typer.main.get_command(build_app())
    try:
        with group.make_context(_detect_program_name(), list(argv)) as ctx:
            group.invoke(ctx)
    except Picked as p:
        return p.call
    except typer.Exit as e:  # --help, shown
        return int(e.exit_code or 0)
    except ClickException as e:  # usage errors (exit 2), and no arguments at all (help, exit 2)
        e.show(file=sys.stderr)
        if getattr(e, "ctx", None) is None:  # click showed no usage line (`apply --upto` with no value): say where
            command = find(list(argv))
            words = " ".join((_detect_program_name(), *(command.words if command else ())))
            sys.stderr.write(f"Try '{words} --help' for help.\n")
        return e.exit_code
    raise RuntimeError(f"the typer app read {argv!r} without picking a command")  # every callback picks one
