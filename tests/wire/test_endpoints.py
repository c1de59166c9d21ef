"""Endpoints: validation, data-parallel rank offsets (vLLM's rule), the default replay address."""

from __future__ import annotations

import pytest

from kvpool.errors import KvPoolError
from kvpool.wire.endpoints import (
    END_SEQ,
    EndpointError,
    check_endpoint,
    default_replay_endpoint,
    offset_endpoint,
)


@pytest.mark.parametrize("endpoint, rank, expected", [
    ("tcp://127.0.0.1:5557", 0, "tcp://127.0.0.1:5557"),
    ("tcp://127.0.0.1:5557", 3, "tcp://127.0.0.1:5560"),
    ("tcp://*:5557", 1, "tcp://*:5558"),
    ("tcp://[::1]:5557", 2, "tcp://[::1]:5559"),
    ("tcp://127.0.0.1:0", 4, "tcp://127.0.0.1:0"),  # the OS picks every rank's port
    ("inproc://kv", 2, "inproc://kv_dp2"),
    ("ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1"),
])
def test_each_rank_offsets_the_endpoint(endpoint, rank, expected):
    assert offset_endpoint(endpoint, rank) == expected


@pytest.mark.parametrize("endpoint", ["", "127.0.0.1:5557", "tcp://127.0.0.1", "udp://x:1",
                                      "tcp://host:70000", "inproc://", "tcp://a:b"])
def test_a_malformed_endpoint_is_a_typed_error(endpoint):
    with pytest.raises(EndpointError) as info:
        check_endpoint(endpoint)
    assert isinstance(info.value, KvPoolError) and isinstance(info.value, ValueError)


def test_a_rank_past_the_last_port_or_negative_is_refused():
    with pytest.raises(EndpointError, match="past port 65535"):
        offset_endpoint("tcp://127.0.0.1:65535", 1)
    with pytest.raises(EndpointError, match=">= 0"):
        offset_endpoint("tcp://127.0.0.1:5557", -1)


def test_the_default_replay_endpoint_clears_the_next_ranks_ports():
    assert default_replay_endpoint("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:6557"
    assert default_replay_endpoint("ipc:///tmp/kv") == "ipc:///tmp/kv-replay"
    with pytest.raises(EndpointError, match="give the replay endpoint"):
        default_replay_endpoint("tcp://127.0.0.1:0")


def test_the_end_marker_is_minus_one_as_8_signed_bytes():
    assert END_SEQ == b"\xff" * 8
