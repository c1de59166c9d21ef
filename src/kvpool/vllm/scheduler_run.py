"""vLLM's real ``Scheduler`` on the CPU, driven by a fake model: the conformance and the
benchmark of the drop-in share this driver.

It needs an importable vLLM (the kit venvs of ``../shared/vllm-kit`` with
``tools/vllm_side_deps.sh``) and no GPU: the scheduler is built offline from a local
``config.json`` of a tiny Llama (written to a temporary directory; ``HF_HUB_OFFLINE=1``), a
``KVCacheConfig`` with no tensors, and ``DeviceConfig(device="cpu")``. The fake model runner
answers each ``SchedulerOutput`` as a real one would: a request whose scheduled tokens reach
its end samples its next output token (taken from the workload, so both managers see the
same tokens); a partial prefill chunk samples nothing; with speculative decoding the drafts
proposed for the next step are the true next tokens with a deterministic number of them
corrupted, so some are accepted and some rejected.

:func:`run` replays one :class:`Workload` with vLLM's own manager (``manager="vllm"``) or
kvpool's (``"kvpool"``, through :func:`kvpool.vllm.install`) and returns each step's
decisions (:func:`step_record`) plus, optionally, CPU times: the whole scheduler step
(``schedule`` + ``update_from_output``) and the KV manager's share of it, counted at its
outermost public calls only (a manager method calling another is not counted twice), and
building and adding the requests (vLLM's block hasher hashes each prompt there; with the
drop-in it also packs them, :mod:`kvpool.vllm.hashes`). A
timed run keeps its decisions' digest, not the decisions: a heap that grows with every
step's events makes Python's garbage collector run longer inside whichever side allocates
more, which a serving engine (events sent on, not kept) does not see.

Run as a program (``python -m kvpool.vllm.scheduler_run``) it reads one JSON command per
line on stdin and answers one JSON line each; the conformance tier and ``kvpool bench
--vllm-scheduler`` drive it that way from kvpool's own venv.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvpool.bench.vllm_scheduler import MODELS
from kvpool.vllm.manager_clock import ManagerClock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PYTHONHASHSEED", "0")


_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-5, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
}


@dataclass(frozen=True)
class Setup:
    """The engine: pool size, batch limits, model family, features."""

    num_blocks: int = 20_000
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    model: str = "full"
    sliding_window: int = 1024
    num_speculative_tokens: int = 0
    kv_events: bool = True
    log_stats: bool = True
    hash_block_size: int = 0
    """0: the block size. Smaller (with ``full+mamba``): vLLM 0.33's partial prefix hits."""
    connector: bool = False
    """vLLM's ``ExampleConnector`` (scheduler side; its store is a temporary directory
    where :func:`run` marks every third prompt as held, so those requests get external
    tokens; no worker loads anything)."""
    async_scheduling: bool = False
    """vLLM's ``AsyncScheduler``, driven as its engine core drives it (a batch queue of two:
    step N+1 is scheduled before step N's output comes back, so its requests have tokens in
    flight). Both vLLM versions turn it on by default where the executor allows it."""


@dataclass(frozen=True)
class Workload:
    """Requests (id, prompt, outputs), all arriving at step 0, plus scripted interventions:
    every ``abort_every`` steps one waiting and one running request are aborted
    (``finish_requests``); at each step of ``reset_at`` the prefix cache is reset."""

    name: str
    requests: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    abort_every: int = 0
    reset_at: tuple[int, ...] = ()


def chat_workload(kit: str | None = None, num_requests: int | None = None,
                  **interventions: Any) -> Workload:
    """The vLLM kit's chat trace (``gen_trace.make_trace``: 2,000 requests, 64 outputs)."""
    from kvpool.bench.vs_vllm import default_kit, load_kit_trace

    kit = kit or default_kit()
    if kit is None:
        raise FileNotFoundError("no vLLM kit: set KVPOOL_VLLM_KIT to ../shared/vllm-kit")
    trace = load_kit_trace(kit)[: num_requests or None]
    requests = tuple((f"r{rid}", tuple(p), tuple(o)) for rid, _, p, o in trace)
    name = "chat" if not interventions else "chat+" + "+".join(sorted(interventions))
    return Workload(name, requests, **interventions)


