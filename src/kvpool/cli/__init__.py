"""The ``kvpool`` command line: thin subcommands over library functions.

Each subcommand lives in its own module exposing ``register(subparsers)`` (adds its parser and
sets ``func``) and a ``run(args) -> int`` exit status. Exit codes: 0 success, 1 a check found a
problem (divergence, counterexample, failed target), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from kvpool.errors import KvPoolError

EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for ``yes | head``: the reader left early."""

SUBCOMMANDS = ("simulate", "explain", "check", "contracts", "bench", "subscribe")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpool",
        description="KV-cache block pool: simulate, verify and benchmark.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"kvpool.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kvpool.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KvPoolError as exc:
        # Bad input a subcommand did not anticipate: one line, never a traceback.
        print(f"kvpool {args.command}: {exc}", file=sys.stderr)
        return 2
    except (MemoryError, RecursionError) as exc:
        print(f"kvpool {args.command}: input too large ({type(exc).__name__})", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (``kvpool bench --json | head``): no traceback, and nothing
        # more to write; point stdout at devnull so the interpreter's final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
