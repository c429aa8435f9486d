"""The exit-code contract in real processes: Ctrl-C is 130 with one line, unwritable stdout, a closed stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import corpus
from tests.helpers.project import Proj

FAST, TYPER = ["--json"], ["--json", "--json"]  # a repeated flag is a line only the typer app reads


@pytest.fixture
def series(proj: Proj) -> Proj:
    for name, text in corpus.SERIES.items():
        proj.write_patch(name, text)
    proj.run("apply")
    return proj


def _env(p: Proj) -> dict[str, str]:
    return dict(os.environ, FORKTOOL_ROOT=str(p.root))


def _shell(p: Proj, line: str) -> subprocess.CompletedProcess:
    """`python -m forktool` with the redirections of a shell line; $? of the forktool process is on the last line."""
    script = f"{sys.executable} -m forktool {line}; echo \"rc=$?\" >&3"
    r = subprocess.run(["bash", "-c", f"exec 3>&1; {script}"], env=_env(p), capture_output=True, text=True)
    return r


def _rc(r: subprocess.CompletedProcess) -> int:
    return int(r.stdout.strip().splitlines()[-1].removeprefix("rc="))


def _interrupt_at(p: Proj, moments: list[str], argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", corpus.INTERRUPTER, ",".join(moments), *argv], env=_env(p),
                          capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------- Ctrl-C


@pytest.mark.parametrize("moment,argv", [
    ("import:typing", ["status"]),  # imported by the first modules after the handler, never before it
    ("import:forktool.cli_spec", ["status"]),  # the first import after the handler
    ("import:forktool.output", ["verify", "--json"]),
    ("import:typer", ["status", "--json", "--json"]),  # the typer app loading
    ("import:forktool.commands.tree_cmds", ["unapply"]),
    ("open:.opencoti/lock", ["unapply", "--force", "--force"]),  # typer dispatch, inside the command
    ("open:.opencoti/txn/new/0", ["unapply", "--json"]),  # the journal of a tree move being written
])
def test_ctrl_c_is_130_with_one_line_at_any_moment(series: Proj, moment: str, argv: list[str]) -> None:
    r = _interrupt_at(series, [moment], argv)
    assert r.returncode == 130, r.stderr
    assert r.stderr.endswith("error: interrupted\n") and r.stderr.count("interrupted") == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    series.run("status")  # whatever the interrupted move left, the next command finishes or undoes it
    series.run("apply")
    series.run("verify")


def test_ctrl_c_from_outside_while_a_command_waits(series: Proj) -> None:
    """A real Ctrl-C sent by another process while forktool waits for a gate's command; twice, the second one
    while the first unwinds: still 130, still one line."""
    import yaml

    reg = corpus.registry_doc()
    reg["patches"][0]["gates"][0]["command"] = ["sleep", "30"]
    (series.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    for presses in (1, 2):
        p = subprocess.Popen([sys.executable, "-m", "forktool", "gates", "0070"], env=_env(series),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not _children(p.pid) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.02)
        children = _children(p.pid)
        assert children, f"the gate command never started: {p.communicate()}"
        for _ in range(presses):
            p.send_signal(signal.SIGINT)
            time.sleep(0.05)
        out, err = p.communicate(timeout=60)
        left = [c for c in children if _alive(c)]
        for c in left:  # never leave one behind here, whatever the assertion below says
            os.kill(c, signal.SIGKILL)
        assert p.returncode == 130, err
        assert err.count("interrupted") == 1 and "Traceback" not in err, err
        assert left == [], f"the gate's process outlived forktool's Ctrl-C: {presses} {children} {out} {err}"


@pytest.mark.parametrize("stderr", ["full", "broken pipe"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_while_a_command_waits_ends_by_it_whatever_stderr_is(series: Proj, sig: int, stderr: str) -> None:
    """The last line before dying by SIGTERM or SIGHUP goes to a stderr that may be full or have no reader: forktool
    still dies by the signal and stops the gate's processes, never exit 1 "no space left" or exit 3."""
    import yaml

    reg = corpus.registry_doc()
    reg["patches"][0]["gates"][0]["command"] = ["sleep", "30"]
    (series.root / "registry" / "UPSTREAM_SYNC.yaml").write_text(yaml.safe_dump(reg, sort_keys=False))
    if stderr == "full":
        err = os.open("/dev/full", os.O_WRONLY)
    else:
        r, err = os.pipe()
        os.close(r)
    try:  # --json: nothing is written to stderr before the signal, so the handler's line is the first write there
        p = subprocess.Popen([sys.executable, "-m", "forktool", "gates", "0070", "--json"], env=_env(series),
                             stdout=subprocess.PIPE, stderr=err, text=True)
    finally:
        os.close(err)
    deadline = time.monotonic() + 60
    while not _children(p.pid) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    children = _children(p.pid)
    assert children, f"the gate command never started: {p.communicate()}"
    p.send_signal(sig)
    out, _ = p.communicate(timeout=60)
    left = [c for c in children if _alive(c)]
    for c in left:
        os.kill(c, signal.SIGKILL)
    assert (p.returncode, out, left) == (-sig, "", [])


