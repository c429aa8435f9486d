"""Every refusal forktool can raise names where and what to do next: a static check over forktool/."""

from __future__ import annotations

import ast
from pathlib import Path

from forktool import errors

ROOT = Path(errors.__file__).parent
ERRORS = {name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, errors.ForktoolError)}
# the parsers' own refusals: load_yaml/load_json (and the callers that parse directly) give them the next step
# of the file they read (schemas.fix), which the parser cannot know
HINT_FROM_CALLER = {("schema.py", "_parse_yaml"), ("schema.py", "measure"), ("schema.py", "parse_json")}


def _missing() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                kws = {k.arg for k in node.keywords}
                if name not in ERRORS or None in kws:  # **kwargs: passed on from a caller
                    continue
                where = "where" in kws or len(node.args) >= 2
                hint = "hint" in kws or len(node.args) >= 3
                rel = str(path.relative_to(ROOT))
                if not (where and hint) and (rel, fn.name) not in HINT_FROM_CALLER:
                    out.append(f"{rel}:{node.lineno} ({fn.name}): {'no where' if not where else 'no hint'}")
    return sorted(set(out))


def test_every_error_forktool_raises_names_where_and_what_to_do() -> None:
    # `forktool new 'x y'` had no where, `forktool gates 0099` no next step, and 46 other refusals lacked one of the
    # two; a new one without both fails here
    assert _missing() == []
