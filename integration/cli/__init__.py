"""The ``rayledger`` command line, the demo and the Ray job entry point."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
