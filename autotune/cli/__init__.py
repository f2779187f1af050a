"""The command line: ``main`` parses, runs one command and prints (``entry``: the
``autotune`` program around it); one module per command group (``info``, ``tune``,
``ship``, ``results``, ``long``), options they share in ``common``."""

from autotune.cli.main import build_parser, entry, main

__all__ = ["build_parser", "entry", "main"]
