"""Entry point for `python -m forktool`."""

from forktool.cli import entry

entry()
