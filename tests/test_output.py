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
