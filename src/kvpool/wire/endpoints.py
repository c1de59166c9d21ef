"""ZeroMQ endpoints of the KV event wire: validation, rank offsets, the replay address.

Each data-parallel rank of an engine publishes on its own endpoint, derived from the configured
one as vLLM does it: a TCP port grows by the rank (port 0, "let the OS pick", is left alone),
an ``inproc://`` name gets ``_dp<rank>`` appended. kvpool also offsets ``ipc://`` paths the
same way (vLLM rejects them for ranks above 0). When no replay endpoint is given, kvpool
derives one: the TCP port plus :data:`REPLAY_PORT_OFFSET` (5557 → 6557, clear of the PUB
ports of the next 999 ranks, which the next port would collide with), or the name with
``-replay`` appended.

Frames (vLLM 0.33): the PUB socket sends ``(topic, seq, payload)`` with ``seq`` an 8-byte
big-endian batch number counted from 0 by each publisher. A replay request on the ROUTER socket
is ``(b"", start seq as 8 bytes big-endian)`` from a DEALER; the answer is one
``(b"", topic, seq, payload)`` per buffered batch with ``seq >= start``, then the end marker
``(b"", b"", END_SEQ, b"")``.
"""

from __future__ import annotations

import re

from kvpool.errors import KvPoolError

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame that ends a replay answer (``0xff`` × 8)."""

SEQ_BYTES = 8

REPLAY_PORT_OFFSET = 1000
"""Default replay port = PUB port + this (see the module docstring)."""

_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]+\]|[^:/\[\]]+):(?P<port>\d+)$")


class EndpointError(KvPoolError, ValueError):
    """An endpoint is not a ``tcp://host:port``, ``ipc://path`` or ``inproc://name`` address."""


class EndpointUnavailable(KvPoolError, OSError):
    """An endpoint could not be bound (already in use, no permission, no such directory)."""


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` itself if it is a usable ZeroMQ address; :class:`EndpointError` if not."""
    if not isinstance(endpoint, str):
        raise EndpointError(f"endpoint must be a string, got {type(endpoint).__name__}")
    if endpoint.startswith(("ipc://", "inproc://")):
        if endpoint.split("://", 1)[1]:
            return endpoint
        raise EndpointError(f"endpoint {endpoint!r} has an empty name")
    match = _TCP.match(endpoint)
    if match is None:
        raise EndpointError(
            f"bad endpoint {endpoint!r}: expected tcp://HOST:PORT, ipc://PATH or inproc://NAME"
        )
    if int(match["port"]) > 65535:
        raise EndpointError(f"bad endpoint {endpoint!r}: port above 65535")
    return endpoint


def _tcp_port(endpoint: str) -> tuple[str, int] | None:
    match = _TCP.match(endpoint)
    if match is None:
        return None
    return endpoint[: match.start("port")], int(match["port"])


def offset_endpoint(endpoint: str, data_parallel_rank: int) -> str:
    """The endpoint rank ``data_parallel_rank`` uses (rank 0: ``endpoint`` unchanged)."""
    check_endpoint(endpoint)
    if data_parallel_rank < 0:
        raise EndpointError(f"data-parallel rank must be >= 0, got {data_parallel_rank}")
    if data_parallel_rank == 0:
        return endpoint
    tcp = _tcp_port(endpoint)
    if tcp is None:
        return f"{endpoint}_dp{data_parallel_rank}"
    base, port = tcp
    if port == 0:
        return endpoint
    if port + data_parallel_rank > 65535:
        raise EndpointError(f"rank {data_parallel_rank} offsets {endpoint!r} past port 65535")
    return f"{base}{port + data_parallel_rank}"


def default_replay_endpoint(endpoint: str) -> str:
    """The replay address kvpool pairs with ``endpoint`` when none is given."""
    check_endpoint(endpoint)
    tcp = _tcp_port(endpoint)
    if tcp is None:
        return f"{endpoint}-replay"
    base, port = tcp
    if port == 0:
        raise EndpointError(f"{endpoint!r} lets the OS pick the port; give the replay endpoint")
    if port + REPLAY_PORT_OFFSET > 65535:
        raise EndpointError(f"{endpoint!r} leaves no port for replay; give the replay endpoint")
    return f"{base}{port + REPLAY_PORT_OFFSET}"


__all__ = [
    "END_SEQ",
    "REPLAY_PORT_OFFSET",
    "SEQ_BYTES",
    "EndpointError",
    "EndpointUnavailable",
    "check_endpoint",
    "default_replay_endpoint",
    "offset_endpoint",
]
