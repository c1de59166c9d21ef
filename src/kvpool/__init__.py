"""kvpool: the KV-cache block pool of an LLM serving engine, provably right and fast.

Start with :func:`make_pool`; the behaviour every backend reproduces is specified in
:mod:`kvpool.spec`.
"""

from kvpool._compat import install_finder
from kvpool.backends import BACKENDS, PoolRecipe, make_pool
from kvpool.errors import *  # noqa: F403 - the error hierarchy is part of the public API
from kvpool.errors import __all__ as _errors
from kvpool.protocol import BlockPool, MetricsCollector
from kvpool.shell import BlockRef, PoolAbstract

__version__ = "0.1.0"

install_finder()  # old module paths keep working, with a DeprecationWarning (kvpool._compat)

__all__ = [
    "BACKENDS",
    "BlockPool",
    "BlockRef",
    "MetricsCollector",
    "PoolAbstract",
    "PoolRecipe",
    "make_pool",
    *_errors,
]
