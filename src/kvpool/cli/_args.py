"""Argument types shared by the subcommands (argparse turns their errors into exit 2)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An int > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value
