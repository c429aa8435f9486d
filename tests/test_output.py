"""The plain output path: lines written without rich read exactly as rich writes them to a non-terminal."""

from __future__ import annotations

import io
import random
import subprocess
import sys

import pytest
from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape as rich_escape

from forktool import output

PIECES = ["[", "]", "\\", "/", "a", "dim", "red", "#f00", "@x", "=", " ", ":", "smile:", "é", "x.cpp", "[/]",
          "[dim]", "[/dim]", "\\[", "[bold red]", "0"]


def _rich(markup: str) -> str:
    buf = io.StringIO()
    Console(file=buf, highlight=False, soft_wrap=True, emoji=False, width=80).print(markup)
    return buf.getvalue()


def _samples(n: int) -> list[str]:
    rnd = random.Random(9)
    return ["".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 12))) for _ in range(n)]


def test_escape_is_riches_escape() -> None:
    texts = _samples(400) + ["a\\", "a\\\\", "\\", "[dim]\\", "x [/x] \\\\[y]"]
    for t in texts:
        assert output._escape(t) == rich_escape(t), t


def test_plain_equals_rich_on_a_non_terminal() -> None:
    checked = 0
    for s in _samples(300) + [output._escape(t) for t in _samples(100)]:
        try:
            want = _rich(s)
        except MarkupError:
            continue  # malformed markup (an unmatched closing tag) is a bug in the caller on either path
        assert output.plain(s) + "\n" == want, s
        checked += 1
    assert checked > 200


def test_control_characters_go_through_rich() -> None:
    assert not output._SIMPLE.fullmatch("a\tb")
    assert not output._SIMPLE.fullmatch("a\x1b[31mb")
    assert output._SIMPLE.fullmatch("verify: OK [dim]é[/dim]")


@pytest.mark.parametrize("force", [None, "1"])
def test_a_process_loads_rich_only_when_a_terminal_is_asked_for(force: str | None, tmp_path) -> None:
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    if force:
        env["FORCE_COLOR"] = force
    code = ("import sys; from forktool import output; output.info('a [b] \\\\[c]'); "
            "output.warn('w'); print('rich' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == ("True" if force else "False")
    assert "a [b] \\[c]" in r.stderr and "w" in r.stderr
    if not force:
        assert r.stderr == "a [b] \\[c]\nwarning: w\n"


def test_a_session_sets_the_mode_and_gives_the_previous_one_back() -> None:
    buf = io.StringIO()
    with output.capture(buf), output.session(True):
        output.info("hidden in --json mode")
        output.warn("shown")
        with output.session(False):
            output.info("shown too")
        output.info("hidden again")
    output.info("after")  # back on the process's stderr, not in buf
    assert buf.getvalue() == "warning: shown\nshown too\n"


def test_stdout_that_cannot_be_written_is_an_output_error_carrying_the_code(monkeypatch) -> None:
    from forktool.errors import OutputError

    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stdout", closed)
    with pytest.raises(OutputError) as e:
        output.write_out("{}\n", exit_code=1)
    assert e.value.exit_code == 1 and "cannot write the output to stdout" in str(e.value)
    with output.capture(io.StringIO()), output.session(True):
        with pytest.raises(OutputError):
            output.emit(output.Report({"a": 1}))
        output.error("the failure itself", {"error": "x"})  # its JSON is lost; the line still goes to stderr