# -- building the engine ------------------------------------------------------------------

def _model_dir() -> str:
    path = os.path.join(tempfile.gettempdir(), "kvpool-vllm-tiny-llama")
    os.makedirs(path, exist_ok=True)
    config = os.path.join(path, "config.json")
    if not os.path.exists(config):
        with open(config, "w") as f:
            json.dump(_TINY_LLAMA, f)
    return path


def _kv_cache_groups(setup: Setup) -> list[Any]:
    import torch
    from vllm.v1 import kv_cache_interface as vi

    attn = dict(block_size=setup.block_size, num_kv_heads=2, head_size=16, dtype=torch.float16)
    full = vi.KVCacheGroupSpec(["layers.0"], vi.FullAttentionSpec(**attn))
    if setup.model == "full":
        return [full]
    if setup.model == "full+swa":
        return [full, vi.KVCacheGroupSpec(
            ["layers.1"], vi.SlidingWindowSpec(sliding_window=setup.sliding_window, **attn))]
    if setup.model == "full+mamba":
        # A Mamba layer keeps a state slot per draft token, as vLLM's layers declare it.
        mamba = vi.MambaSpec(block_size=setup.block_size, shapes=((1,),),
                             dtypes=(torch.float16,), mamba_cache_mode="align",
                             num_speculative_blocks=setup.num_speculative_tokens)
        return [full, vi.KVCacheGroupSpec(["layers.1"], mamba)]
    raise ValueError(f"model must be one of {MODELS}, got {setup.model!r}")


