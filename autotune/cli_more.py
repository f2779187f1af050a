"""Commands of the study pipeline: study, export, plot, bench, validate, kernels."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    return None
