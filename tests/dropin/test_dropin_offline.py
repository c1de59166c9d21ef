"""The drop-in's parts that need no vLLM: converting vLLM's configuration (read by attribute,
so stand-in objects named like vLLM's classes serve), the policy choice, and the plugin's
switch. The scheduler itself runs in the optional tier (test_scheduler_conformance.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

import kvpool.vllm as dropin
from kvpool.errors import InvalidConfig
from kvpool.policy import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    SlidingWindowSpec,
    make_kv_cache_manager,
)
from kvpool.policy import specs as kv
from kvpool.policy.fast import FastKVCacheManager, fast_policy_refusal
from kvpool.policy.fast_hybrid import FastHybridKVCacheManager
from kvpool.vllm.config import SUPPORTED_SPECS, UnsupportedConfig


def vllm_class(name: str, **defaults: object) -> type:
    """A frozen dataclass named like one of vLLM's spec classes (equality by fields)."""
    fields = {"block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype": "float16",
              **defaults}
    ns = {"__annotations__": {k: object for k in fields}}
    ns.update({k: field(default=v) for k, v in fields.items()})
    return dataclass(frozen=True)(type(name, (), ns))


@dataclass
class Group:
    kv_cache_spec: object
    layer_names: list = field(default_factory=lambda: ["layers.0"])
    is_eagle_group: bool = False


@dataclass
class Config:
    num_blocks: int
    kv_cache_groups: list


Full = vllm_class("FullAttentionSpec")
SWA = vllm_class("SlidingWindowSpec", sliding_window=128)
Mamba = vllm_class("MambaSpec", shapes=((4,),), dtypes=("float16",), mamba_type="mamba2",
                   mamba_cache_mode="align", num_speculative_blocks=0)
Chunked = vllm_class("ChunkedLocalAttentionSpec", attention_chunk_size=64)
RSWA = vllm_class("RSWASpec", rswa_window=256)
Sink = vllm_class("SinkFullAttentionSpec", sink_len=32)
Encoder = vllm_class("EncoderOnlyAttentionSpec")


def test_each_vllm_spec_converts_to_the_kvpool_spec_of_its_manager_family() -> None:
    assert dropin.convert_spec(Full()) == FullAttentionSpec(block_size=16, num_kv_heads=2,
                                                           head_size=64)
    assert dropin.convert_spec(SWA()) == SlidingWindowSpec(block_size=16, num_kv_heads=2,
                                                          head_size=64, sliding_window=128)
    mamba = dropin.convert_spec(Mamba())
    assert isinstance(mamba, MambaSpec) and mamba.mamba_cache_mode == "align"
    assert dropin.convert_spec(Chunked()).attention_chunk_size == 64
    assert dropin.convert_spec(RSWA()) == kv.RSWASpec(block_size=16, num_kv_heads=2,
                                                      head_size=64, rswa_window=256)
    assert dropin.convert_spec(Sink()).sink_len == 32
    assert {"FullAttentionSpec", "MLAAttentionSpec", "MambaSpec", "CrossAttentionSpec",
            "CircularBufferSpec", "SlidingWindowSpec"} <= set(SUPPORTED_SPECS)


def test_a_spec_class_kvpool_has_no_manager_for_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedConfig, match="EncoderOnlyAttentionSpec"):
        dropin.convert_spec(Encoder())
    with pytest.raises(UnsupportedConfig, match="does not convert"):
        dropin.convert_spec(Sink(sink_len=20))  # not a multiple of the block size
    assert issubclass(UnsupportedConfig, InvalidConfig) and issubclass(UnsupportedConfig,
                                                                       ValueError)


def test_groups_keep_their_order_eagle_marks_and_vllms_spec_equalities() -> None:
    config = Config(100, [Group(Full()), Group(SWA(), ["layers.1"], is_eagle_group=True)])
    converted = dropin.convert_kv_cache_config(config)
    assert converted.num_blocks == 100
    assert [type(g.kv_cache_spec) for g in converted.kv_cache_groups] == \
        [FullAttentionSpec, SlidingWindowSpec]
    assert [g.is_eagle_group for g in converted.kv_cache_groups] == [False, True]
    # Two Mamba specs that vLLM tells apart by their state shapes stay apart.
    two = dropin.convert_kv_cache_config(
        Config(100, [Group(Full()), Group(Mamba()), Group(Mamba(shapes=((8,),)))]))
    assert two.kv_cache_groups[1].kv_cache_spec != two.kv_cache_groups[2].kv_cache_spec


def test_specs_that_vllm_tells_apart_but_kvpool_cannot_are_refused() -> None:
    """Equal kvpool specs are looked up together: merging two groups vLLM keeps apart
    would change every hybrid lookup."""
    config = Config(100, [Group(Full()), Group(Full(dtype="float8")), Group(SWA())])
    with pytest.raises(UnsupportedConfig, match=r"kv_cache_groups\[0\] and \[1\]"):
        dropin.convert_kv_cache_config(config)


