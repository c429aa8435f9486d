"""The command line: one declaration read by the fast parser and by the typer app alike; --version."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from forktool import cli, cli_app, cli_spec, output
from tests.helpers.cli import run_cli
from tests.helpers.project import REPO, Proj


def capture(root: Path, fn, args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    os.environ["FORKTOOL_ROOT"] = str(root)
    try:
        with contextlib.redirect_stdout(out), output.capture(io.StringIO()):
            code = fn(args)
    finally:
        os.environ.pop("FORKTOOL_ROOT", None)
    return code, out.getvalue()


# lines the fast parser reads: typer must read each to the very same call (command and every value)
PLAIN = [["status"], ["status", "--json"], ["verify", "--no-cache", "--json"], ["verify"],
         ["apply", "--upto", "0070", "--reanchor", "--json"], ["apply", "--upto=0070", "--force"], ["apply", "--upto", ""],
         ["unapply", "--to", "0070", "--force", "--json"], ["unapply"], ["refresh", "0070", "--json"], ["refresh", ""],
         ["build", "--plan", "--json"], ["build", "--profile", "cpu", "--plan", "-j", "2", "--json"],
         ["build", "--jobs=3"], ["markers", "--json"], ["registry", "check", "--json"], ["registry", "render", "--check"],
         ["vendor", "status", "--json"], ["vendor", "fetch", "--sdist", "x.tar.gz"], ["backup", "list", "--json"],
         ["backup", "create"], ["backup", "create", "slug", "--json"], ["backup", "restore", "name"],
         ["backup", "prune", "--keep", "0"], ["backup", "prune"], ["new", "slug", "--title", "T", "--id", "0090"],
         ["new", "slug", "--author", "a <a@a>"], ["gates"], ["gates", "0072", "--gate", "boot"], ["gates", "--list"],
         ["sync", "--to", "x==1", "--start"], ["sync", "--continue"], ["sync", "--skip", "--json"],
         ["sync", "--abort"], ["sync", "--build", "--accept", "--out", "o"], ["sync", "--no-build"],
         ["package"], ["package", "--profile", "cuda", "--out", "d", "--json"], ["package", "verify", "d", "--json"]]

# lines the fast parser leaves to typer (help, usage errors, spellings only click reads)
TO_TYPER = [["status", "--help"], ["status", "--json", "--json"], ["apply", "--upto"], ["apply", "--upto", "--json"],
            ["refresh"], ["build", "-j", "two"], ["build", "-j2"], ["build", "-j", "-3"], ["new"], ["status", "extra"],
            ["frobnicate"], ["apply", "--colour"], ["backup", "prune", "--keep", "x"], ["--json"], [],
            ["package", "--profile", "cuda", "verify", "d"], ["gates", "1", "2"], ["status", "--"], ["--version", "status"]]


@pytest.mark.parametrize("args", PLAIN, ids=" ".join)
def test_the_fast_parser_and_typer_read_a_line_alike(args: list[str]) -> None:
    fast = cli_spec.parse(args)
    assert fast is not None, args
    assert cli_app.parse(args) == fast
    assert set(fast.opts) == {p.dest for p in fast.command.params}  # every value filled in


def test_lines_the_fast_parser_does_not_read_go_to_typer(capsys: pytest.CaptureFixture[str]) -> None:
    for args in TO_TYPER:
        assert cli_spec.parse(args) is None, args
    assert cli_app.parse(["package", "--profile", "cuda", "verify", "d"]) == cli_spec.parse(["package", "verify", "d"])
    assert cli_app.parse(["build", "-j2"]) == cli_spec.parse(["build", "-j", "2"])
    assert cli_app.parse(["--version", "status"]) is None  # --version, however placed
    assert cli_app.parse(["status", "--bogus"]) == 2
    assert "No such option: --bogus" in capsys.readouterr().err
    assert cli_app.parse(["status", "--help"]) == 0
    assert "Show the series" in capsys.readouterr().out


def test_every_declared_command_is_in_the_typer_app() -> None:
    import typer.main

    group = typer.main.get_command(cli_app.build_app())
    for c in cli_spec.COMMANDS:
        cmd = group
        for w in c.words:
            cmd = cmd.commands[w]  # type: ignore[attr-defined]
        names = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        declared = {n for p in c.params for n in (*p.names, *((p.off,) if p.off else ()))}
        assert declared <= names, (c.words, declared - names)
        assert cmd.help == c.help


def test_quick_exit_is_decided_by_the_declaration_alone() -> None:
    quick = {c.words for c in cli_spec.COMMANDS if c.quick}
    assert quick == {("status",), ("verify",), ("apply",), ("unapply",), ("refresh",)}
    assert cli_spec.find(["apply", "--help"]).quick  # type: ignore[union-attr]
    assert cli_spec.find(["package", "verify", "x"]).words == ("package", "verify")  # type: ignore[union-attr]
    assert cli_spec.find(["frobnicate"]) is None


def test_a_line_runs_the_same_through_either_parser(rp: Proj) -> None:  # noqa: F811
    rp.run("apply")
    for args in (["status", "--json"], ["verify", "--json"], ["build", "--plan", "-j", "2", "--json"]):
        fast = capture(rp.root, lambda a: cli.run(cli_spec.parse(a)), args)  # type: ignore[arg-type]
        slow = capture(rp.root, lambda a: cli.run(cli_app.parse(a)), args)  # type: ignore[arg-type]
        f, s = json.loads(fast[1]), json.loads(slow[1])
        f.pop("cached", None), s.pop("cached", None)
        assert (fast[0], f) == (slow[0], s), args


def test_version_names_the_tool_and_the_applied_series(rp: Proj):  # noqa: F811
    from forktool import __version__
    code, out = capture(rp.root, cli.main, ["--version"])
    assert code == 0 and out.splitlines()[0] == f"forktool {__version__}"
    assert out.splitlines()[1].endswith("+pristine")
    rp.run("apply")
    code, out = capture(rp.root, cli.main, ["--version"])
    stamp = out.splitlines()[1].split(": ")[1]
    assert "+0070." in stamp and code == 0
    code, typer_out = capture(rp.root, cli.main, ["--version", "status"])  # through typer's eager option
    assert typer_out == out


def test_a_title_or_author_that_is_not_utf8_is_a_usage_error_and_utf8_in_a_c_locale_is_kept(rp: Proj) -> None:
    # argv bytes that are not UTF-8 reach Python as lone surrogates; writing them into the patch header was an
    # internal error (exit 3) after the workspace was opened
    series = (rp.root / "patches" / "series").read_bytes()
    for opt in ("--title", "--author"):
        code, out, err = rp.run("new", "x", opt, os.fsdecode(b"t\xffx <a@b>"), expect=2)
        assert f"{opt} is not UTF-8 text (byte 0xff)" in err and "internal error" not in err
    assert (rp.root / "patches" / "series").read_bytes() == series
    # UTF-8 bytes decoded by an ASCII locale (LC_ALL=C with PYTHONUTF8=0) arrive as surrogates too: read as UTF-8
    title = "t\u00eftle \u20ac"
    as_ascii_locale = title.encode().decode("ascii", "surrogateescape")
    pid = rp.json("new", "x", "--title", as_ascii_locale)["id"]
    patch = next((rp.root / "patches").glob(f"{pid}-x.patch")).read_bytes()
    assert f"Subject: [PATCH] {title}\n".encode() in patch


def test_the_manual_lists_every_command_and_option_as_declared_and_as_help_shows_them(tmp_path: Path):
    page = (REPO / "docs" / "manual-cli.md").read_text()
    begin = page.index("<!-- begin: generated")
    section = page[page.index("\n", begin) + 1:page.index("<!-- end: generated -->")]
    assert section == cli_spec.reference(), "docs/manual-cli.md is stale: run scripts/cli-reference.py"
    for c in cli_spec.COMMANDS:
        assert f"### `forktool {' '.join(c.words)}" in section
        code, out, err = run_cli(tmp_path, [*c.words, "--help"])
        assert code == 0, (c.words, err)
        for p in c.params:
            for name in (*p.names, *((p.off,) if p.off else ())):
                assert name in out + err, (c.words, name)


def _spoil_build_yaml(p: Proj) -> None:
    path = p.root / "registry" / "build.yaml"
    path.write_text(path.read_text() + "stamped: [nosuch]\n")


@pytest.mark.parametrize("argv, spoil, code, what, where, hint", [
    (["gates", "0099"], None, 2, "no patch 0099 in the registry", "registry/UPSTREAM_SYNC.yaml",
     "`forktool gates --list` shows the gates of every patch"),
    (["new", "x y"], None, 2, "bad slug 'x y'", "SLUG", "use lowercase letters"),
    (["backup", "prune", "--keep", "-1"], None, 2, "must be zero or more", "--keep", "--keep 5"),
    (["build", "--plan"], _spoil_build_yaml, 1, "unknown artifact 'nosuch'", "links/stamped",
     "fix that name in registry/build.yaml; `forktool build --plan` re-checks it"),
])
def test_a_refusal_names_where_and_what_to_do(rp: Proj, argv, spoil, code, what, where, hint) -> None:
    # these said what was wrong but not where (`new 'x y'`) or not what to do next (`gates 0099`, the build.yaml
    # cross-checks); every refusal now has both, and changes nothing
    if spoil is not None:
        spoil(rp)
    before = rp.digest()
    _, out, err = rp.run(*argv, expect=code)
    lines = err.splitlines()
    assert what in err and hint in err, err
    assert any(ln.startswith("  where: ") and ln.endswith(where) for ln in lines), err
    assert any(ln.startswith("  next: ") for ln in lines), err
    assert rp.digest() == before


@pytest.mark.parametrize("argv, command", [(["apply", "--upto"], "apply"),
                                           (["backup", "prune", "--keep"], "backup prune")])
def test_an_option_without_its_value_says_where_help_is(proj: Proj, argv, command) -> None:
    # click says "Option '--upto' requires an argument." and, having no context there, nothing else: the line
    # now points at the command's help as click's other usage errors do
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "forktool", *argv], capture_output=True, text=True,
                       env=dict(os.environ, FORKTOOL_ROOT=str(proj.root)))
    assert r.returncode == 2 and f"Option '{argv[-1]}' requires an argument." in r.stderr, r.stderr
    assert f"forktool {command} --help' for help." in r.stderr.splitlines()[-1], r.stderr  # 'python -m forktool ...'