def _alive(pid: int) -> bool:
    """pid is a running process (not gone, not a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def test_a_second_ctrl_c_ends_the_clean_up_at_once() -> None:
    code = ("import os, signal, time\n"
            "from forktool.cli import _Interrupt\n"
            "signal.signal(signal.SIGINT, _Interrupt())\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(5)\n"
            "except KeyboardInterrupt:\n"
            "    os.kill(os.getpid(), signal.SIGINT)  # during the clean-up\n"
            "    time.sleep(5)\n"
            "print('the clean-up ran on')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (130, "", "error: interrupted\n")
    # once the command is over (the process is leaving), a Ctrl-C still ends it with 130 and its line
    late = ("import os, signal, time\n"
            "from forktool.cli import _Interrupt\n"
            "handler = _Interrupt()\n"
            "handler.finished = True\n"
            "signal.signal(signal.SIGINT, handler)\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "time.sleep(5)\n"
            "print('exited 0 after a Ctrl-C')\n")
    r = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (130, "", "error: interrupted\n")


# ---------------------------------------------------------------- stdout that cannot be written


@pytest.mark.parametrize("dispatch", [FAST, TYPER], ids=["fast", "typer"])
@pytest.mark.parametrize("redirect,reason", [(">&-", "stdout is closed"), ("> /dev/full", "No space left")])
def test_unwritable_stdout_is_exit_1_with_one_line(series: Proj, dispatch: list[str], redirect: str,
                                                   reason: str) -> None:
    before = series.state_digest()
    r = _shell(series, f"status {' '.join(dispatch)} {redirect}")
    assert _rc(r) == 1
    assert r.stderr == f"error: cannot write the output to stdout: {reason}" + r.stderr.split(reason, 1)[1]
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert series.state_digest() == before


@pytest.mark.parametrize("dispatch", [FAST, TYPER], ids=["fast", "typer"])
def test_a_move_whose_output_is_lost_says_it_ran(series: Proj, dispatch: list[str]) -> None:
    series.run("unapply")
    r = _shell(series, f"apply {' '.join(dispatch)} >&-")
    assert _rc(r) == 1
    assert "cannot write the output to stdout" in r.stderr and "`forktool apply` itself ran to its end" in r.stderr
    assert [p["state"] for p in series.json("status")["patches"]] == ["applied"] * 3  # it did move the tree
    series.run("verify")


@pytest.mark.parametrize("dispatch", [FAST, TYPER], ids=["fast", "typer"])
def test_a_closed_pipe_ends_as_git_does(series: Proj, dispatch: list[str]) -> None:
    r, w = os.pipe()
    os.close(r)  # the reader has gone, as after `| head -c 0`
    try:
        p = subprocess.run([sys.executable, "-m", "forktool", "verify", *dispatch], env=_env(series), stdout=w,
                           stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)
    assert p.returncode == -signal.SIGPIPE and p.stderr == ""  # a shell shows 141; nothing said
    r2 = _shell(series, f"status {' '.join(dispatch)} | head -c 1")
    assert r2.stdout.startswith("{") and "Traceback" not in r2.stderr


def test_help_and_version_into_unwritable_stdout(series: Proj) -> None:
    for args in ("--help", "--version", "status --help"):
        r = _shell(series, f"{args} > /dev/full")
        assert _rc(r) == 1 and r.stderr.startswith("error: cannot write the output to stdout"), (args, r.stderr)


def test_a_failed_command_keeps_its_code_when_its_output_is_lost(series: Proj) -> None:
    r = _shell(series, "apply --upto 9999 --json >&-")
    assert _rc(r) == 2 and "9999" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- stderr that cannot be written


@pytest.mark.parametrize("redirect", ["2>&-", "2>/dev/full"])
@pytest.mark.parametrize("dispatch", [FAST, TYPER], ids=["fast", "typer"])
def test_stderr_never_changes_the_exit_code(series: Proj, redirect: str, dispatch: list[str]) -> None:
    r = _shell(series, f"verify {redirect}")
    assert _rc(r) == 0
    r = _shell(series, f"verify {' '.join(dispatch)} {redirect}")
    assert _rc(r) == 0 and json.loads(r.stdout.rsplit("rc=", 1)[0])["problems"] == []
    series.edit("up/src/b.c", "line 3\n", "mine\n")
    r = _shell(series, f"verify {' '.join(dispatch)} {redirect}")
    assert _rc(r) == 1
    series.edit("up/src/b.c", "mine\n", "line 3\n")


def test_an_abort_whose_output_is_lost_still_says_it_ran(tmp_path: Path, cache: Path) -> None:
    from tests.helpers.cli import run_cli

    root = corpus.stopped_sync(tmp_path / "s")
    r = subprocess.run(["bash", "-c", f"{sys.executable} -m forktool sync --abort --json > /dev/full"],
                       env=dict(os.environ, FORKTOOL_ROOT=str(root)), capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "cannot write the output to stdout: No space left" in r.stderr
    assert "`forktool sync` itself ran to its end" in r.stderr
    code, out, err = run_cli(root, ["sync", "--abort"], expect=None)
    assert code == 1 and "no sync in progress" in err  # the first abort, whose output was lost, did it
    run_cli(root, ["status"])


def test_all_three_standard_descriptors_closed(series: Proj) -> None:
    """No file forktool opens may take descriptor 0, 1 or 2: the tree stays right and the codes follow the contract."""
    assert _rc(_shell(series, "status <&- >&- 2>&-")) == 0  # the human report goes to stderr: nothing was lost
    assert _rc(_shell(series, "unapply --json <&- >&- 2>&-")) == 1  # moved; its JSON could not be written
    assert _rc(_shell(series, "apply <&- >&- 2>&-")) == 0
    series.run("verify")
    assert b"error" not in (series.tree / "up" / "src" / "a.c").read_bytes()
