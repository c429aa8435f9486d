"""Canonical patch form: parse, format, diff generation and the bad inputs the parser must refuse."""

from __future__ import annotations

import subprocess

import pytest

from forktool.errors import ConfigError, PatchFormatError, UnsafePathError
from forktool.series import diff_file, format_patch, parse_patch, read_series
from tests.helpers.patches import make_patch
from tests.helpers.project import git

OLD = "".join(f"line {i}\n" for i in range(1, 21))
NEW = OLD.replace("line 5\n", "line 5\n// opencoti-hook: demo\nadded\n").replace("line 18\n", "")


def test_round_trip_is_byte_identical():
    text = make_patch("0001-demo.patch", {"up/src/b.c": (OLD, NEW)}, hooks="demo")
    p = parse_patch(text.encode(), "0001-demo.patch")
    assert format_patch(p) == text.encode()
    assert p.title == "test patch"
    assert p.trailers()["Opencoti-Hooks"] == "demo"
    assert [h.old_start for h in p.files[0].hunks] == [3, 15]


def test_diff_matches_git_apply(tmp_path):
    """git itself accepts the patch and produces the same new text."""
    text = make_patch("0001-demo.patch", {"f.txt": (OLD, NEW), "new.txt": (None, "hello\n")})
    (tmp_path / "f.txt").write_text(OLD)
    git(tmp_path, "init", "-q")
    (tmp_path / "p.patch").write_text(text)
    subprocess.run(["git", "apply", "--check", "p.patch"], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "p.patch"], cwd=tmp_path, check=True)
    assert (tmp_path / "f.txt").read_text() == NEW
    assert (tmp_path / "new.txt").read_text() == "hello\n"


def test_git_am_accepts_canonical_patch(tmp_path):
    text = make_patch("0001-demo.patch", {"f.txt": (OLD, NEW)})
    (tmp_path / "f.txt").write_text(OLD)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "base")
    (tmp_path / "p.patch").write_text(text)
    git(tmp_path, "am", "-q", "p.patch")
    assert git(tmp_path, "log", "-1", "--format=%s") == "test patch"
    assert (tmp_path / "f.txt").read_text() == NEW


def test_no_newline_at_end_of_file():
    old, new = "a\nb", "a\nc"
    fd = diff_file("x", old.encode(), new.encode())
    assert fd is not None
    text = make_patch("0001-x.patch", {"x": (old, new)})
    assert "\\ No newline at end of file" in text
    assert format_patch(parse_patch(text.encode(), "0001-x.patch")) == text.encode()


def _good() -> str:
    return make_patch("0001-demo.patch", {"up/src/b.c": (OLD, NEW)})


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.replace("\n", "\r\n"), "CRLF"),
    (lambda t: t[: len(t) // 2], "truncated"),
    (lambda t: t.replace("@@ -3,6 +3,8 @@", "@@ -3,6 +3,9 @@"), "header promises"),
    (lambda t: t.replace("From 0000000000000000000000000000000000000000", "From 1234"), "canonical"),
    (lambda t: t.replace("---\ndiff", "diff"), "---"),
    (lambda t: t.replace("a/up/src/b.c b/up/src/b.c", "a/up/src/b.c b/up/src/c.c"), "rename"),
    (lambda t: t.replace("index ", "old mode 100644\nnew mode 100755\nindex ", 1), "mode change"),
    (lambda t: t.replace("--- a/up/src/b.c\n+++ b/up/src/b.c\n@@ -3,6 +3,8 @@",
                         "Binary files a/up/src/b.c and b/up/src/b.c differ\n@@ -3,6 +3,8 @@"), "binary"),
])
def test_bad_patches_are_refused_with_a_place(mutate, message):
    bad = mutate(_good())
    with pytest.raises(PatchFormatError) as e:
        parse_patch(bad.encode(), "0001-demo.patch")
    assert message.lower() in str(e.value).lower()
    assert "patches/0001-demo.patch:" in e.value.where


@pytest.mark.parametrize("path", ["../escape.c", "/etc/passwd", "up/../../x"])
def test_path_traversal_is_refused(path):
    text = _good().replace("up/src/b.c", path)
    with pytest.raises(UnsafePathError):
        parse_patch(text.encode(), "0001-demo.patch")


@pytest.mark.parametrize("line, what, hint", [
    # a line of words is a bad name first (it once read as a name with unsupported options: "-p1 only")
    ("this is not a patch name", "bad patch name 'this' (the line is 'this is not a patch name')", "NNNN-slug.patch"),
    ("0090 x.patch", "bad patch name '0090' (the line is '0090 x.patch')", "NNNN-slug.patch"),
    ("0090-x.patch -p0", "unsupported series option(s) '-p0'", "leave `0090-x.patch` alone on the line"),
    ("0070-again.patch", "duplicate patch id 0070: 0070-again.patch (line 3) and 0070-one.patch (line 2)",
     "remove or comment out one of the two lines"),
])
def test_a_bad_series_line_says_what_is_wrong_and_what_to_do(tmp_path, line, what, hint):
    series = tmp_path / "patches" / "series"
    series.parent.mkdir()
    series.write_text(f"# the series\n0070-one.patch\n{line}\n")
    with pytest.raises(ConfigError) as e:
        read_series(series)
    assert e.value.what == what and hint in e.value.hint
    assert e.value.where == f"{series}:3"


@pytest.mark.parametrize("argv", [["status"], ["apply"], ["unapply"], ["verify"], ["new", "more", "--title", "more"]])
def test_a_series_with_crlf_line_endings_is_refused_and_left_as_it_is(proj, argv):
    # a CRLF series was read as LF and `forktool new` wrote it back with LF; it is refused as a CRLF patch is
    from tests import corpus
    for name, text in corpus.SERIES.items():
        proj.write_patch(name, text)
    proj.run("apply")
    series = proj.root / "patches" / "series"
    series.write_bytes(series.read_bytes().replace(b"\n", b"\r\n"))
    raw, before = series.read_bytes(), proj.state_digest()
    _, out, err = proj.run(*argv, expect=1)
    assert "patches/series contains CR (CRLF line endings)" in err and f"where: {series}:1" in err, err
    assert "next: convert it with `sed -i 's/\\r$//' patches/series`" in err, err
    assert series.read_bytes() == raw and proj.state_digest() == before
