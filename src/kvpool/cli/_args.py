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


def block_count(text: str) -> int:
    """A pool size: an int >= 2 (block 0 is the null block, so one block holds nothing)."""
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"must be at least 2 (block 0 is the null block), got {text}"
        )
    return value


def pool_fits(option: str, backends: list[str], num_blocks: int, copies: int = 1) -> str | None:
    """Why ``copies`` pools of ``num_blocks`` blocks per backend do not fit in memory (the
    message names ``option``), or ``None``; unknown backends are left to the command."""
    from kvpool.backends import BACKENDS, backend_class
    from kvpool.errors import KvPoolError
    from kvpool.memory import check_pool_fits

    for name in backends:
        if name not in BACKENDS:
            continue
        try:
            per_block = backend_class(name).bytes_per_block
            check_pool_fits(name, num_blocks * copies, per_block)
        except KvPoolError as exc:
            return f"{option} {num_blocks}: {exc}"
    return None
