"""The differential machine over the real backends, through the pytest entry point.

``make_differential_test`` returns a TestCase per configuration. Budgets are base example
counts scaled by the ``KVPOOL_HYPOTHESIS_PROFILE`` profile (50 steps per example in ci).
"""

from __future__ import annotations

import pytest

from kvpool.errors import BackendUnavailable
from kvpool.harness import make_differential_test, resolve_backend

from .budget import budget


def _available(name: str) -> bool:
    try:
        resolve_backend(name)
    except (BackendUnavailable, AttributeError):
        return False
    return True


# -- the spec on its own: every invariant after every step, rejections change nothing ---------

TestSpecKeepsEveryInvariant = make_differential_test(
    ["spec"], settings=budget(60), name="SpecKeepsEveryInvariant")
TestSpecWithoutCachingKeepsEveryInvariant = make_differential_test(
    ["spec"], enable_caching=False, num_blocks=8, settings=budget(15),
    name="SpecWithoutCaching")
TestTwoSpecPoolsAgree = make_differential_test(
    ["spec", "spec"], settings=budget(15), name="TwoSpecPoolsAgree")

# -- the reference against the spec, over several pool shapes ----------------------------------

TestReferenceAgreesWithSpec = make_differential_test(
    ["spec", "reference"], settings=budget(150), name="ReferenceAgreesWithSpec")
# Pool shapes of three seconds and more on two shared cores: ``long`` (run by ``.ci/run``).
_long = pytest.mark.long

TestReferenceAgreesOnATinyPoolWithCoarseBlocks = _long(make_differential_test(
    ["spec", "reference"], num_blocks=8, block_size=6, settings=budget(100),
    name="ReferenceTinyCoarse"))
TestReferenceAgreesOnFineBlocksWithoutEvents = make_differential_test(
    ["spec", "reference"], num_blocks=32, hash_block_size=1, block_size=1,
    enable_kv_cache_events=False, settings=budget(60), name="ReferenceFine")
TestReferenceAgreesWithCachingDisabled = make_differential_test(
    ["spec", "reference"], num_blocks=12, enable_caching=False, settings=budget(60),
    name="ReferenceNoCaching")
TestReferenceAgreesAcrossThreeGroups = make_differential_test(
    ["spec", "reference"], num_blocks=24, num_groups=3, settings=budget(60),
    name="ReferenceThreeGroups")

TestReferenceAgreesWithLookaheadAndRawHashEvents = make_differential_test(
    ["spec", "reference"], settings=budget(30), name="ReferenceLookahead",
    extra_options={"num_hash_lookahead_tokens": 2, "use_int_block_hashes": False,
                   "medium": "CPU"})

# -- the fast path (Numba) against the spec, when it is built ----------------------------------

_needs_fast = pytest.mark.skipif(not _available("fast"), reason="fast backend not available")

TestFastAgreesWithSpec = _needs_fast(make_differential_test(
    ["spec", "fast"], settings=budget(200), name="FastAgreesWithSpec"))
TestFastAgreesOnFineBlocks = _long(_needs_fast(make_differential_test(
    ["spec", "fast"], num_blocks=32, hash_block_size=1, block_size=1, settings=budget(80),
    name="FastFine")))
TestFastAgreesWithCachingDisabled = _needs_fast(make_differential_test(
    ["spec", "fast"], num_blocks=12, enable_caching=False, settings=budget(40),
    name="FastNoCaching"))
