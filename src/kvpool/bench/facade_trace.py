"""The facade trace benchmark: the kit's trace replayed through a KV cache manager.

Every facade — vLLM's own ``KVCacheManager`` and kvpool's on each backend — is driven by
the same small scheduler over the same trace (the vLLM kit's ``gen_trace.make_trace``):
FCFS admission (``get_computed_blocks`` then ``allocate_slots`` for the whole prompt) while
fewer than ``max_running`` run, then one decode token per running request
(``allocate_slots(request, 1)``), ``free`` when done; a request whose decode step does not
fit is preempted (freed, back to the front of the queue).

Only facade calls are timed — ``perf_counter`` summed around each — so hashing and
scheduling cost nothing: both request types read the same precomputed block hashes. The CPU
figure is that wall time times the replay's own CPU/wall ratio (each clock read twice per
replay), as in the scheduler benchmark (:mod:`kvpool.vllm.scheduler_run`): the CPU clock is a
system call (~0.6 µs a read here), and reading it around each of ~140k calls added ~0.6 µs
to every call on both sides, squeezing the ratio toward 1 (full attention read 3.2x so,
against 3.8x). Rounds are interleaved (round-major, facade-minor) and figures
are medians; each kvpool figure comes with its ratio to vLLM measured in the same run
(``vllm_s / kvpool_s``, "times faster"). The replays' decisions (blocks allocated, hit
tokens, preemptions) must be identical, or the run fails.

Models: ``full`` — one full-attention group (bs 16); ``full+swa`` — full attention plus a
sliding-window group (bs 16, window 512): the hybrid coordinator's fixed point.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

BLOCK = 16
MODELS = ("full", "full+swa")


def _specs(model: str) -> list[tuple[str, dict[str, Any]]]:
    full = ("full", {"block_size": BLOCK})
    if model == "full":
        return [full]
    return [full, ("swa", {"block_size": BLOCK, "sliding_window": 512})]


def precompute_hashes(trace: list[tuple[list[int], list[int]]]) -> list[list[bytes]]:
    """A chained digest per full 16-token block of prompt + output (bench-only keys)."""
    out = []
    for prompt, decode in trace:
        tokens = prompt + decode
        parent = b"kvpool-facade-bench"
        hashes = []
        for i in range(len(tokens) // BLOCK):
            chunk = tokens[i * BLOCK:(i + 1) * BLOCK]
            parent = hashlib.sha256(parent + repr(chunk).encode()).digest()
            hashes.append(parent)
        out.append(hashes)
    return out


def _hasher(hashes: list[bytes]) -> Callable[[Any], list[bytes]]:
    def block_hasher(request: Any) -> list[bytes]:
        return hashes[len(request.block_hashes):request.num_tokens // BLOCK]
    return block_hasher


# -- facades ------------------------------------------------------------------------------

def kvpool_facade(backend: str, model: str, num_blocks: int, max_model_len: int) -> Any:
    from kvpool.policy import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
        make_kv_cache_manager,
    )

    kinds = {"full": FullAttentionSpec, "swa": SlidingWindowSpec}
    groups = tuple(KVCacheGroupSpec(kinds[k](**kw)) for k, kw in _specs(model))
    # The policy a user gets: the fast policy on the fast backend, the generic one otherwise.
    return make_kv_cache_manager(KVCacheConfig(num_blocks, groups), max_model_len, BLOCK,
                                 BLOCK, backend=backend)


def vllm_facade(model: str, num_blocks: int, max_model_len: int) -> Any:
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    kinds = {"full": FullAttentionSpec, "swa": SlidingWindowSpec}
    groups = [KVCacheGroupSpec([f"l{i}"], kinds[k](num_kv_heads=8, head_size=128,
                                                   dtype=torch.float16, **kw))
              for i, (k, kw) in enumerate(_specs(model))]
    return KVCacheManager(KVCacheConfig(num_blocks, [], groups), max_model_len, BLOCK, BLOCK)


def _kvpool_request(rid: str, prompt: list[int], hashes: list[bytes]) -> Any:
    from kvpool.policy import SchedulerRequest

    return SchedulerRequest(rid, prompt, block_hasher=_hasher(hashes))


def _vllm_request(rid: str, prompt: list[int], hashes: list[bytes]) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return Request(rid, prompt, SamplingParams(max_tokens=1 << 20), None,
                   block_hasher=_hasher(hashes))


def _set_status(request: Any, running: bool) -> None:
    status = type(request.status)
    request.status = status.RUNNING if running else status.PREEMPTED


# -- the replay ---------------------------------------------------------------------------

def replay(manager: Any, make_request: Callable[..., Any],
           trace: list[tuple[list[int], list[int]]], hashes: list[list[bytes]],
           max_running: int = 64) -> dict[str, float]:
    """One replay; facade time (wall, CPU) and the decisions."""
    pc = time.perf_counter
    wall = 0.0
    began_cpu, began_wall = time.thread_time(), pc()
    waiting = list(range(len(trace)))[::-1]  # a stack: pop() is the next arrival
    requests: dict[int, Any] = {}
    running: list[int] = []
    generated: dict[int, int] = {}
    allocated = hit_tokens = preemptions = calls = 0
    while waiting or running:
        while waiting and len(running) < max_running:
            i = waiting[-1]
            req = requests.get(i)
            if req is None:
                req = requests[i] = make_request(str(i), trace[i][0], hashes[i])
            w = pc()
            # vLLM 0.33 adds a third value (a shared-prefix boundary): the first two are
            # the hit blocks and tokens in every version.
            hits, n = manager.get_computed_blocks(req)[:2]
            new = manager.allocate_slots(req, req.num_tokens - n, n, hits)
            wall += pc() - w
            calls += 2
            if new is None:
                if not running:
                    raise ValueError(f"request {i} can never fit {manager!r}")
                break
            waiting.pop()
            allocated += sum(len(g) for g in new.blocks)
            hit_tokens += n
            req.num_computed_tokens = req.num_tokens
            _set_status(req, True)
            if i not in generated:
                generated[i] = 0
            req.append_output_token_ids(trace[i][1][generated[i]])
            generated[i] += 1
            running.append(i)
        still = []
        for i in running:
            req = requests[i]
            done = generated[i] >= len(trace[i][1])
            w = pc()
            new = None if done else manager.allocate_slots(req, 1)
            if done or new is None:  # finished, or preempted: it does not fit this step
                manager.free(req)
            wall += pc() - w
            calls += 1 if done else 2 if new is None else 1
            if done:
                continue
            if new is None:
                preemptions += 1
                req.num_computed_tokens = 0
                req.num_preemptions += 1
                _set_status(req, False)
                waiting.append(i)
                continue
            allocated += sum(len(g) for g in new.blocks)
            req.num_computed_tokens += 1
            req.append_output_token_ids(trace[i][1][generated[i]])
            generated[i] += 1
            still.append(i)
        running = still
    cpu_per_wall = (time.thread_time() - began_cpu) / (pc() - began_wall)
    return {"wall_s": wall, "cpu_s": wall * cpu_per_wall, "blocks_allocated": allocated,
            "hit_tokens": hit_tokens, "preemptions": preemptions, "calls": calls}


def run(models: tuple[str, ...] = MODELS, backends: tuple[str, ...] = ("reference", "fast"),
        num_requests: int = 300, repeat: int = 3, num_blocks: int = 4096,
        kit_dir: str | None = None, with_vllm: bool = True,
        log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Medians per (model, facade) and ratios to vLLM; see the module docstring.
    ``kit_dir``: the vLLM kit (its ``gen_trace`` makes the trace), by default
    :func:`kvpool.bench.vs_vllm.default_kit`; :class:`FileNotFoundError` without one."""
    from kvpool.bench.vs_vllm import default_kit
    from kvpool.workload.simulate import warm_up_manager

    kit = kit_dir or default_kit()
    if kit is None or not os.path.exists(os.path.join(kit, "gen_trace.py")):
        raise FileNotFoundError(f"no vLLM kit with gen_trace.py at {kit!r}: set "
                                "KVPOOL_VLLM_KIT or pass kit_dir")
    sys.path.insert(0, kit)
    import gen_trace

    trace, _ = gen_trace.make_trace(num_requests=num_requests)
    hashes = precompute_hashes(trace)
    max_model_len = max(len(p) + len(d) for p, d in trace) + BLOCK
    facades: list[tuple[str, Callable[..., Any], Callable[..., Any]]] = []
    if with_vllm:
        facades.append(("vllm", lambda m, n=num_blocks: vllm_facade(m, n, max_model_len),
                        _vllm_request))
    for b in backends:
        facades.append((b, lambda m, n=num_blocks, b=b: kvpool_facade(b, m, n, max_model_len),
                        _kvpool_request))
    result: dict[str, Any] = {"requests": num_requests, "num_blocks": num_blocks,
                              "repeat": repeat, "models": {}}
    for model in models:
        # Warm-up, not timed: a short prefix of the trace on a small pool, so that eviction
        # and preemption paths run too, and kvpool's own start-up warm-up, as an engine runs
        # it (Numba compiles, or loads, every kernel the model's calls use here; the
        # trace's prefix alone leaves a sliding window's run lookup to the first round).
        warm_blocks = 2 * (max_model_len // BLOCK + 2)
        for name, build, make in facades:
            if name != "vllm":
                warm_up_manager(name, model=model)
            replay(build(model, warm_blocks), make, trace[:24], hashes[:24])
        samples: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in facades}
        for r in range(repeat):
            for name, build, make in facades:
                samples[name].append(replay(build(model), make, trace, hashes))
                log(f"{model} round {r + 1} {name}: {samples[name][-1]['wall_s']:.3f} s")
        figures = {}
        decisions = None
        for name, runs in samples.items():
            made = {k: runs[0][k] for k in ("blocks_allocated", "hit_tokens", "preemptions")}
            if decisions is None:
                decisions = made
            elif made != decisions:
                raise AssertionError(f"{model}: {name} decided {made}, expected {decisions}")
            figures[name] = {"wall_s": statistics.median(x["wall_s"] for x in runs),
                             "cpu_s": statistics.median(x["cpu_s"] for x in runs),
                             "calls": runs[0]["calls"], **made}
        if with_vllm:
            for name, fig in figures.items():
                if name != "vllm":
                    fig["vs_vllm_wall"] = figures["vllm"]["wall_s"] / fig["wall_s"]
                    fig["vs_vllm_cpu"] = figures["vllm"]["cpu_s"] / fig["cpu_s"]
        result["models"][model] = figures
    return result


__all__ = ["MODELS", "kvpool_facade", "precompute_hashes", "replay", "run", "vllm_facade"]
