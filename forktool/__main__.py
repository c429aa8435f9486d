"""Entry point for `python -m forktool`."""

from forktool.cli import main

raise SystemExit(main())
