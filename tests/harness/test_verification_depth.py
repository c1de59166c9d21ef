"""The harness's own blind spots (issue 9): valid rules, version scope, set order, requests.

Each test here failed before its fix: a "valid" rule the oracle rejected was hidden behind
equal errors; a pool without a method was called anyway; set-ordered secondary keys were a
divergence at a random step; vLLM's request attribute names were not provided.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from kvpool.harness import Divergence, lockstep, run_check
from kvpool.harness.api import FULL_API, PoolApi, common_api
from kvpool.harness.differential import shrink_warning
from kvpool.harness.foreign.vllm_pool import (
    VllmBlockPoolAdapter,
    VllmRequestView,
    _EnvPinned,
    api_of_version,
)
from kvpool.harness.pool.config import HarnessConfig
from kvpool.harness.pool.machine import PoolMachine
from kvpool.harness.pool.set_order import align_events, align_state
from kvpool.harness.requests import REQUEST_EXTRAS
from kvpool.harness.rules.cache import CacheRules
from kvpool.harness.rules.invalid import InvalidCallRules
from kvpool.harness.rules.release import ReleaseRules
from kvpool.request import LoRARequest, MultiModalFeature, Request

from .vllm_like_pool import VllmLikeBlockPool

# -- item 1: a valid rule the oracle rejects is a harness bug ------------------------------------


def test_a_call_the_oracle_rejects_fails_loudly_when_the_rule_meant_it_to_be_valid():
    pool = lockstep(["spec", "reference"], num_blocks=4)
    pool.must_accept, pool.rule = True, "some_valid_rule"
    with pytest.raises(Divergence) as caught:
        pool.get_new_blocks(9)
    assert caught.value.kind == "harness" and "some_valid_rule" in caught.value.detail


def test_only_the_invalid_call_rules_may_be_rejected():
    machine = type("M", (InvalidCallRules, CacheRules, ReleaseRules), {})
    assert machine._rule_is_valid("a_request_is_scheduled_reusing_its_cached_prefix")
    assert machine._rule_is_valid("caching_full_blocks_keys_each_new_position")
    assert machine._rule_is_valid("freeing_a_table_in_reverse_order_evicts_its_tail_first")
    assert not machine._rule_is_valid("double_free_raises_and_changes_nothing")
    assert PoolMachine.rules_are_valid and not InvalidCallRules.rules_are_valid


def test_a_table_model_that_forgets_completed_positions_is_caught_as_a_harness_bug(monkeypatch):
    """Before the fix the model re-cached a block that a partial entry or a move had keyed."""

    def num_cached_only(self, table):
        return table.num_cached, min(len(table.blocks), len(self.hashes(table.request)))

    monkeypatch.setattr(PoolMachine, "cacheable_range", num_cached_only)
    shapes = (HarnessConfig(num_blocks=16, hash_block_size=2, block_size=4),)
    report = run_check(["spec"], 6000, seed=1, shapes=shapes, invalid_calls=False,
                       shrink=False)
    assert report.failure_kind == "harness", report.failure
    assert "HashStateError" in report.failure


# -- item 2: version scope -------------------------------------------------------------------


def test_version_table_names_what_each_vllm_release_offers():
    old, new = api_of_version("0.25.1"), api_of_version("0.33.0")
    assert old.missing() == [
        "unpin_blocks", "is_block_writable", "move_block_hashes", "emit_cached_block_events",
        "replace_existing_hashes", "foreign_blocks", "null_block_skipped",
        "partial_any_boundary", "lookahead", "mm_window_index",
    ]
    assert new.missing() == [] and new.secondary_key_order == "set"
    assert api_of_version("0.30").unpin_blocks and not api_of_version("0.30").lookahead
    with pytest.raises(ValueError):
        api_of_version("latest")


def test_a_scope_lacking_a_family_turns_its_flags_off():
    cfg = HarnessConfig(api=PoolApi(unpin_blocks=False, foreign_blocks=False))
    assert not cfg.watchers and not cfg.foreign_blocks
    both = common_api([FULL_API, PoolApi(move_block_hashes=False, secondary_key_order="set")])
    assert not both.move_block_hashes and both.unpin_blocks and both.secondary_key_order == "set"


class _Old(VllmLikeBlockPool):
    """A vLLM-0.25-shaped pool: the newer methods are gone, null-block refs are counted."""

    def __getattribute__(self, name):
        if name in ("unpin_blocks", "is_block_writable", "move_block_hashes",
                    "emit_cached_block_events"):
            raise AttributeError(f"vLLM 0.25.1 has no {name}")
        return super().__getattribute__(name)

    def touch(self, blocks):
        blocks = list(blocks)
        assert not any(b.is_null for b in blocks), "0.25.1 would count the null block"
        super().touch(blocks)

    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        assert not any(b.is_null for b in blocks), "0.25.1 would count the null block"
        super().free_blocks(blocks)

    def cache_partial_block(self, request, block, num_tokens, kv_cache_group_id, block_size,
                            *rest):
        assert not rest, "0.25.1 has no replace_existing_hashes"
        if not block.is_null:
            assert block_size > self.hash_block_size and num_tokens % block_size != 0
        return super().cache_partial_block(request, block, num_tokens, kv_cache_group_id,
                                           block_size)


def old_vllm_like(num_blocks, *, enable_caching=True, hash_block_size=16,
                  enable_kv_cache_events=False, **_):
    api = api_of_version("0.25.1")
    pool = _Old(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events)
    return VllmBlockPoolAdapter(pool, pool_api=api)


old_vllm_like.pool_api = api_of_version("0.25.1")


def test_a_pool_is_only_sent_the_calls_its_version_has():
    report = run_check(["spec", old_vllm_like], 3000, seed=3, invalid_calls=False, shrink=False)
    assert report.ok, report.failure
    assert "unpin_blocks" in report.not_generated and "lookahead" in report.not_generated
    assert not any("lookahead" in shape for shape in report.shapes)


# -- item 3: set order -----------------------------------------------------------------------


class _SetOrdered(VllmBlockPoolAdapter):
    """The fake with secondary keys (and removals) reported in another order, as a set may."""

    def snapshot(self):
        state = super().snapshot()
        flipped = {b: tuple(reversed(k)) for b, k in state.secondary_keys.items()}
        return dataclasses.replace(state, secondary_keys=flipped)


def test_secondary_keys_of_a_set_ordered_pool_are_compared_as_sets():
    def make(declared):
        def factory(n, *, enable_caching=True, hash_block_size=16, enable_kv_cache_events=False):
            pool = VllmLikeBlockPool(n, enable_caching, hash_block_size, enable_kv_cache_events)
            return _SetOrdered(pool, pool_api=PoolApi(secondary_key_order=declared))
        return factory

    def drive(pool):
        r = pool.make_request([1, 2, 3, 4, 5, 6])
        pool.get_new_blocks(3)
        pool.cache_full_blocks(r, [1, 2, 3], 0, 3, 2, 0)
        pool.cache_partial_block(r, 3, 2, 1, 2)
        pool.cache_partial_block(r, 3, 4, 1, 2)  # block 3: two secondary keys

    ok = lockstep(["spec", make("set")], num_blocks=6, hash_block_size=2)
    drive(ok)
    assert sum(ok.deviations.values()) >= 1
    strict = lockstep(["spec", make("insertion")], num_blocks=6, hash_block_size=2)
    with pytest.raises(Divergence) as caught:
        drive(strict)
    assert caught.value.kind == "state" and "secondary_keys" in caught.value.detail


def test_set_alignment_never_hides_a_different_key_or_event():
    from kvpool.events import BlockRemoved
    from kvpool.spec.state import initial_state

    a, b, c = (BlockRemoved([x], "GPU", 0, seq=i) for i, x in enumerate((1, 2, 3)))
    swapped = [dataclasses.replace(b, seq=0), dataclasses.replace(a, seq=1), c]
    assert align_events([a, b, c], swapped) == ([a, b, c], True)
    other = [a, dataclasses.replace(b, block_hashes=[9]), c]
    assert align_events([a, b, c], other) == (other, False)
    base = initial_state(3)
    x = dataclasses.replace(base, secondary_keys={1: (b"k", b"j")})
    y = dataclasses.replace(base, secondary_keys={1: (b"j", b"k")})
    z = dataclasses.replace(base, secondary_keys={1: (b"j", b"z")})
    assert align_state(x, y) == (x, True) and align_state(x, z) == (z, False)


def test_every_reproduction_names_the_hash_seed():
    pool = lockstep(["spec"], num_blocks=4)
    pool.get_new_blocks(1)
    text = pool.log.render_test()
    assert "PYTHONHASHSEED=" in text
    compile(text, "<reproduction>", "exec")


# -- item 4: requests, options, output -------------------------------------------------------


def test_requests_reach_vllm_under_its_attribute_names():
    request = Request("r", [1, 2, 3, 4], lora_request=LoRARequest("ad", 5, "/p"),
                      mm_features=[MultiModalFeature("img", 1, 2)], cache_salt="s",
                      session_id="sess")
    view = VllmRequestView(request)
    assert view.lora_request.adapter_id == 5 and view.lora_request.name == "ad"
    assert view.lora_request.lora_name == "ad" and view.lora_request.lora_path == "/p"
    assert view.mm_features[0].identifier == "img"
    position = view.mm_features[0].mm_position
    assert (position.offset, position.length) == (1, 2)
    assert view.cache_salt == "s" and view.session_id == "sess" and view.num_tokens == 4
    request.append_output_token_ids([5])
    assert view.all_token_ids == [1, 2, 3, 4, 5] and view.block_hashes is request.block_hashes
    adapter = VllmBlockPoolAdapter(VllmLikeBlockPool(4, True, 2, False))
    assert adapter.to_request(request) is adapter.to_request(request)


def test_requests_with_lora_multimodal_and_salt_replay_in_a_reproduction():
    pool = lockstep(["spec", "reference"], num_blocks=8, hash_block_size=2,
                    enable_kv_cache_events=True)
    requests = [pool.make_request([1, 2, 3, 4, 5, 6], extras=i) for i in range(len(REQUEST_EXTRAS))]
    assert len({tuple(r.block_hashes) for r in requests}) == len(REQUEST_EXTRAS)
    assert "extras=4" in pool.log.render_test()


def test_the_int_hash_switch_is_pinned_around_each_call_only(monkeypatch):
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)

    class Pool:
        def read(self):
            return os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES")

    pinned = _EnvPinned(Pool(), {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"})
    assert pinned.read() == "0"
    assert "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES" not in os.environ


def test_json_output_stays_json_when_a_pool_prints_to_stdout(capfd):
    from kvpool.cli.check import _stdout_to_stderr

    with _stdout_to_stderr(True):
        os.write(1, b"INFO vllm says hello\n")
    print('{"ok": true}')
    out, err = capfd.readouterr()
    assert out == '{"ok": true}\n' and "vllm says hello" in err


def test_the_shrink_warning_names_the_cap_not_five_minutes():
    text = ("WARNING: Hypothesis has spent more than five minutes working to shrink a failing "
            "test case, and stopped because it is making very slow progress.")
    assert "20 s cap" in shrink_warning(text, 20) and "five minutes" not in shrink_warning(text, 20)
    assert shrink_warning("something else", 20) == "something else"