FULL = KVCacheConfig(64, (KVCacheGroupSpec(FullAttentionSpec(block_size=16)),))
HYBRID = KVCacheConfig(64, (KVCacheGroupSpec(FullAttentionSpec(block_size=16)),
                            KVCacheGroupSpec(SlidingWindowSpec(block_size=16,
                                                               sliding_window=32))))
WITH_MAMBA = KVCacheConfig(64, (KVCacheGroupSpec(FullAttentionSpec(block_size=16)),
                                KVCacheGroupSpec(MambaSpec(block_size=16,
                                                           mamba_cache_mode="align"))))


def test_auto_picks_the_fast_policy_where_it_serves_and_says_so() -> None:
    fast = make_kv_cache_manager(FULL, 1024, 16, 16, backend="fast")
    assert isinstance(fast, FastKVCacheManager) and "policy=fast" in repr(fast)
    hybrid = make_kv_cache_manager(HYBRID, 1024, 16, 16, backend="fast")
    assert isinstance(hybrid, FastHybridKVCacheManager)
    assert "running steps collapsed" in repr(hybrid)
    assert fast.policy_name == hybrid.policy_name == "fast"
    for config, backend in ((WITH_MAMBA, "fast"), (FULL, "reference")):
        generic = make_kv_cache_manager(config, 1024, 16, 16, backend=backend)
        assert type(generic) is KVCacheManager
    assert type(make_kv_cache_manager(FULL, 1024, 16, 16, backend="fast",
                                      policy="generic")) is KVCacheManager


def test_the_fast_policy_says_why_it_does_not_serve() -> None:
    assert fast_policy_refusal(FULL, 1024, 16, 16, backend="fast") is None
    assert fast_policy_refusal(HYBRID, 1024, 16, 16, backend="fast") is None
    assert "MambaSpec" in fast_policy_refusal(WITH_MAMBA, 1024, 16, 16, backend="fast")
    assert "EAGLE" in fast_policy_refusal(HYBRID, 1024, 16, 16, backend="fast",
                                          use_eagle=True)
    assert "backend 'reference'" in fast_policy_refusal(FULL, 1024, 16, 16,
                                                        backend="reference")
    with pytest.raises(InvalidConfig, match="does not serve"):
        make_kv_cache_manager(WITH_MAMBA, 1024, 16, 16, backend="fast", policy="fast")
    with pytest.raises(InvalidConfig, match="FastHybridKVCacheManager serves it"):
        FastKVCacheManager(HYBRID, 1024, 16, 16, backend="fast")
    with pytest.raises(InvalidConfig, match="policy must be one of"):
        make_kv_cache_manager(FULL, 1024, 16, 16, backend="fast", policy="quick")


def test_the_plugin_does_nothing_unless_the_switch_is_set(monkeypatch) -> None:
    monkeypatch.delenv("KVPOOL_VLLM_BACKEND", raising=False)
    dropin.register()  # must not even import vLLM
    assert dropin.installed() is None
    monkeypatch.setenv("KVPOOL_VLLM_BACKEND", "turbo")
    with pytest.raises(InvalidConfig, match="backend must be one of"):
        dropin.register()


def test_the_plugin_is_declared_for_vllm() -> None:
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml")
                            .read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {
        "kvpool": "kvpool.vllm:register"}


def test_importing_the_drop_in_does_not_import_vllm() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, kvpool.vllm; "
                          "print('vllm' in sys.modules)"], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"



# -- vLLM 0.33: what the drop-in refuses (kvpool.vllm.v033_checks, read by attribute) ------

@dataclass
class Config033:
    num_blocks: int
    kv_cache_groups: list
    prefix_cache_retention_interval: object = None
    hisparse_host_num_blocks: object = None
    cache_hit_alignment_tokens: object = None
    needs_kv_cache_zeroing: bool = False


@dataclass
class Role:
    value: str


@dataclass
class Group033(Group):
    role: object = field(default_factory=lambda: Role("default"))
    host_resident: bool = False


def test_vllm_033_configurations_kvpool_serves_pass_the_checks() -> None:
    from kvpool.vllm.v033_checks import refusal

    assert refusal(Config033(64, [Group033(Full())])) is None
    assert refusal(Config033(64, [Group033(Full()), Group033(SWA())])) is None
    assert refusal(Config033(64, [Group033(Full()), Group033(Mamba())]),
                   num_prefill_lookahead=1) is None  # EAGLE's one-token lookahead


