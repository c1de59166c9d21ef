"""vLLM's KV cache configuration, converted to kvpool's (what the drop-in manager is built on).

Each vLLM spec class maps to the kvpool spec its manager family implements; the class is
matched exactly (``type(spec).__name__``), so a vLLM spec class kvpool does not know — a new
one, or one of a known family that kvpool has no manager for — is refused at engine start with
:class:`UnsupportedConfig` instead of being treated as its base class::

    FullAttentionSpec, TQFullAttentionSpec      -> FullAttentionSpec
    MLAAttentionSpec, HiddenStateCacheSpec      -> MLAAttentionSpec
    RSWASpec / SinkFullAttentionSpec            -> RSWASpec / SinkFullAttentionSpec
    SlidingWindowSpec / SlidingWindowMLASpec    -> SlidingWindowSpec / SlidingWindowMLASpec
    ChunkedLocalAttentionSpec                   -> ChunkedLocalAttentionSpec
    MambaSpec                                   -> MambaSpec (mode, speculative blocks)
    CrossAttentionSpec                          -> CrossAttentionSpec
    CircularBufferSpec (vLLM 0.33)              -> CircularBufferSpec

Groups whose vLLM specs are equal are looked up together by the hybrid coordinator, so the
conversion must keep vLLM's equalities exactly: two vLLM specs that differ only in a field
kvpool does not model (a dtype, a quantisation mode) would merge into one kvpool spec group
and change the lookups. That configuration is refused too (never a wrong answer later).

Only this module and :mod:`kvpool.vllm.manager` read vLLM objects; nothing here imports vLLM
(the objects are read by attribute), so the conversion is testable without it.
"""

from __future__ import annotations

from typing import Any

from kvpool.errors import InvalidConfig
from kvpool.policy import specs as kv


class UnsupportedConfig(InvalidConfig):
    """The vLLM configuration uses something kvpool does not implement (a spec class, or a
    combination that would make kvpool answer differently from vLLM)."""


def _attention(spec: Any) -> dict[str, Any]:
    return dict(block_size=spec.block_size, num_kv_heads=spec.num_kv_heads,
                head_size=spec.head_size)


def _mamba(spec: Any) -> kv.MambaSpec:
    # vLLM tells Mamba specs apart by their state shapes and dtypes: kvpool by a tag.
    tag = repr((tuple(spec.shapes), tuple(str(d) for d in spec.dtypes),
                getattr(spec, "mamba_type", None)))
    return kv.MambaSpec(block_size=spec.block_size,
                        mamba_cache_mode=getattr(spec, "mamba_cache_mode", "none") or "none",
                        num_speculative_blocks=getattr(spec, "num_speculative_blocks", 0),
                        state_tag=tag)


_CONVERTERS: dict[str, Any] = {
    "FullAttentionSpec": lambda s: kv.FullAttentionSpec(**_attention(s)),
    "TQFullAttentionSpec": lambda s: kv.FullAttentionSpec(**_attention(s)),
    "MLAAttentionSpec": lambda s: kv.MLAAttentionSpec(**_attention(s)),
    "HiddenStateCacheSpec": lambda s: kv.MLAAttentionSpec(**_attention(s)),
    "RSWASpec": lambda s: kv.RSWASpec(rswa_window=s.rswa_window, **_attention(s)),
    "SinkFullAttentionSpec": lambda s: kv.SinkFullAttentionSpec(sink_len=s.sink_len,
                                                                 **_attention(s)),
    "SlidingWindowSpec": lambda s: kv.SlidingWindowSpec(sliding_window=s.sliding_window,
                                                         **_attention(s)),
    "SlidingWindowMLASpec": lambda s: kv.SlidingWindowMLASpec(sliding_window=s.sliding_window,
                                                               **_attention(s)),
    "ChunkedLocalAttentionSpec": lambda s: kv.ChunkedLocalAttentionSpec(
        attention_chunk_size=s.attention_chunk_size, **_attention(s)),
    "CrossAttentionSpec": lambda s: kv.CrossAttentionSpec(**_attention(s)),
    "CircularBufferSpec": lambda s: kv.CircularBufferSpec(**_attention(s)),
    "MambaSpec": _mamba,
}

SUPPORTED_SPECS = tuple(sorted(_CONVERTERS))
"""The vLLM spec class names kvpool converts."""


def convert_spec(spec: Any) -> kv.KVCacheSpec:
    """kvpool's spec for one vLLM spec; :class:`UnsupportedConfig` for any other class."""
    name = type(spec).__name__
    convert = _CONVERTERS.get(name)
    if convert is None:
        raise UnsupportedConfig(
            f"kvpool has no manager for vLLM's {name}; supported: {', '.join(SUPPORTED_SPECS)}")
    try:
        return convert(spec)  # type: ignore[no-any-return]
    except InvalidConfig as error:
        raise UnsupportedConfig(f"vLLM's {name} does not convert: {error}") from error


def convert_kv_cache_config(config: Any) -> kv.KVCacheConfig:
    """kvpool's :class:`~kvpool.policy.specs.KVCacheConfig` for vLLM's (same groups, same
    order, same EAGLE marks), refusing what kvpool would answer differently."""
    groups = list(config.kv_cache_groups)
    vllm_specs = [g.kv_cache_spec for g in groups]
    specs = [convert_spec(s) for s in vllm_specs]
    for i in range(len(specs)):
        for j in range(i + 1, len(specs)):
            if (vllm_specs[i] == vllm_specs[j]) != (specs[i] == specs[j]):
                raise UnsupportedConfig(
                    f"kv_cache_groups[{i}] and [{j}] have different vLLM specs that kvpool "
                    f"cannot tell apart ({type(vllm_specs[i]).__name__} and "
                    f"{type(vllm_specs[j]).__name__}); they would be looked up together")
    return kv.KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_groups=tuple(
            kv.KVCacheGroupSpec(spec, is_eagle_group=bool(getattr(g, "is_eagle_group", False)),
                                layer_names=tuple(g.layer_names))
            for g, spec in zip(groups, specs, strict=True)))


__all__ = ["SUPPORTED_SPECS", "UnsupportedConfig", "convert_kv_cache_config", "convert_spec"]
