"""The command line: flag-only commands give the same results with and without typer; --version."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from forktool import cli, output
from tests.helpers.project import Proj


def capture(root: Path, fn, args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    os.environ["FORKTOOL_ROOT"] = str(root)
    console = output._err
    output._err = output.Console(file=io.StringIO(), highlight=False, soft_wrap=True, width=200)
    try:
        with contextlib.redirect_stdout(out):
            code = fn(args)
    finally:
        output._err = console
        output.set_json(False)
        os.environ.pop("FORKTOOL_ROOT", None)
    return code, out.getvalue()


READ_ONLY = [["build", "--plan", "--json"], ["build", "--profile", "cpu", "--plan", "-j", "2", "--json"],
             ["refresh", "0070", "--json"],
             ["status", "--json"], ["verify", "--json"], ["verify", "--no-cache", "--json"], ["markers", "--json"],
             ["registry", "check", "--json"], ["vendor", "status", "--json"], ["backup", "list", "--json"]]
MOVES = [["apply", "--upto", "0070", "--reanchor", "--json"], ["apply", "--upto=0070", "--force", "--json"],
         ["unapply", "--json"], ["unapply", "--to", "0070", "--force", "--json"], ["apply", "--upto", "9999", "--json"]]


def strip_volatile(d: dict) -> dict:
    d.pop("cached", None)
    if "backup" in d:
        d["backup"] = bool(d["backup"])  # named by the second it was taken
    return d


def test_plain_commands_are_all_in_the_typer_app():
    import typer.main

    from forktool.cli_app import app
    group = typer.main.get_command(app)
    for words, flags, valued, positional, _ in cli.PLAIN:
        cmd = group
        for w in words:
            cmd = cmd.commands[w]  # type: ignore[attr-defined]
        names = {o for p in cmd.params for o in p.opts}
        assert flags | valued <= names, (words, (flags | valued) - names)
        arguments = [p for p in cmd.params if p.param_type_name == "argument"]
        assert len(arguments) == len(positional), words


def test_read_only_commands_agree_with_the_typer_app(rp: Proj):  # noqa: F811
    rp.run("apply")
    rp.run("refresh", "0070")  # canonical already, so a refresh below changes nothing
    rp.run("backup", "create", "one")
    for args in READ_ONLY:
        fast_code, fast_out = capture(rp.root, cli._fast, args)
        typer_code, typer_out = capture(rp.root, cli._main_typer, args)
        fast, slow = json.loads(fast_out), json.loads(typer_out)
        fast.pop("cached", None), slow.pop("cached", None)
        assert (fast_code, fast) == (typer_code, slow), args


@pytest.mark.parametrize("args", MOVES)
def test_tree_moves_agree_with_the_typer_app(rp: Proj, args: list[str]):  # noqa: F811
    rp.run("apply")
    start = rp.state_digest()
    fast_code, fast_out = capture(rp.root, cli._fast, args)
    after_fast = rp.state_digest()
    capture(rp.root, cli._main_typer, ["apply", "--json"] if args[0] == "unapply" else ["apply", "--force", "--json"])
    if args[0] == "apply":
        capture(rp.root, cli._main_typer, ["unapply", "--json"])
        capture(rp.root, cli._main_typer, ["apply", "--json"])
    assert rp.state_digest() == start
    typer_code, typer_out = capture(rp.root, cli._main_typer, args)
    assert rp.state_digest() == after_fast
    assert (fast_code, strip_volatile(json.loads(fast_out))) == (typer_code, strip_volatile(json.loads(typer_out)))


def test_other_command_lines_go_to_typer(rp: Proj, capsys: pytest.CaptureFixture[str]):  # noqa: F811
    assert cli._fast(["status", "--help"]) is None
    assert cli._fast(["status", "--json", "--json"]) is None
    assert cli._fast(["apply", "--upto"]) is None  # a missing value: typer's usage error
    assert cli._fast(["apply", "--upto", "--json"]) is None
    assert cli._fast(["refresh"]) is None  # the ID is missing
    assert cli._fast(["build", "-j", "two"]) is None
    assert cli._fast(["new", "slug"]) is None
    rp.run("status", "--bogus", expect=2)  # usage errors keep exit code 2, from typer
    assert "No such option: --bogus" in capsys.readouterr().err


def test_version_names_the_tool_and_the_applied_series(rp: Proj):  # noqa: F811
    from forktool import __version__
    code, out = capture(rp.root, cli.main, ["--version"])
    assert code == 0 and out.splitlines()[0] == f"forktool {__version__}"
    assert out.splitlines()[1].endswith("+pristine")
    rp.run("apply")
    code, out = capture(rp.root, cli.main, ["--version"])
    stamp = out.splitlines()[1].split(": ")[1]
    assert "+0070." in stamp and code == 0
    code, typer_out = capture(rp.root, cli._main_typer, ["--version"])
    assert typer_out == out
