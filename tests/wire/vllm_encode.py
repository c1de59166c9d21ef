"""Encode kvpool events with vLLM's own structs and encoder (run under a vLLM kit's python).

Reads a pickled list of ``(events as dicts, ts, data_parallel_rank)`` on stdin, where each
event dict has its kvpool class name under ``"type"``; writes the pickled list of payloads
vLLM produces, exactly as its ZMQ publisher encodes a batch. Needs only vLLM importable;
kvpool is not imported here, so the bytes are vLLM's alone.
"""

from __future__ import annotations

import pickle
import sys

import msgspec
from vllm.distributed import kv_events


def main() -> None:
    jobs = pickle.load(sys.stdin.buffer)
    encoder = msgspec.msgpack.Encoder()
    payloads = []
    for events, ts, rank in jobs:
        built = []
        for fields in events:
            fields = dict(fields)
            cls = getattr(kv_events, fields.pop("type"))
            fields.pop("seq", None)
            built.append(cls(**fields))
        batch = kv_events.KVEventBatch(ts=ts, events=built, data_parallel_rank=rank)
        payloads.append(encoder.encode(batch))
    pickle.dump(payloads, sys.stdout.buffer)


if __name__ == "__main__":
    main()
