"""Where a make run stands, read from make's own output as it streams: no dry run, no CMake internal files."""

from __future__ import annotations

import re

OBJECT_RE = re.compile(r"Building (?:C|CXX|CUDA|ASM) object (\S+)")
# CMake's Makefile generator starts each of its lines with the position of the goal being made ("[ 45%] ...")
_POSITION_RE = re.compile(r"^\[\s*(\d{1,3})%\]")
_BUILT_RE = re.compile(r"Built target (\S+)")


class MakeProgress:
    """The position of `make GOAL...` in a CMake Makefile build tree, from the lines make prints.

    CMake's top-level Makefile makes the goals one after another, in the order given (it is .NOTPARALLEL), and
    each goal's lines count from 0 to 100 % of that goal's own steps: a rule skipped because it is up to date
    counts as done. A goal is finished when make says `Built target GOAL` while that goal is the one being made
    (a goal built earlier as another's dependency still gets its own run, which says so at once). The whole
    run's position weighs each goal equally: make says nothing of how long a goal will take.
    """

    def __init__(self, goals: list[str]) -> None:
        self.goals = list(goals)
        self.finished = 0  # goals made so far
        self.percent = 0  # make's position in the goal being made
        self.objects: list[str] = []  # the objects make has started to compile, in its order

    def feed(self, line: str) -> str | None:
        """Take one line of make's output; the object it starts to compile, if it is such a line."""
        m = _POSITION_RE.match(line)
        if m and self.finished < len(self.goals):
            # with -j, two rules started together may print their positions in either order: never go back
            self.percent = max(self.percent, min(int(m.group(1)), 100))
        built = _BUILT_RE.search(line)
        if built and self.finished < len(self.goals) and built.group(1) == self.goals[self.finished]:
            self.finished += 1
            self.percent = 0
        obj = OBJECT_RE.search(line)
        if obj is None:
            return None
        self.objects.append(obj.group(1))
        return obj.group(1)

    @property
    def goal(self) -> str:
        """The goal being made ('' once all are)."""
        return self.goals[self.finished] if self.finished < len(self.goals) else ""

    @property
    def overall(self) -> int:
        """The whole run's position, 0 to 100."""
        if not self.goals:
            return 0
        return min(100, (100 * self.finished + self.percent) // len(self.goals))
