"""Optional tier: vLLM's real ``Scheduler`` makes the same decisions with kvpool's manager.

Skipped unless a vLLM kit's python is named (``../shared/vllm-kit``, then
``tools/vllm_side_deps.sh`` for kvpool's dependencies beside it)::

    KVPOOL_VLLM025_PYTHON=/tmp/anchors/vllm025/venv/bin/python \\
    KVPOOL_VLLM033_PYTHON=/tmp/anchors/vllm033/venv/bin/python \\
    .venv/bin/python -m pytest -q tests/vllm

For each workload the driver (:mod:`kvpool.vllm.scheduler_run`) replays the kit's chat trace
through vLLM's scheduler with a fake model (the ``async`` workloads: vLLM's
``AsyncScheduler``, stepped as its engine core steps it, the next batch scheduled while the
last one is in flight), once with vLLM's own ``KVCacheManager`` and once
per kvpool backend through :func:`kvpool.vllm.install`, and compares every step: tokens
scheduled per request, new block ids per group, resumed, preempted and finished requests,
common prefix blocks, speculative tokens, every KV event and (0.33) the blocks to zero, the
copy-on-write copies and the manager's estimate of each request's cached tokens. No
difference is tolerated.
``KVPOOL_VLLM_KIT`` points at the kit (default ``../shared/vllm-kit`` beside the checkout).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIT = os.environ.get("KVPOOL_VLLM_KIT", str(ROOT.parent / "shared" / "vllm-kit"))
PYTHONS = {v: os.environ.get(f"KVPOOL_VLLM{v}_PYTHON") for v in ("025", "033")}


def kit_env(python: str) -> dict[str, str]:
    kit = Path(os.path.abspath(python)).parents[2]  # <kit>/venv/bin/python, not resolved
    paths = [str(ROOT / "src"), str(kit / "kvpool-deps")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "VLLM_LOGGING_LEVEL": "ERROR",
            "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0", "KVPOOL_VLLM_KIT": KIT,
            # Numba's cache is per numba version: the kit's own, not the checkout's.
            "NUMBA_CACHE_DIR": str(kit / "numba-cache")}


def ask(python: str, commands: list[dict]) -> list[dict]:
    """Run the driver in the kit's python; one answer per command."""
    done = subprocess.run(
        [python, "-m", "kvpool.vllm.scheduler_run"], input="".join(
            json.dumps(c) + "\n" for c in commands), capture_output=True, text=True,
        env=kit_env(python), timeout=3600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def need(version: str) -> str:
    python = PYTHONS[version]
    if not python:
        pytest.skip(f"set KVPOOL_VLLM{version}_PYTHON to a vLLM kit's python "
                    f"(../shared/vllm-kit, then tools/vllm_side_deps.sh)")
    return python


# (id, setup, workload, backends, what the run must exercise). Sizes keep the tier to a few
# minutes per kit.
WORKLOADS = [
    ("chat", {}, {}, ["fast", "reference"], {"BlockStored": 1000, "BlockRemoved": 1000}),
    ("preemptions", {"num_blocks": 1500}, {"num_requests": 300}, ["fast", "reference"],
     {"preempted": 10, "resumed": 10}),
    ("aborts", {}, {"num_requests": 400, "abort_every": 7}, ["fast", "reference"],
     {"aborted_waiting": 20, "aborted_running": 20}),
    ("prefix-reset", {}, {"num_requests": 300, "reset_at": [40, 120]},
     ["fast", "reference"], {"resets": 2, "AllBlocksCleared": 2, "preempted": 60}),
    ("ngram-spec-decode", {"num_speculative_tokens": 3}, {"num_requests": 300},
     ["fast", "reference"], {"spec_tokens": 1000}),
    ("full+swa", {"model": "full+swa", "num_blocks": 4000}, {"num_requests": 300},
     ["fast", "reference"], {"BlockStored": 100, "BlockRemoved": 100}),
    ("full+mamba", {"model": "full+mamba", "num_blocks": 4000}, {"num_requests": 300},
     ["fast", "reference"], {"BlockStored": 100}),
    ("spec-backend", {}, {"num_requests": 60}, ["spec"], {"BlockStored": 10}),
    # a KV connector: vLLM's ExampleConnector (scheduler side), a third of the prompts held
    # by its store (both versions have it; no worker runs)
    ("example connector", {"connector": True}, {"num_requests": 300}, ["fast", "reference"],
     {"external_tokens": 50_000}),
    ("full+mamba ngram-spec-decode", {"model": "full+mamba", "num_blocks": 4000,
                                      "num_speculative_tokens": 2},
     {"num_requests": 300}, ["fast", "reference"], {"spec_tokens": 1000, "preempted": 5}),
    # Async scheduling, the default of both versions' engines: each step is scheduled
    # before the previous one is back (vLLM's AsyncScheduler, a batch queue of two).
    ("async", {"async_scheduling": True}, {"num_requests": 300}, ["fast", "reference"],
     {"scheduled_with_a_batch_in_flight": 300, "BlockRemoved": 1000}),
    ("async preemptions", {"num_blocks": 1500, "async_scheduling": True},
     {"num_requests": 300}, ["fast", "reference"],
     {"preempted": 10, "scheduled_with_a_batch_in_flight": 1000}),
    ("async aborts+reset", {"async_scheduling": True},
     {"num_requests": 300, "abort_every": 7, "reset_at": [40, 120]}, ["fast", "reference"],
     {"aborted_waiting": 20, "aborted_running": 20, "resets": 2,
      "scheduled_with_a_batch_in_flight": 200}),
    ("full+swa async", {"model": "full+swa", "num_blocks": 4000, "async_scheduling": True},
     {"num_requests": 300}, ["fast", "reference"],
     {"BlockRemoved": 1000, "scheduled_with_a_batch_in_flight": 1000}),
    ("full+mamba async", {"model": "full+mamba", "num_blocks": 4000, "async_scheduling": True},
     {"num_requests": 300}, ["fast", "reference"],
     {"preempted": 5, "scheduled_with_a_batch_in_flight": 500}),
    ("async example connector", {"connector": True, "async_scheduling": True},
     {"num_requests": 300}, ["fast", "reference"],
     {"external_tokens": 50_000, "scheduled_with_a_batch_in_flight": 300}),
]


# vLLM 0.33: the same workloads (a resumed request is sent again as a new one, so the small
# pool shows preemptions only), plus 0.33's partial prefix hits with copy-on-write (Mamba
# blocks of 32 tokens hashed every 16).
WORKLOADS_033 = [
    (name, setup, workload, backends,
     # 0.33 also asks the manager, once per request, how many tokens it found cached
     ({"preempted": 10} if name == "preemptions" else exercised)
     | {"cached_token_estimates": 50})
    for name, setup, workload, backends, exercised in WORKLOADS
] + [
    ("full+mamba partial hits", {"model": "full+mamba", "num_blocks": 3000, "block_size": 32,
                                 "hash_block_size": 16}, {"num_requests": 300},
     ["fast", "reference"], {"block_copies": 100, "preempted": 5}),
    ("full+mamba partial hits async", {"model": "full+mamba", "num_blocks": 3000,
                                       "block_size": 32, "hash_block_size": 16,
                                       "async_scheduling": True}, {"num_requests": 300},
     ["fast", "reference"], {"block_copies": 100, "scheduled_with_a_batch_in_flight": 400}),
]


def conform(python: str, workloads: list) -> None:
    """Every workload: vLLM's manager and kvpool's make the same decisions every step."""
    commands = [{"compare": backends, "setup": setup, "workload": workload}
                for _, setup, workload, backends, _ in workloads]
    answers = ask(python, commands)
    assert len(answers) == len(workloads)
    differences = []
    for (name, *_, exercised), answer in zip(workloads, answers, strict=True):
        assert answer["steps"] > 0
        for what, least in exercised.items():  # the workload tests what it claims to
            assert answer["counts"].get(what, 0) >= least, (name, what, answer["counts"])
        for backend, result in answer["runs"].items():
            assert result["steps"] == answer["steps"], (name, backend)
            # Nothing recorded for a call that never comes (0.25 zeroes no blocks).
            assert result["blocks_to_zero_left"] == 0, (name, backend, result)
            if result["difference"] is not None or result["digest"] != answer["digest"]:
                differences.append(f"{name} [{backend}]: {result['difference']}")
    assert not differences, "\n".join(differences)
    print(json.dumps({name: answer["counts"] for (name, *_), answer in
                      zip(workloads, answers, strict=True)}))


def test_vllm_025_schedules_identically_with_kvpools_manager() -> None:
    conform(need("025"), WORKLOADS)


def test_vllm_033_schedules_identically_with_kvpools_manager() -> None:
    conform(need("033"), WORKLOADS_033)


@pytest.mark.parametrize("version", ["025", "033"])
def test_the_fast_policy_serves_a_full_attention_model(version: str) -> None:
    python = need(version)
    answer = ask(python, [{"manager": "kvpool", "backend": "fast", "record": False,
                           "workload": {"num_requests": 20}}])[0]
    assert answer["manager_repr"].startswith("KvpoolKVCacheManager(FastKVCacheManager(")


@pytest.mark.parametrize("version", ["025", "033"])
def test_the_benchmark_clock_times_every_method_the_scheduler_calls(version: str) -> None:
    """The manager's time in ``kvpool bench --vllm-scheduler`` is the time of every method
    vLLM's schedulers call on it: each ``kv_cache_manager.<name>(`` in their source is one
    the clock wraps (a method missing here was once missing from both sides' figures)."""
    from kvpool.vllm.manager_clock import ManagerClock

    out = run_script(need(version), (
        "import re, inspect\n"
        "from vllm.v1.core.sched import scheduler, async_scheduler\n"
        "names = set()\n"
        "for m in (scheduler, async_scheduler):\n"
        "    names |= set(re.findall(r'kv_cache_manager\\.(\\w+)\\(', inspect.getsource(m)))\n"
        "print('called:', *sorted(names))\n"))
    called = set(next(line for line in out.splitlines() if line.startswith("called:"))
                 .split()[1:])
    assert {"allocate_slots", "free"} <= called  # the scan finds the calls
    assert called <= set(ManagerClock.METHODS), called - set(ManagerClock.METHODS)


def run_script(python: str, script: str) -> str:
    done = subprocess.run([python, "-c", script], capture_output=True, text=True,
                          env=kit_env(python), timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_an_unsupported_vllm_version_is_refused_and_fallback_keeps_vllms_manager() -> None:
    """A vLLM whose scheduler contract the drop-in does not implement (faked: 0.30) is
    refused at install; with on_unsupported="fallback" vLLM's own manager stays."""
    python = need("033")
    out = run_script(python, (
        "import vllm\nvllm.__version__ = '0.30.0'\n"
        "import kvpool.vllm as d\n"
        "try:\n    d.install('fast')\nexcept d.UnsupportedConfig as e:\n    print('refused', e)\n"
        "d.install('fast', on_unsupported='fallback')\n"
        "from vllm.v1.core.sched import scheduler as s\n"
        "print('stock', s.KVCacheManager.__module__)\n"))
    assert "refused kvpool's drop-in implements the scheduler contract of vLLM 0.25, 0.33; " \
        "this is vLLM 0.30" in out
    assert "stock vllm.v1.core.kv_cache_manager" in out


def test_vllm_033_refuses_what_kvpool_does_not_serve_at_engine_start() -> None:
    """Sparse prefix-cache retention (a 0.33 feature kvpool's drop-in does not serve) stops
    the engine at start; with fallback the scheduler gets vLLM's own manager."""
    python = need("033")
    out = run_script(python, (
        "from kvpool.vllm import scheduler_run as r\n"
        "import kvpool.vllm as d\n"
        "from vllm.v1 import kv_cache_interface as vi\n"
        "KV = vi.KVCacheConfig\n"
        "class Sparse(KV):\n"
        "    def __init__(self, *a, **k):\n"
        "        super().__init__(*a, **k)\n"
        "        self.prefix_cache_retention_interval = 0\n"
        "vi.KVCacheConfig = Sparse\n"
        "d.install('fast', warm_up=False)\n"
        "try:\n    r.build_scheduler(r.Setup(model='full+swa', num_blocks=200))\n"
        "except d.UnsupportedConfig as e:\n    print('refused', e)\n"
        "d.install('fast', on_unsupported='fallback', warm_up=False)\n"
        "s = r.build_scheduler(r.Setup(model='full+swa', num_blocks=200))\n"
        "print('manager', type(s.kv_cache_manager).__module__)\n"))
    assert "refused kvpool's drop-in for vLLM 0.33: KVCacheConfig." \
        "prefix_cache_retention_interval=0" in out
    assert "manager vllm.v1.core.kv_cache_manager" in out


PACKING_SCRIPT = """
import json
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils as u
from vllm.v1.engine import core as engine_core
from vllm.v1.request import Request
import kvpool.vllm as d
u.init_none_hash(sha256)

def make():
    hasher = engine_core.get_request_block_hasher(16, sha256)  # as the engine core gets it
    return Request(request_id="r", prompt_token_ids=list(range(70)), pooling_params=None,
                   sampling_params=SamplingParams(max_tokens=64), block_hasher=hasher)

stock = make()
d.install("fast", warm_up=False)
packed = make()
hashes = packed.block_hashes
seen = {"type": type(hashes).__name__, "prompt_packed": hashes.packed_count,
        "hands_over": packed._block_hasher.__qualname__.endswith("request_block_hasher")
        and packed._block_hasher.__module__ == u.__name__}
for t in range(40):
    stock.append_output_token_ids(t)
    packed.append_output_token_ids(t)
seen["equal"] = hashes == stock.block_hashes
seen["count"] = len(hashes)
seen["packed_all"] = bytes(hashes.packed(len(hashes))) == b"".join(stock.block_hashes)
d.install("reference", warm_up=False)
seen["reference"] = type(make().block_hashes).__name__
d.install("fast", warm_up=False)
d.uninstall()
seen["restored"] = type(make().block_hashes).__name__
print(json.dumps(seen))
"""


@pytest.mark.parametrize("version", ["025", "033"])
def test_vllms_requests_get_vllms_digests_with_the_prompt_packed(version: str) -> None:
    """install() gives vLLM's engine core a hasher factory whose hashers pack each prompt's
    digests (kvpool.vllm.hashes): vLLM's Request then holds vLLM's exact digests, in a
    packed list, and calls vLLM's own hasher after every token; uninstall() restores it."""
    python = need(version)
    out = run_script(python, PACKING_SCRIPT)
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"type": "BlockHashList", "prompt_packed": 4, "hands_over": True,
                    "equal": True, "count": 6, "packed_all": True, "reference": "list",
                    "restored": "list"}


IN_FLIGHT_SCRIPT = """
import json
from kvpool.vllm import scheduler_run as sr
import kvpool.vllm as d
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils as u
from vllm.v1.request import Request
u.init_none_hash(sha256)

def tables(policy):
    if policy == "vllm":
        d.uninstall()
    else:
        d.install("fast", policy=policy, warm_up=False)
    setup = sr.Setup(model="full+swa", num_blocks=400, sliding_window=64)
    manager = sr.build_scheduler(setup).kv_cache_manager
    request = Request(request_id="r", prompt_token_ids=list(range(100)), pooling_params=None,
                      sampling_params=SamplingParams(max_tokens=200),
                      block_hasher=u.get_request_block_hasher(16, sha256))
    hits, n = manager.get_computed_blocks(request)[:2]
    manager.allocate_slots(request, 100 - n, n, hits)
    request.num_computed_tokens = 100
    out = [type(getattr(manager, "manager", manager)).__name__]  # the policy serving it
    for t in range(60):
        request.append_output_token_ids(t)
        request.num_in_flight_tokens = 3  # scheduled, not processed yet (async scheduling)
        manager.allocate_slots(request, 1)
        request.num_computed_tokens += 1
        out.append(manager.get_block_ids("r"))
    return out

print(json.dumps({policy: tables(policy) for policy in ("vllm", "fast", "generic")}))
"""


def test_vllm_033_keeps_the_window_blocks_of_tokens_in_flight_on_every_policy() -> None:
    """With async scheduling vLLM 0.33 frees a sliding window's blocks behind the tokens
    already processed, not those in flight (kvpool's facade reads the request's
    ``num_in_flight_tokens``). The hybrid fast policy's step used to free behind the
    computed tokens (found in session 15: block 10 freed at step 11 while in-flight tokens
    still attended to it); both policies free behind the processed ones now."""
    python = need("033")
    runs = json.loads(run_script(python, IN_FLIGHT_SCRIPT).strip().splitlines()[-1])
    assert runs["fast"][0].startswith("FastHybridKVCacheManager")
    assert runs["fast"][1:] == runs["vllm"][1:] == runs["generic"][1:]
    assert any(0 in groups[1] for groups in runs["vllm"][1:])  # the window did free blocks