@pytest.mark.parametrize("config, kwargs, why", [
    (Config033(64, [Group033(Full())], prefix_cache_retention_interval=0), {},
     "prefix_cache_retention_interval=0"),
    (Config033(64, [Group033(Full())], hisparse_host_num_blocks=8), {},
     "hisparse_host_num_blocks"),
    (Config033(64, [Group033(Full())], cache_hit_alignment_tokens=32), {},
     "cache_hit_alignment_tokens"),
    (Config033(64, [Group033(Full())]), {"num_hash_lookahead_tokens": 2}, "lookahead"),
    (Config033(64, [Group033(Full())]), {"num_prefill_lookahead": 3}, "MTP"),
    (Config033(64, [Group033(Full(), role=Role("hisparse_source"))]), {}, "role"),
    (Config033(64, [Group033(Full(), host_resident=True)]), {}, "host-resident"),
    (Config033(64, [Group033(Full()), Group033(vllm_class(
        "MambaSpec", shapes=((4,),), dtypes=("float16",), mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=1)())]), {}, "num_prefill_checkpoint_blocks"),
    (Config033(64, [Group033(Full()), Group033(vllm_class(
        "SlidingWindowSpec", sliding_window=128, extra_retained_tokens=16)())]), {},
     "extra_retained_tokens"),
    (Config033(64, [Group033(vllm_class("FullAttentionSpec", sliding_window=128)())]), {},
     "FullAttentionSpec.sliding_window"),
    (Config033(64, [Group033(vllm_class("MLAAttentionSpec", non_causal=True)())]), {},
     "non_causal"),
])
def test_vllm_033_features_kvpool_does_not_serve_are_refused_by_name(config, kwargs,
                                                                      why) -> None:
    from kvpool.vllm.v033_checks import refusal

    answer = refusal(config, **kwargs)
    assert answer is not None and why in answer


class KVConnectorBase_V1:  # noqa: N801 - named like vLLM's connector base class
    def bind_kv_cache_manager(self, manager: object) -> None: ...
    def bind_gpu_block_pool(self, pool: object) -> None: ...


class PlainConnector(KVConnectorBase_V1):
    pass


class BindingConnector(KVConnectorBase_V1):
    def bind_gpu_block_pool(self, pool: object) -> None: ...


class DivergentConnector(KVConnectorBase_V1):
    supports_divergent_local_hybrid_hits = True


@dataclass
class Scheduler:
    connector: object = None


def test_a_kv_connector_is_served_only_through_the_managers_public_calls() -> None:
    from kvpool.vllm.v033_checks import scheduler_refusal

    full = Config033(64, [Group033(Full())])
    assert scheduler_refusal(Scheduler(), full) is None
    assert scheduler_refusal(Scheduler(PlainConnector()), full) is None
    assert "bind_gpu_block_pool" in scheduler_refusal(Scheduler(BindingConnector()), full)
    assert "divergent" in scheduler_refusal(Scheduler(DivergentConnector()), full)
    hybrid = Config033(64, [Group033(Full()), Group033(Mamba())])
    assert "Mamba" in scheduler_refusal(Scheduler(PlainConnector()), hybrid)
    zeroed = Config033(64, [Group033(Full())], needs_kv_cache_zeroing=True)
    assert "zeroing" in scheduler_refusal(Scheduler(PlainConnector()), zeroed)
    assert scheduler_refusal(Scheduler(), hybrid) is None  # no connector: served


def test_a_connector_that_binds_vllms_pool_is_refused_on_every_version() -> None:
    """vLLM 0.25's scheduler hands ``bind_gpu_block_pool`` the manager's pool too: a
    connector that reads it (SimpleCPUOffloadConnector) is refused there as well; 0.25 has
    none of 0.33's other rules (a plain connector on a Mamba model is served)."""
    from kvpool.vllm.config import UnsupportedConfig
    from kvpool.vllm.connectors import binding_refusal
    from kvpool.vllm.install import _check_scheduler

    assert binding_refusal(None) is None and binding_refusal(PlainConnector()) is None
    assert "bind_gpu_block_pool" in binding_refusal(BindingConnector())
    hybrid = Config033(64, [Group033(Full()), Group033(Mamba())])

    @dataclass
    class Building:  # the scheduler object _check_scheduler reads
        connector: object
        kv_cache_config: object

    for version in ((0, 25), (0, 33)):
        with pytest.raises(UnsupportedConfig, match=rf"vLLM {version[0]}\.{version[1]}: "
                                                    "the KV connector BindingConnector"):
            _check_scheduler(Building(BindingConnector(), Config033(64, [Group033(Full())])),
                             version)
    _check_scheduler(Building(PlainConnector(), hybrid), (0, 25))
    with pytest.raises(UnsupportedConfig, match="Mamba"):
        _check_scheduler(Building(PlainConnector(), hybrid), (0, 33))
    _check_scheduler(None, (0, 25))  # not called from a scheduler: nothing to read


def test_vllm_033_zeroes_the_new_blocks_of_attention_groups_but_circular_buffers() -> None:
    from kvpool.vllm.v033_checks import zeroed_group_ids

    class Attention:
        pass

    class Circular(Attention):
        pass

    @dataclass
    class G:
        kv_cache_spec: object

    groups = [G(Attention()), G(Circular()), G(object()), G(Attention())]
    assert zeroed_group_ids(groups, Attention, Circular) == frozenset({0, 3})


def test_the_supported_vllm_versions_are_0_25_and_0_33() -> None:
    from kvpool.vllm.install import SUPPORTED_VLLM

    assert SUPPORTED_VLLM == ((0, 25), (0, 33))
