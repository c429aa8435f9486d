"""Small patch series over tests.helpers.project.UPSTREAM."""

from __future__ import annotations

from tests.helpers.patches import make_patch
from tests.helpers.project import UPSTREAM, Proj

A = UPSTREAM["src/a.c"]
B = UPSTREAM["src/b.c"]
A1 = A.replace("    return 1;\n", "    // opencoti-hook: one\n    return 2;\n")
B1 = B.replace("line 10\n", "line 10\n// opencoti-hook: two\n")
B2 = B1.replace("line 25\n", "line 25\n// opencoti-hook: three\nextra\n")


# 0070 (a.c), 0071 (b.c) and 0089 (b.c again, and a new file), each with its hook: name -> patch text, in order
SERIES = {
    "0070-one.patch": make_patch("0070-one.patch", {"up/src/a.c": (A, A1)}, "one", "one"),
    "0071-two.patch": make_patch("0071-two.patch", {"up/src/b.c": (B, B1)}, "two", "two"),
    "0089-three.patch": make_patch("0089-three.patch", {"up/src/b.c": (B1, B2), "up/src/new.c": (None, "int n;\n")},
                                   "three", "three"),
}


def three_patches(p: Proj) -> None:
    """SERIES written, each added to the series."""
    for name, text in SERIES.items():
        p.write_patch(name, text)


def drifting_patches(p: Proj) -> None:
    """0070 whose hunk header is 3 lines off (it applies with drift), 0071 (b.c and a new file)."""
    one = make_patch("0070-one.patch", {"up/src/a.c": (A, A1)}, "one", "one")
    p.write_patch("0070-one.patch", one.replace("@@ -1,6 +1,7 @@", "@@ -4,6 +4,7 @@"))  # applies at -3: drift
    p.write_patch("0071-two.patch", make_patch("0071-two.patch", {"up/src/b.c": (B, B1),
                                                                   "up/src/new.c": (None, "int n;\n")}, "two", "two"))
