"""Extra keys: order, the multimodal walk, salt, prompt embeddings and the event form."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvpool.errors import InvalidArgument
from kvpool.hashing import (
    event_extra_keys,
    generate_block_hash_extra_keys,
    lookahead_token_ids,
    mm_start_index,
    need_extra_keys,
    untag_extra_key,
)
from kvpool.request import LoRARequest, MultiModalFeature, Request


def _mm_request(*features: tuple[str | None, int, int], num_tokens: int = 64) -> Request:
    return Request(
        "mm",
        list(range(num_tokens)),
        mm_features=[
            MultiModalFeature(ident, offset, length) for ident, offset, length in features
        ],
    )


def test_item_ending_inside_the_window_gives_a_negative_offset_and_advances_the_index() -> None:
    request = _mm_request(("img", 10, 20))  # tokens [10, 30)

    keys, next_index = generate_block_hash_extra_keys(request, 16, 32, 0)

    assert keys == (("mm", "img", -6),)
    assert next_index == 1


def test_item_running_past_the_window_gives_the_same_key_and_keeps_the_index() -> None:
    request = _mm_request(("img", 10, 30))  # tokens [10, 40)

    keys, next_index = generate_block_hash_extra_keys(request, 16, 32, 0)

    assert keys == (("mm", "img", -6),)
    assert next_index == 0


def test_item_ending_exactly_at_the_window_end_advances_the_index() -> None:
    request = _mm_request(("img", 16, 16))  # tokens [16, 32)

    assert generate_block_hash_extra_keys(request, 16, 32, 0) == ((("mm", "img", 0),), 1)


def test_walk_skips_items_before_the_window_and_stops_at_items_after_it() -> None:
    request = _mm_request(("a", 0, 4), ("b", 20, 4), ("c", 30, 4), ("d", 40, 4))

    keys, next_index = generate_block_hash_extra_keys(request, 16, 32, 0)

    assert keys == (("mm", "b", 4), ("mm", "c", 14))
    assert next_index == 2  # "c" ends at 34, past the window: the next block sees it too


def test_item_ending_exactly_at_the_window_start_is_not_a_key() -> None:
    request = _mm_request(("a", 8, 8), ("b", 32, 4))  # "a" covers [8, 16)

    keys, next_index = generate_block_hash_extra_keys(request, 16, 32, 0)

    assert keys is None
    assert next_index == 1


def test_negative_start_index_counts_from_the_end() -> None:
    request = _mm_request(("a", 0, 4), ("b", 20, 4))

    keys, next_index = generate_block_hash_extra_keys(request, 16, 32, -1)

    assert keys == (("mm", "b", 4),)
    assert next_index == 2
    with pytest.raises(InvalidArgument, match="out of range"):
        generate_block_hash_extra_keys(request, 16, 32, -3)


def test_window_after_the_last_item_has_no_keys_and_keeps_the_index() -> None:
    request = _mm_request(("a", 0, 4), ("b", 20, 4))

    assert generate_block_hash_extra_keys(request, 32, 48, -1) == (None, -1)
    assert generate_block_hash_extra_keys(request, 24, 40, 5) == (None, 5)


def test_an_item_without_identifier_is_an_error() -> None:
    request = _mm_request((None, 0, 4))

    with pytest.raises(InvalidArgument, match="no identifier"):
        generate_block_hash_extra_keys(request, 0, 16, 0)


def test_window_search_finds_the_first_item_ending_after_start() -> None:
    features = _mm_request(("a", 0, 4), ("b", 20, 4), ("c", 40, 10)).mm_features  # ends 4, 24, 50

    assert [mm_start_index(features, s) for s in (0, 3, 4, 23, 24, 49)] == [0, 0, 1, 1, 2, 2]
    assert mm_start_index(features, 50) == 0  # nothing ends later: the walk stops at once
    assert mm_start_index([], 10) == 0


def test_keys_come_in_order_lora_mm_salt_embeds() -> None:
    embeds = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    request = Request(
        "r",
        list(range(64)),
        lora_request=LoRARequest("adapter", 3, "/adapters/a"),
        mm_features=[MultiModalFeature("img", 2, 4)],
        cache_salt="tenant",
        prompt_embeds=embeds,
    )

    keys, _ = generate_block_hash_extra_keys(request, 0, 16, 0)

    digest = hashlib.sha256(embeds[0:16].tobytes()).digest()
    assert keys == (
        ("lora", "adapter", "/adapters/a"),
        ("mm", "img", 2),
        ("cache_salt", "tenant"),
        ("prompt_embeds", digest),
    )
    assert need_extra_keys(request)


def test_salt_enters_only_the_first_block_and_an_empty_salt_never() -> None:
    salted = Request("r", list(range(32)), cache_salt="tenant")
    empty = Request("r", list(range(32)), cache_salt="")

    assert generate_block_hash_extra_keys(salted, 0, 16)[0] == (("cache_salt", "tenant"),)
    assert generate_block_hash_extra_keys(salted, 16, 32)[0] is None
    assert generate_block_hash_extra_keys(empty, 0, 16)[0] is None
    assert not need_extra_keys(Request("plain", [1, 2, 3]))


def test_lora_key_names_the_adapter_and_its_path_on_every_block() -> None:
    request = Request("r", list(range(48)), lora_request=LoRARequest("a", 1))

    for start in (0, 16, 32):
        keys, _ = generate_block_hash_extra_keys(request, start, start + 16)
        assert keys == (("lora", "a", ""),)


def test_prompt_embeds_digest_is_memoised_per_window() -> None:
    embeds = np.zeros((32, 2), dtype=np.float32)
    request = Request("r", list(range(32)), prompt_embeds=embeds)
    before = generate_block_hash_extra_keys(request, 0, 16)[0]

    embeds[0, 0] = 1.0  # the memo, not the array, answers for a window already hashed
    after = generate_block_hash_extra_keys(request, 0, 16)[0]
    fresh = generate_block_hash_extra_keys(request, 16, 32)[0]

    assert before == after
    assert before is not None and fresh is not None
    assert before[0][1] == hashlib.sha256(np.zeros((16, 2), np.float32).tobytes()).digest()
    assert fresh[0][1] == hashlib.sha256(embeds[16:32].tobytes()).digest()


def test_torch_and_numpy_embeddings_with_equal_bytes_hash_alike() -> None:
    torch = pytest.importorskip("torch")
    values = np.linspace(0, 1, 40, dtype=np.float32).reshape(20, 2)
    as_numpy = Request("n", list(range(20)), prompt_embeds=values)
    as_torch = Request("t", list(range(20)), prompt_embeds=torch.from_numpy(values.copy()))
    as_bf16 = Request("b", list(range(20)), prompt_embeds=torch.ones(20, 2, dtype=torch.bfloat16))

    assert as_numpy.prompt_embeds_digest(0, 16) == as_torch.prompt_embeds_digest(0, 16)
    assert len(as_bf16.prompt_embeds_digest(0, 16)) == 32
    with pytest.raises(InvalidArgument, match="no prompt embeddings"):
        Request("none", [1]).prompt_embeds_digest(0, 1)


def test_event_keys_are_untagged() -> None:
    embeds = np.ones((32, 2), dtype=np.float32)
    request = Request(
        "r",
        list(range(32)),
        lora_request=LoRARequest("adapter", 3, "/p"),
        mm_features=[MultiModalFeature("img", 10, 20)],
        cache_salt="tenant",
        prompt_embeds=embeds,
    )
    digest_0 = request.prompt_embeds_digest(0, 16)
    digest_1 = request.prompt_embeds_digest(16, 32)

    assert event_extra_keys(request, 0, 16) == ("adapter", ("img", 10), "tenant", digest_0)
    assert event_extra_keys(request, 16, 32) == ("adapter", ("img", -6), digest_1)
    assert event_extra_keys(Request("plain", list(range(16))), 0, 16) is None


def test_event_keys_find_the_multimodal_index_without_a_prior_walk() -> None:
    request = _mm_request(("a", 0, 4), ("b", 20, 4), ("c", 36, 4))

    assert event_extra_keys(request, 32, 48) == (("c", 4),)
    assert event_extra_keys(request, 16, 32) == (("b", 4),)


def test_event_keys_with_lookahead_cover_the_lookahead_tokens() -> None:
    request = _mm_request(("img", 17, 2), num_tokens=32)

    assert event_extra_keys(request, 0, 16) is None
    assert event_extra_keys(request, 0, 16, num_lookahead_tokens=2) == (("img", 17),)
    assert lookahead_token_ids(request, 16, 2) == [16, 17]
    assert lookahead_token_ids(request, 16, 0) == []


def test_untagging_rejects_unknown_tags() -> None:
    assert untag_extra_key(("mm", "x", 3)) == ("x", 3)
    with pytest.raises(InvalidArgument, match="unknown extra key tag"):
        untag_extra_key(("colour", "blue"))
