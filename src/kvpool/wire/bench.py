"""How fast the wire is, and what publishing costs the pool (``benchmarks/bench_wire.py``).

Two measurements, each the median of ``repeat`` interleaved rounds:

* **Publisher throughput.** The batches a replay of the chat trace publishes are recorded
  once, then handed to a fresh :class:`EventPublisher` as fast as ``publish`` returns; the
  clock stops when the publisher thread has sent the last one. Reported as events/s and
  batches/s, beside the encoder alone (no sockets, one thread). Where vLLM is importable (run
  under a kit's python), vLLM's ``ZmqEventPublisher`` and encoder get the same batches, as
  vLLM's own event objects, in the same rounds, and each kvpool figure gets its ratio.
* **Pool-time overhead.** The same replay, ``pool_s`` of: events off; events on, taken and
  discarded; events on and published (no subscriber; PUB drops at once); events on and
  published to a subscriber in another process. Publishing's overhead is the published
  ``pool_s`` minus the discarded one (the publisher thread competes for the GIL), plus the
  time ``publish`` itself takes on the pool's thread (``publish_s``).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from kvpool.wire.encoding import BatchEncoder
from kvpool.wire.publisher import EventPublisher, PublisherConfig
from kvpool.workload.simulate import simulate, warm_up


def record_batches(num_requests: int, backend: str = "fast") -> list[list[Any]]:
    batches: list[list[Any]] = []
    simulate(backend=backend, num_requests=num_requests, warmup=False,
             event_sink=batches.append)
    return batches


def _kvpool_publish(batches: list[list[Any]], endpoint: str) -> float:
    config = PublisherConfig(endpoint, max_queue_size=len(batches) + 1,
                             buffer_steps=len(batches) + 1)
    with EventPublisher(config) as publisher:
        began = time.perf_counter()
        for events in batches:
            publisher.publish(events)
        publisher.flush(60.0)
        elapsed = time.perf_counter() - began
        assert publisher.stats().queue_full == 0
    return elapsed


def _kvpool_encode(batches: list[list[Any]]) -> float:
    encoder = BatchEncoder()
    began = time.perf_counter()
    for i, events in enumerate(batches):
        encoder.encode(events, float(i), 0)
    return time.perf_counter() - began


def _vllm_side(batches: list[list[Any]]) -> tuple[Callable[[], float], Callable[[], float]] | None:
    """vLLM's publisher and encoder over the same batches, or ``None`` without vLLM."""
    try:
        import msgspec
        from vllm.distributed import kv_events
    except ImportError:
        return None

    def as_vllm(events: list[Any]) -> list[Any]:
        out = []
        for e in events:
            fields = asdict(e)
            fields.pop("seq")
            out.append(getattr(kv_events, type(e).__name__)(**fields))
        return out

    converted = [as_vllm(events) for events in batches]

    def publish() -> float:
        publisher = kv_events.ZmqEventPublisher(
            0, endpoint="tcp://127.0.0.1:55771", buffer_steps=len(batches) + 1,
            max_queue_size=len(batches) + 1)
        began = time.perf_counter()
        for i, events in enumerate(converted):
            publisher.publish(kv_events.KVEventBatch(ts=float(i), events=events))
        publisher._event_queue.join()  # task_done() follows each send
        elapsed = time.perf_counter() - began
        publisher.shutdown()
        return elapsed

    def encode() -> float:
        encoder = msgspec.msgpack.Encoder()
        began = time.perf_counter()
        for i, events in enumerate(converted):
            encoder.encode(kv_events.KVEventBatch(ts=float(i), events=events,
                                                  data_parallel_rank=0))
        return time.perf_counter() - began

    return publish, encode


def _pool_s(num_requests: int, backend: str, mode: str, endpoint: str) -> dict[str, float]:
    if mode == "events_off":
        return {"pool_s": simulate(backend=backend, num_requests=num_requests,
                                   warmup=False).pool_s}
    if mode == "events_discarded":
        report = simulate(backend=backend, num_requests=num_requests, warmup=False,
                          event_sink=lambda events: None)
        return {"pool_s": report.pool_s}
    spent = [0.0]
    with EventPublisher(PublisherConfig(endpoint)) as publisher:
        def sink(events: list[Any]) -> None:
            began = time.perf_counter()
            publisher.publish(events)
            spent[0] += time.perf_counter() - began

        report = simulate(backend=backend, num_requests=num_requests, warmup=False,
                          event_sink=sink)
        publisher.flush(60.0)
        stats = publisher.stats()
    return {"pool_s": report.pool_s, "publish_s": spent[0], "publisher_thread_s": stats.send_s,
            "queue_full": float(stats.queue_full)}


def run_wire_bench(*, num_requests: int = 2000, backend: str = "fast", repeat: int = 5,
                   port: int = 55761) -> dict[str, Any]:
    """Both measurements (module docstring); one JSON-ready dict of medians."""
    warm_up(backend)
    batches = record_batches(num_requests, backend)
    n_events = sum(len(b) for b in batches)
    vllm = _vllm_side(batches)
    rounds: dict[str, list[float]] = {}
    pub_ep, sub_ep = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
    subscriber = subprocess.Popen(
        [sys.executable, "-m", "kvpool", "subscribe", sub_ep, "--no-replay", "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(repeat):
            rounds.setdefault("publish_s", []).append(_kvpool_publish(batches, pub_ep))
            rounds.setdefault("encode_s", []).append(_kvpool_encode(batches))
            if vllm is not None:
                rounds.setdefault("vllm_publish_s", []).append(vllm[0]())
                rounds.setdefault("vllm_encode_s", []).append(vllm[1]())
            for mode, endpoint in (("events_off", ""), ("events_discarded", ""),
                                   ("published", pub_ep), ("published_subscribed", sub_ep)):
                for name, value in _pool_s(num_requests, backend, mode, endpoint).items():
                    rounds.setdefault(f"{mode}_{name}", []).append(value)
    finally:
        subscriber.terminate()
        subscriber.wait(10)
    med = {name: statistics.median(values) for name, values in rounds.items()}
    result: dict[str, Any] = {
        "backend": backend, "requests": num_requests, "repeat": repeat,
        "batches": len(batches), "events": n_events,
        "publisher_events_per_s": n_events / med["publish_s"],
        "publisher_batches_per_s": len(batches) / med["publish_s"],
        "encoder_events_per_s": n_events / med["encode_s"],
        "medians": med,
    }
    if vllm is not None:
        result["vllm_publisher_events_per_s"] = n_events / med["vllm_publish_s"]
        result["vllm_encoder_events_per_s"] = n_events / med["vllm_encode_s"]
        result["publisher_vs_vllm"] = med["vllm_publish_s"] / med["publish_s"]
        result["encoder_vs_vllm"] = med["vllm_encode_s"] / med["encode_s"]
    base = med["events_discarded_pool_s"]
    for mode in ("published", "published_subscribed"):
        extra = med[f"{mode}_pool_s"] - base + med[f"{mode}_publish_s"]
        result[f"{mode}_overhead_s"] = extra
        result[f"{mode}_overhead_pct_of_pool_s"] = 100 * extra / base
        result[f"{mode}_us_per_batch_on_pool_thread"] = 1e6 * extra / len(batches)
    result["events_cost_pct_of_pool_s"] = 100 * (base - med["events_off_pool_s"]) / \
        med["events_off_pool_s"]
    return result


__all__ = ["record_batches", "run_wire_bench"]
