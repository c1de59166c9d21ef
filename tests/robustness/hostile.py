"""Shared helpers of the robustness tests: one pool per backend, hashed requests, planting."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpool import make_pool
from kvpool.fast import FastBlockPool
from kvpool.fast import kernels as k
from kvpool.harness.requests import make_request

BACKENDS = ("spec", "reference", "fast", "fast-nojit")


def pool_of(backend: str, num_blocks: int = 8, **options: Any) -> Any:
    """A pool of ``backend`` (``fast-nojit``: the fast kernels run as plain Python)."""
    options.setdefault("hash_block_size", 2)
    if backend == "fast-nojit":
        return FastBlockPool(num_blocks, jit=False, **options)
    return make_pool(num_blocks, backend=backend, **options)


def request(tokens: Any = (1, 2, 3, 4, 5, 6, 7, 8), name: str = "r") -> Any:
    """A harness request (sha256, fixed seed) hashed at hbs 2."""
    return make_request(list(tokens), hash_block_size=2, request_id=name)


def plant_ref_cnt(pool: Any, block: int, ref: int) -> None:
    """Set a held block's ref count directly (2**31 real touches would take hours)."""
    if pool.backend_name == "spec":
        counts = list(pool.state.ref_cnt)
        counts[block] = ref
        pool.state = dataclasses.replace(pool.state, ref_cnt=tuple(counts))
    elif pool.backend_name == "reference":
        pool.blocks[block].ref_cnt = ref
    else:
        pool._st.blk[block, k.REF] = ref


class Recorder:
    """A metrics collector that logs each call and raises on the ones listed in ``fail``."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.fail = fail

    def _log(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if name in self.fail:
            raise RuntimeError(f"collector refuses {name}{args}")

    def on_block_allocated(self, block_id: int) -> None:
        self._log("on_block_allocated", block_id)

    def on_block_accessed(self, block_id: int) -> None:
        self._log("on_block_accessed", block_id)

    def on_block_evicted(self, block_id: int) -> None:
        self._log("on_block_evicted", block_id)

    def reset(self) -> None:
        self._log("reset")
