"""Gate programs for the fork's patches, run as modules: `python -m gates.cpu`, `python -m gates.gpu`, ...

Each gate prints one JSON object on stdout and a summary on stderr, and exits 0 on pass, 1 on fail.
"""
