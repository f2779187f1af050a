"""The command line: ``main`` parses, runs one command and prints; one module per
command group (``info``, ``tune``, ``ship``, ``results``, ``long``), options they share
in ``common``."""

from autotune.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