def build_scheduler(setup: Setup, store: str | None = None) -> Any:
    """vLLM's ``Scheduler`` for ``setup``, offline, on the CPU."""
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVEventsConfig,
        ModelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=_model_dir(), skip_tokenizer_init=True,
                        max_model_len=setup.max_model_len)
    cache = CacheConfig(block_size=setup.block_size,
                        enable_prefix_caching=setup.enable_prefix_caching)
    if setup.model == "full+mamba":
        cache.mamba_cache_mode = "align"
    cache.num_gpu_blocks = setup.num_blocks
    # Stated either way: left unset, vLLM turns async scheduling on by default.
    scheduler = SchedulerConfig(max_num_seqs=setup.max_num_seqs,
                                max_num_batched_tokens=setup.max_num_batched_tokens,
                                max_model_len=setup.max_model_len, is_encoder_decoder=False,
                                async_scheduling=setup.async_scheduling)
    extra: dict[str, Any] = {}
    if setup.num_speculative_tokens:
        extra["speculative_config"] = SpeculativeConfig(
            method="ngram", num_speculative_tokens=setup.num_speculative_tokens,
            prompt_lookup_max=4, prompt_lookup_min=2)
    if setup.connector:
        from vllm.config import KVTransferConfig

        extra["kv_transfer_config"] = KVTransferConfig(
            kv_connector="ExampleConnector", kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": store or tempfile.mkdtemp()})
    if setup.kv_events:
        extra["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True,
                                                   publisher="null")
    config = VllmConfig(model_config=model, cache_config=cache, scheduler_config=scheduler,
                        device_config=DeviceConfig(device="cpu"), **extra)
    kv_config = KVCacheConfig(num_blocks=setup.num_blocks, kv_cache_tensors=[],
                              kv_cache_groups=_kv_cache_groups(setup))
    extra = {"hash_block_size": setup.hash_block_size} if setup.hash_block_size else {}
    scheduler_class: Any = Scheduler
    if setup.async_scheduling:
        if setup.num_speculative_tokens:
            raise ValueError("the driver's fake model drafts tokens for the synchronous "
                             "scheduler only; async_scheduling takes no speculative tokens")
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        scheduler_class = AsyncScheduler
    return scheduler_class(config, kv_config,
                           structured_output_manager=StructuredOutputManager(config),
                           block_size=setup.block_size, log_stats=setup.log_stats, **extra)


# -- the fake model -----------------------------------------------------------------------

class _Recorder:
    """Stands in for vLLM's event publisher: keeps every published event."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, batch: Any) -> None:
        self.events.extend(batch.events)

    def shutdown(self) -> None:
        pass


def _event_tuple(event: Any) -> tuple[Any, ...]:
    fields = getattr(event, "__struct_fields__", ())
    return (type(event).__name__, *(_plain(getattr(event, f)) for f in fields))


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def model_output(scheduler: Any, output: Any, outputs: dict[str, tuple[int, ...]]) -> Any:
    """What a model runner answers for ``output``, read right after it was scheduled: each
    request whose scheduled tokens reach its end samples its next output token from the
    workload (plus the accepted drafts, synchronous scheduling only); a prefill chunk
    samples nothing. Under async scheduling the request's earlier steps may still be in
    flight: the token sampled is the one after theirs (their placeholders), and a step
    scheduled past the request's last output (vLLM discards it) samples its last again."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in ids:
        request = scheduler.requests[rid]
        if request.is_prefill_chunk:
            sampled.append([])  # a prefill chunk that does not reach the end
            continue
        mine = outputs[rid]
        have = request.num_output_tokens + request.num_output_placeholders
        if request.num_output_placeholders:  # async: this step's placeholder is counted
            sampled.append([mine[min(have - 1, len(mine) - 1)]])
            continue
        drafts = output.scheduled_spec_decode_tokens.get(rid, ())
        accepted = 0
        for j, token in enumerate(drafts):
            if have + j >= len(mine) or token != mine[have + j]:
                break
            accepted += 1
        sampled.append(list(mine[have: have + accepted + 1]))
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


def _record_estimates(manager: Any) -> list[tuple[str, int]] | None:
    """Have ``manager.estimate_cached_tokens`` (vLLM 0.33's scheduler asks it once per
    request, for the request's prefill stats) note each answer, outside the benchmark's
    clock; ``None`` for a manager without it (0.25)."""
    estimate = getattr(manager, "estimate_cached_tokens", None)
    if estimate is None:
        return None
    answers: list[tuple[str, int]] = []

    def noted(request: Any) -> int:
        tokens = estimate(request)
        answers.append((request.request_id, tokens))
        return tokens  # type: ignore[no-any-return]

    manager.estimate_cached_tokens = noted
    return answers


def step_record(output: Any, events: Sequence[Any],
                estimates: list[tuple[str, int]] | None = None) -> dict[str, Any]:
    """One step's decisions, as plain JSON values (what the conformance compares); a step
    that only processed a batch in flight (``output`` None) has only its events (and the
    cached-token estimates of the outputs it processed). ``estimates`` is emptied into the
    record."""
    record: dict[str, Any] = {}
    if estimates is not None:
        record["cached_token_estimates"] = sorted(estimates)
        estimates.clear()
    if output is None:
        return record | {"events": [_event_tuple(e) for e in events]}
    cached = output.scheduled_cached_reqs
    new_blocks: dict[str, list[list[Any]] | None] = {
        r.req_id: [list(g) for g in r.block_ids] for r in output.scheduled_new_reqs}
    for rid, ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
        new_blocks[rid] = None if ids is None else [list(g) for g in ids]
    record |= {
        "scheduled": sorted(output.num_scheduled_tokens.items()),
        "new_block_ids": sorted(new_blocks.items()),
        "resumed": sorted(getattr(cached, "resumed_req_ids", ()) or ()),
        "preempted": sorted(output.preempted_req_ids or ()),
        "finished": sorted(output.finished_req_ids),
        "common_prefix_blocks": list(output.num_common_prefix_blocks),
        "spec_tokens": sorted((k, list(v)) for k, v in
                              output.scheduled_spec_decode_tokens.items()),
        "events": [_event_tuple(e) for e in events],
    }
    # vLLM 0.33: the blocks to zero and the copy-on-write copies of the step.
    if hasattr(output, "new_block_ids_to_zero"):
        record["blocks_to_zero"] = list(output.new_block_ids_to_zero or ())
    if hasattr(output, "kv_cache_block_copies"):
        record["block_copies"] = [[c.src_block_id, c.dst_block_id]
                                  for c in output.kv_cache_block_copies or ()]
    return record


def _digest_bytes(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True).encode()


def digest(records: Sequence[dict[str, Any]]) -> str:
    """One hash of a run's decisions (the benchmark's check that both sides decided alike)."""
    h = hashlib.sha256()
    for record in records:
        h.update(_digest_bytes(record))
    return h.hexdigest()[:16]


def _fill_connector_store(connector: Any, workload: Workload, block_size: int) -> None:
    """Mark every third prompt as held by the ``ExampleConnector``'s store (an empty
    folder under the name it looks up: all its scheduler side checks). Not prompts of
    ``1 + k * block_size`` tokens: for those the local hit can hold one block more than the
    connector's rounding, and it reports a negative count (docs/vllm.md, deviations)."""
    import torch

    for i, (_, prompt, _) in enumerate(workload.requests):
        aligned = (len(prompt) - 2) // block_size * block_size  # the connector's alignment
        if i % 3 == 0 and aligned > 0 and (len(prompt) - 1) % block_size:
            connector._generate_foldername_debug(torch.tensor(list(prompt))[:aligned], [],
                                                 create_folder=True)


def run(setup: Setup, workload: Workload, *, manager: str = "vllm", backend: str = "fast",
        policy: str = "auto", record: bool = True, timing: bool = False,
        max_steps: int = 100_000, by_method: bool = False) -> dict[str, Any]:
    """Replay ``workload`` through vLLM's scheduler with ``manager`` (module docstring);
    ``by_method`` (with ``timing``) adds the manager's CPU time and calls per method, and
    ``allocate_slots``'s per kind of call (:func:`kvpool.vllm.manager_clock.allocate_kind`;
    telling the kind costs both sides' steps a little, outside the manager's time)."""
    import gc

    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.outputs import DraftTokenIds
    from vllm.v1.request import Request, RequestStatus

    import kvpool.vllm as dropin

    if manager == "kvpool":
        dropin.install(backend, policy=policy)
    elif manager == "vllm":
        dropin.uninstall()
    else:
        raise ValueError(f"manager must be 'vllm' or 'kvpool', got {manager!r}")
    store = tempfile.mkdtemp(prefix="kvpool-connector-") if setup.connector else None
    scheduler = build_scheduler(setup, store)
    if store is not None:
        _fill_connector_store(scheduler.connector, workload, setup.block_size)
    recorder = _Recorder()
    scheduler.kv_event_publisher = recorder
    clock = ManagerClock(scheduler.kv_cache_manager, by_method,
                         setup.block_size) if timing else None
    estimates = _record_estimates(scheduler.kv_cache_manager) if record else None
    kv_cache_utils.init_none_hash(sha256)
    # Read after install(), as vLLM's engine core does at start: with kvpool's fast backend
    # its hashers keep each prompt's digests packed (kvpool.vllm.hashes).
    hasher = kv_cache_utils.get_request_block_hasher(
        setup.hash_block_size or setup.block_size, sha256)
    outputs = {rid: out for rid, _, out in workload.requests}
    params: dict[int, Any] = {}
    began = time.thread_time()
    for rid, prompt, out in workload.requests:
        sampling = params.setdefault(len(out), SamplingParams(max_tokens=len(out),
                                                              ignore_eos=True))
        scheduler.add_request(Request(request_id=rid, prompt_token_ids=list(prompt),
                                      sampling_params=sampling, pooling_params=None,
                                      block_hasher=hasher))
    requests_seconds = time.thread_time() - began
    records: list[dict[str, Any]] = []
    run_digest = hashlib.sha256()  # the same hash as digest(records), built as it goes
    k = setup.num_speculative_tokens
    step = 0
    step_seconds = step_wall = 0.0
    first_step_s = 0.0
    interventions = {"aborted_waiting": 0, "aborted_running": 0, "resets": 0,
                     "scheduled_with_a_batch_in_flight": 0}
    if store is not None:
        interventions["external_tokens"] = 0
        after_alloc = scheduler.connector.update_state_after_alloc

        def counted(request: Any, blocks: Any, num_external_tokens: int) -> Any:
            interventions["external_tokens"] += num_external_tokens
            return after_alloc(request, blocks, num_external_tokens)

        scheduler.connector.update_state_after_alloc = counted
    gc.collect()
    in_flight: deque[tuple[Any, Any]] = deque()
    depth = 2 if setup.async_scheduling else 1
    while (scheduler.has_unfinished_requests() or in_flight) and step < max_steps:
        if workload.abort_every and step and step % workload.abort_every == 0:
            waiting = [r.request_id for r in scheduler.waiting][:1]
            running = [r.request_id for r in scheduler.running][-1:]
            scheduler.finish_requests(waiting + running, RequestStatus.FINISHED_ABORTED)
            interventions["aborted_waiting"] += len(waiting)
            interventions["aborted_running"] += len(running)
        if step in workload.reset_at:
            done = scheduler.reset_prefix_cache(reset_running_requests=True)
            interventions["resets"] += bool(done)
        began = time.thread_time()
        began_wall = time.perf_counter()
        # As vLLM's engine core steps (``step`` / ``step_with_batch_queue``): schedule a
        # batch and answer it; synchronously, process the answer at once; with async
        # scheduling, only once the queue holds two batches (or nothing more is scheduled),
        # so the next batch is scheduled while this one is in flight.
        output = None
        if scheduler.has_requests():
            if in_flight:
                interventions["scheduled_with_a_batch_in_flight"] += 1
            output = scheduler.schedule()
            in_flight.appendleft((output, model_output(scheduler, output, outputs)))
        if in_flight and (len(in_flight) == depth or output is None or not (
                output.total_num_scheduled_tokens or scheduler.has_requests())):
            scheduler.update_from_output(*in_flight.pop())
        if k:
            proposals = []
            for request in scheduler.running:
                rid = request.request_id
                have = request.num_output_tokens
                true = list(outputs[rid][have: have + k])
                wrong = (sum(map(ord, rid)) + step) % (k + 1)  # drafts after it are wrong
                proposals.append(true[:wrong] + [t + 1 for t in true[wrong:]])
            scheduler.update_draft_token_ids(DraftTokenIds(
                [r.request_id for r in scheduler.running], proposals))
        step_wall += time.perf_counter() - began_wall
        spent = time.thread_time() - began
        step_seconds += spent
        if step == 0:
            first_step_s = spent
        if record:
            decisions = step_record(output, recorder.events, estimates)
            run_digest.update(_digest_bytes(decisions))
            if not timing:  # a timed run keeps only the digest (below)
                records.append(decisions)
        recorder.events.clear()
        step += 1
    if store is not None:
        import shutil

        shutil.rmtree(store, ignore_errors=True)
    result_dict: dict[str, Any] = {
        "workload": workload.name, "setup": asdict(setup), "manager": manager,
        "backend": backend if manager == "kvpool" else None,
        "steps": step, "digest": run_digest.hexdigest()[:16] if record else None,
        "manager_repr": repr(scheduler.kv_cache_manager), "interventions": interventions,
    }
    if manager == "kvpool":
        # Block ids recorded for zeroing that no call has taken: vLLM 0.33's scheduler takes
        # them every step, 0.25's never asks, so none may be left (none may pile up).
        result_dict["blocks_to_zero_left"] = sum(
            len(m.new_block_ids)
            for m in scheduler.kv_cache_manager.manager.coordinator.single_type_managers)
    if record and not timing:
        result_dict["records"] = records
    if timing:
        assert clock is not None
        cpu_per_wall = step_seconds / step_wall if step_wall else 1.0
        # What the clock itself put into each call, measured here and now (after the
        # replay: the same process, warm); the net figure takes it off every call.
        share = ManagerClock.calibrate()
        result_dict.update(requests_cpu_s=requests_seconds,
                           scheduler_cpu_s=step_seconds, scheduler_wall_s=step_wall,
                           manager_wall_s=clock.seconds,
                           manager_cpu_s=clock.seconds * cpu_per_wall,
                           manager_clock_share_s=share,
                           manager_net_cpu_s=max(0.0, clock.seconds - clock.calls * share)
                           * cpu_per_wall,
                           manager_calls=clock.calls, first_step_cpu_s=first_step_s)
        if by_method:
            result_dict["manager_by_method"] = {
                name: {"cpu_s": seconds * cpu_per_wall, "calls": calls}
                for name, (seconds, calls) in clock.by_method.items() if calls}
    return result_dict


def first_difference(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> str | None:
    """Where two runs' records first differ, in words; ``None`` when they are equal."""
    for step, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            keys = [key for key in x if x[key] != y.get(key)]
            key = keys[0]
            return f"step {step}, {key}: {str(x[key])[:600]} != {str(y[key])[:600]}"
    if len(a) != len(b):
        return f"one run has {len(a)} steps, the other {len(b)}"
    return None


def counts(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """What a run exercised: preemptions, finishes, draft tokens, events by type, ..."""
    out = {"steps": len(records), "preempted": 0, "resumed": 0, "finished": 0,
           "spec_tokens": 0, "new_blocks": 0, "steps_with_common_prefix": 0}
    for record in records:
        for event in record["events"]:
            out[event[0]] = out.get(event[0], 0) + 1
        if "cached_token_estimates" in record:  # vLLM 0.33
            out["cached_token_estimates"] = out.get("cached_token_estimates", 0) + \
                len(record["cached_token_estimates"])
        if "scheduled" not in record:  # a step that only processed a batch in flight
            continue
        out["preempted"] += len(record["preempted"])
        out["resumed"] += len(record["resumed"])
        out["finished"] += len(record["finished"])
        out["spec_tokens"] += sum(len(t) for _, t in record["spec_tokens"])
        out["new_blocks"] += sum(len(g) for _, groups in record["new_block_ids"]
                                 for g in groups or ())
        out["steps_with_common_prefix"] += any(record["common_prefix_blocks"])
        for key in ("block_copies", "blocks_to_zero"):  # vLLM 0.33
            if key in record:
                out[key] = out.get(key, 0) + len(record[key])
    return out


def compare(setup: Setup, workload: Workload, backends: Sequence[str],
            policy: str = "auto") -> dict[str, Any]:
    """vLLM's manager, then kvpool's on each backend, over one workload: steps, digests,
    what the run exercised (:func:`counts`) and the first difference of each kvpool run
    from vLLM's (``None`` when identical)."""
    stock = run(setup, workload, manager="vllm")
    out: dict[str, Any] = {"workload": workload.name, "setup": asdict(setup),
                           "steps": stock["steps"], "digest": stock["digest"],
                           "counts": {**counts(stock["records"]),
                                      **stock["interventions"]}, "runs": {}}
    for backend in backends:
        ours = run(setup, workload, manager="kvpool", backend=backend, policy=policy)
        out["runs"][backend] = {
            "steps": ours["steps"], "digest": ours["digest"],
            "manager": ours["manager_repr"], "blocks_to_zero_left": ours["blocks_to_zero_left"],
            "difference": first_difference(stock["records"], ours["records"])}
    return out


def _workload(spec: dict[str, Any]) -> Workload:
    spec = dict(spec)
    return chat_workload(spec.pop("kit", None), spec.pop("num_requests", None),
                         **{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()})


def main() -> int:
    """Serve JSON commands on stdin, one answer line each: ``{"compare": [backends],
    "setup": {...}, "workload": {...}}`` (:func:`compare`), or ``{"setup": ..., "workload":
    ..., "manager": ..., "backend": ..., "policy": ..., "record": bool, "timing": bool,
    "by_method": bool}``
    (:func:`run`; with ``"install_only"`` the seconds :func:`kvpool.vllm.install` took)."""
    for line in sys.stdin:
        command = json.loads(line)
        setup = Setup(**command.get("setup", {}))
        if command.get("install_only"):
            import vllm.v1.core.sched.scheduler  # noqa: F401 - an engine imported vLLM long ago

            import kvpool.vllm as dropin

            began = time.perf_counter()
            dropin.install(command.get("backend", "fast"))
            print(json.dumps({"install_s": time.perf_counter() - began}), flush=True)
            continue
        workload = _workload(command.get("workload", {}))
        if "compare" in command:
            answer = compare(setup, workload, command["compare"], command.get("policy", "auto"))
        else:
            answer = run(setup, workload, manager=command.get("manager", "vllm"),
                         backend=command.get("backend", "fast"),
                         policy=command.get("policy", "auto"),
                         record=command.get("record", True),
                         timing=command.get("timing", False),
                         by_method=command.get("by_method", False))
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
