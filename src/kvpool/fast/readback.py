"""The fast state read back as the spec's state value: every observable of the arrays
(ref counts, the free queue, every key of every block, the watchers, the event counter), for
``abstract()`` comparisons and invariant checks. O(N + keys); never on a hot path.
"""

from __future__ import annotations

import numpy as np

from kvpool.fast import kernels as k
from kvpool.fast.state import FastState
from kvpool.spec.state import NULL_BLOCK_ID, PoolState


def _key_of_entry(st: FastState, e: int) -> bytes:
    kid = int(st.ent[e, k.E_KEY])
    return st.key_bytes[kid, : int(st.keys[kid, k.K_LEN])].tobytes()


def queue(st: FastState) -> list[int]:
    """The free queue, front first."""
    count = st.kernels.queue_order(st.blk, st.out)
    return st.out[:count].tolist()


def block_keys(st: FastState) -> dict[int, list[bytes]]:
    """Each keyed block's keys, primary first, then secondaries in insertion order."""
    first = k._decoded_links(st.blk)[2][: st.num_blocks].tolist()
    bnext = st.ent[:, k.E_BNEXT].tolist()
    out: dict[int, list[bytes]] = {}
    for b, e in enumerate(first):
        while e != -1:
            out.setdefault(b, []).append(_key_of_entry(st, e))
            e = bnext[e]
    return out


def key_chains(st: FastState) -> dict[bytes, tuple[int, ...]]:
    """Each key's blocks, earliest inserted first."""
    heads = st.keys[: int(st.meta[k.M_KEY_HIGH]), k.K_HEAD].tolist()
    knext = st.ent[:, k.E_KNEXT].tolist()
    owner = st.ent[:, k.E_BLOCK].tolist()
    out: dict[bytes, tuple[int, ...]] = {}
    for kid, e in enumerate(heads):
        chain = []
        while e >= 0:
            chain.append(owner[e])
            e = knext[e]
        if chain:
            length = int(st.keys[kid, k.K_LEN])
            out[st.key_bytes[kid, :length].tobytes()] = tuple(chain)
    return out


def watchers(st: FastState) -> tuple[int, ...]:
    """Watched blocks in watcher-table (stamp) order."""
    stamps = st.blk64[: st.num_blocks, k.WATCH]
    watched = np.nonzero(stamps)[0]
    return tuple(watched[np.argsort(stamps[watched], kind="stable")].tolist())


def pool_state(st: FastState, hash_block_size: int) -> PoolState:
    """Everything observable, as the spec's state value (O(N + keys); for comparisons)."""
    n = st.num_blocks
    keys = block_keys(st)
    primary: list[bytes | None] = [None] * n
    tokens: list[int | None] = [None] * n
    units = st.blk64[:n, k.TOKENS].tolist()
    for b, its_keys in keys.items():
        primary[b] = its_keys[0]
        tokens[b] = units[b] * hash_block_size
    ref = st.blk[:n, k.REF].tolist()
    ref[NULL_BLOCK_ID] = 0  # not maintained for the null block
    return PoolState(
        num_blocks=n,
        enable_caching=st.enable_caching,
        hash_block_size=hash_block_size,
        enable_events=st.enable_events,
        ref_cnt=tuple(ref),
        free_queue=tuple(queue(st)),
        primary_key=tuple(primary),
        primary_tokens=tuple(tokens),
        secondary_keys={b: tuple(ks[1:]) for b, ks in keys.items() if len(ks) > 1},
        cache=key_chains(st),
        watchers=watchers(st),
        event_count=st.meta.item(k.M_EVENT_COUNT),
    )
