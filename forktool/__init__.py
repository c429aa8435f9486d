"""forktool: keep a soft fork of llama.cpp alive as a numbered patch series."""

__version__ = "0.1.0"
