"""What kvpool's drop-in refuses under vLLM 0.33 (read by attribute; no vLLM import).

vLLM 0.33 added features to its KV cache manager that kvpool's policy does not implement.
Each one, when switched on, changes the manager's decisions, so a configuration using it is
refused at engine start with :class:`~kvpool.vllm.config.UnsupportedConfig` (or falls back
to vLLM's manager) instead of being served differently:

* KV cache config: sparse prefix-cache retention (``prefix_cache_retention_interval``), the
  HiSparse host tier, a hit alignment of its own (``cache_hit_alignment_tokens``);
* groups: a role other than the default, host-resident groups;
* specs: Mamba prefill checkpoint blocks, sliding windows that retain extra tokens or replay
  a bounded window, full attention carrying a window / chunk / non-causal mark;
* manager arguments: lookahead block hashing, multi-module MTP re-prefill
  (``num_prefill_lookahead > 1``);
* the scheduler (:func:`scheduler_refusal`): a KV connector that binds vLLM's own pool
  or manager, asks for divergent hybrid hits, or runs on a model with a Mamba group or one
  that needs KV zeroing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.vllm.connectors import binding_refusal

#: (spec class name, field, the value that 0.33's default behaviour has).
_SPEC_DEFAULTS = (
    ("MambaSpec", "num_prefill_checkpoint_blocks", 0),
    ("MambaSpec", "prefill_checkpoint_alignment", None),
    ("SlidingWindowSpec", "extra_retained_tokens", 0),
    ("SlidingWindowMLASpec", "extra_retained_tokens", 0),
    ("SlidingWindowMLASpec", "bounded_replay", False),
)
_FULL_FAMILY = ("FullAttentionSpec", "TQFullAttentionSpec", "MLAAttentionSpec",
                "HiddenStateCacheSpec", "SinkFullAttentionSpec", "RSWASpec")
_FULL_DEFAULTS = (("sliding_window", None), ("attention_chunk_size", None),
                  ("non_causal", False))
_CONFIG_DEFAULTS = (("prefix_cache_retention_interval", None),
                    ("hisparse_host_num_blocks", None), ("cache_hit_alignment_tokens", None))


def _role(group: Any) -> str:
    role = getattr(group, "role", "default")
    return str(getattr(role, "value", role))


def refusal(kv_cache_config: Any, *, num_hash_lookahead_tokens: int = 0,
            num_prefill_lookahead: int = 0) -> str | None:
    """Why kvpool cannot serve this 0.33 configuration, or ``None`` (module docstring)."""
    for name, default in _CONFIG_DEFAULTS:
        value = getattr(kv_cache_config, name, default)
        if value != default:
            return f"KVCacheConfig.{name}={value!r} is not supported (only {default!r})"
    if num_hash_lookahead_tokens:
        return f"num_hash_lookahead_tokens={num_hash_lookahead_tokens} (lookahead hashing)"
    if num_prefill_lookahead > 1:
        return f"num_prefill_lookahead={num_prefill_lookahead} (multi-module MTP re-prefill)"
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        if _role(group) != "default":
            return f"kv_cache_groups[{i}] has role {_role(group)!r}"
        if getattr(group, "host_resident", False):
            return f"kv_cache_groups[{i}] is host-resident"
        spec = group.kv_cache_spec
        name = type(spec).__name__
        for cls, field, default in _SPEC_DEFAULTS:
            if name == cls and getattr(spec, field, default) != default:
                return f"kv_cache_groups[{i}]: {name}.{field}={getattr(spec, field)!r}"
        if name in _FULL_FAMILY:
            for field, default in _FULL_DEFAULTS:
                if getattr(spec, field, default) != default:
                    return f"kv_cache_groups[{i}]: {name}.{field}={getattr(spec, field)!r}"
    return None


def scheduler_refusal(scheduler: Any, kv_cache_config: Any) -> str | None:
    """Why kvpool cannot serve the 0.33 scheduler that builds the manager, or ``None``.

    A KV connector is served when it only talks to the manager through its public calls
    (hits, external tokens, block ids): not one that binds the block pool or the manager
    itself (offloading connectors read vLLM's pool and coordinator), not one that reports
    per-group divergent hybrid hits, and not on a model with a Mamba group (0.33 hands a
    connector Mamba boundary states and partial tails, which kvpool does not keep) or one
    that needs KV zeroing (0.33 skips zeroing the groups a connector loads)."""
    connector = getattr(scheduler, "connector", None)
    if connector is None:
        return None
    name = type(connector).__name__
    why = binding_refusal(connector)
    if why is not None:
        return why
    if getattr(connector, "supports_divergent_local_hybrid_hits", False):
        return f"the KV connector {name} asks for per-group (divergent) hybrid hits"
    if getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        return f"a KV connector ({name}) on a model that needs KV zeroing"
    if any(type(g.kv_cache_spec).__name__ == "MambaSpec"
           for g in kv_cache_config.kv_cache_groups):
        return f"a KV connector ({name}) on a model with a Mamba group"
    return None


def zeroed_group_ids(groups: Sequence[Any], attention_cls: type,
                     circular_cls: type) -> frozenset[int]:
    """The groups whose new blocks vLLM 0.33 hands out for zeroing (when the model needs
    zeroing): attention groups other than circular buffers."""
    return frozenset(i for i, g in enumerate(groups)
                     if isinstance(g.kv_cache_spec, attention_cls)
                     and not isinstance(g.kv_cache_spec, circular_cls))


__all__ = ["refusal", "scheduler_refusal", "zeroed_group_ids"]
