"""Conformance of kvpool's facade against vLLM's own ``KVCacheManager`` (optional tier).

The whole-stack machine (:mod:`kvpool.harness.stack.machine`) drives vLLM's facade
(:class:`~kvpool.harness.foreign.vllm_stack.VllmFacade`, the oracle) and kvpool's on the same
scheduler workload, comparing results, block tables per group, hit lengths, pool states and
events after every step. Where kvpool deliberately differs from vLLM 0.25.1 the two stop
agreeing; each such difference is *classified* against BEHAVIOUR.md (a §12 row or one of
the two 0.33 fixes of §0), and the run resumes on a fresh seed, so one budget covers many
independent histories. Anything unclassified is a finding.

Run it with a vLLM kit (vLLM must import; kvpool's deps beside it)::

    PYTHONPATH=src:/tmp/anchors/vllm025/kvpool-deps VLLM_LOGGING_LEVEL=ERROR \\
        /tmp/anchors/vllm025/venv/bin/python -m kvpool.harness.conformance --steps 5000

With the vLLM 0.33.0 kit (``/tmp/anchors/vllm033``) the same command compares the
copy-on-write configurations (``full+mamba-cow``, ``2full+mamba-cow``), including the copies
and retained endpoints handed over each step, and ``full+ring`` (a circular buffer); with
0.25.1 every other configuration (:func:`default_configurations`).

The pytest tier (``tests/policy/test_vllm_conformance.py``) runs this command when
``KVPOOL_VLLM_PYTHON`` names such a python (kit: ``/tmp/anchors/vllm025/venv/bin/python``;
``KVPOOL_VLLM_DEPS`` the deps folder, default ``<kit>/kvpool-deps``) and skips otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from kvpool.harness.stack.configs import CONFIGURATIONS
from kvpool.harness.stack.machine import StackDivergence
from kvpool.harness.stack.run import run_stack_check

EXPLANATIONS = {
    "hybrid-truncates-every-full-attention-group":
        "BEHAVIOUR.md §0/§9 step 3: kvpool has vLLM 0.33's fix — every full-attention spec "
        "group is cut to the hit; 0.25.1 cut only the first, leaving a second "
        "full-attention group with extra (possibly shared) blocks",
    "mamba-align-external-tokens-sized":
        "BEHAVIOUR.md §12 (kvpool addition, docs/policy.md): Mamba align sizing with "
        "KV-connector tokens — vLLM 0.25.1 counts 1 + num_speculative_blocks and takes one "
        "more: it raises ValueError after allocating, or, when one more block is free, "
        "takes it from the reserved blocks or the watermark; kvpool sizes both phases and "
        "answers None",
    "eagle-mamba-hit-capped-by-full-attention":
        "BEHAVIOUR.md §9/§12 (full attention + Mamba with EAGLE): vLLM 0.25.1 reports a hit "
        "longer than the full-attention group's blocks and later caches never-computed "
        "blocks; kvpool keeps invariant 26",
}


def classify(error: StackDivergence | None, config_name: str) -> str | None:
    """The :data:`EXPLANATIONS` key of a divergence, or ``None`` if it is unexplained."""
    if error is None or error.outcomes is None:
        return None
    config = CONFIGURATIONS[config_name]
    what = error.what or ""
    (kind_v, hit_v), (kind_k, hit_k) = error.outcomes
    # An admission with external tokens that vLLM under-counts by one block: it fails
    # after allocating, or succeeds with a block beyond the budget; kvpool says None.
    if what.startswith("allocate_slots") and what.endswith(" external)") and \
            (kind_k, hit_k) == ("ok", None) and \
            (kind_v == "crash" and "Cannot get" in str(hit_v)
             or kind_v == "ok" and hit_v is not None) and \
            any(getattr(g.kv_cache_spec, "mamba_cache_mode", "") == "align"
                for g in config.groups):
        return "mamba-align-external-tokens-sized"
    if not what.startswith("get_computed_blocks"):
        return None
    if kind_v != "ok" or kind_k != "ok":
        return None
    _, vblocks, vlen = hit_v
    _, kblocks, klen = hit_k
    sizes = [g.kv_cache_spec.block_size for g in config.groups]
    full = [g.kv_cache_spec.__class__.__name__ == "FullAttentionSpec" for g in config.groups]
    # 0.33 truncation fix: same hit, kvpool's full-attention lists are vLLM's cut to it.
    if vlen == klen and all(
            kb == (vb[: klen // bs] if f else vb)
            for kb, vb, bs, f in zip(kblocks, vblocks, sizes, full, strict=True)):
        return "hybrid-truncates-every-full-attention-group"
    # The EAGLE + Mamba bug: vLLM's hit exceeds what its full-attention lists cover.
    if config.use_eagle and any(f and len(vb) * bs < vlen
                                for vb, bs, f in zip(vblocks, sizes, full, strict=True)):
        return "eagle-mamba-hit-capped-by-full-attention"
    return None


def default_configurations(version: tuple[int, int] | None = None) -> list[str]:
    """The configurations the importable vLLM is compared on: vLLM 0.33 for the ones
    using its features (copy-on-write, §10.4; circular buffers, §8), vLLM 0.25 for the rest
    (kvpool's facade is 0.25.1's; 0.33 changed other rules, §0)."""
    if version is None:
        from kvpool.harness.foreign.vllm_stack import vllm_version

        version = vllm_version()
    target = (0, 33) if version >= (0, 33) else (0, 25)
    return [name for name, c in CONFIGURATIONS.items() if c.vllm == target]


@dataclass
class ConformanceResult:
    """One configuration: steps compared, and every difference with its class."""

    configuration: str
    steps_compared: int = 0
    runs: int = 0
    explained: dict[str, int] = field(default_factory=dict)
    unexplained: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(configuration=self.configuration, steps_compared=self.steps_compared,
                    runs=self.runs, explained=self.explained, unexplained=self.unexplained)


def run_conformance(configuration: str, steps: int, seed: int = 0,
                    backend: str = "reference", max_unexplained: int = 3) -> ConformanceResult:
    """Compare kvpool (on ``backend``) with vLLM over ``steps`` steps of ``configuration``."""
    from kvpool.harness.foreign.vllm_stack import VllmFacade

    result = ConformanceResult(configuration)
    run_seed = seed
    while result.steps_compared < steps and len(result.unexplained) < max_unexplained:
        report = run_stack_check(configuration, [backend], steps - result.steps_compared,
                                 seed=run_seed, foreign=VllmFacade)
        result.runs += 1
        run_seed += 1
        if report.ok:
            result.steps_compared += report.steps
            continue
        result.steps_compared += max(report.steps - 1, 0)  # the failing step disagreed
        label = classify(report.error, configuration)
        if label is None:
            result.unexplained.append(report.failure or "?")
        else:
            result.explained[label] = result.explained.get(label, 0) + 1
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000, help="steps per configuration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="reference")
    parser.add_argument("--configuration", action="append", choices=sorted(CONFIGURATIONS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = [run_conformance(name, args.steps, args.seed, args.backend)
               for name in args.configuration or default_configurations()]
    if args.json:
        print(json.dumps([r.to_json() for r in results]))
    else:
        for r in results:
            print(f"{r.configuration:18} {r.steps_compared:7} steps in {r.runs} runs; "
                  f"explained {r.explained or '-'}; unexplained {len(r.unexplained)}")
            for text in r.unexplained:
                print("   ", text.replace("\n", "\n    "))
        for key, text in EXPLANATIONS.items():
            print(f"  [{key}] {text}")
    return 1 if any(r.unexplained for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["EXPLANATIONS", "ConformanceResult", "classify", "default_configurations", "main",
           "run_conformance"]
