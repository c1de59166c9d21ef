"""The self-check (``kvpool.verify.selfcheck``): its plants apply, and CrossHair finds them.

Each plant weakens one §12 refusal of a batch verb, or one batch-order postcondition, in a copy
of the spec. The default run checks that every plant still applies and searches a few of
them at the CI budget (issue 24's two blind spots with their focused contracts); ``-m slow``
searches all of them, which is the table in ``docs/contracts.md`` (about ten minutes).
"""

from __future__ import annotations

import pytest

pytest.importorskip("crosshair")
pytest.importorskip("icontract")

from kvpool.verify.selfcheck import PLANTS, check_plant, planted_source  # noqa: E402

BY_NAME = {p.name: p for p in PLANTS}

BATCH_VERBS = ("free_blocks", "touch", "unpin_blocks", "cache_full_blocks", "evict_blocks",
               "move_block_hashes", "get_cached_block")

QUICK = (
    # a repeated id, a null block inside the batch, the order of new watchers
    "free_blocks.counts_a_repeated_id_once",
    "unpin_blocks.refuses_a_leading_null_block_only",
    "unpin_blocks.new_watchers_first",
)

BLIND_SPOTS = (
    # issue 24's two: missed by the large contracts at the CI budget, found by the focused ones
    "free_blocks.front_order_reversed",
    "cache_full_blocks.accepts_a_repeated_block",
)


def test_every_plant_applies_to_the_spec_exactly_once():
    from kvpool.verify.mutate import SPEC

    for plant in PLANTS:  # planted_source raises unless the text occurs exactly once
        assert planted_source(plant) != (SPEC / plant.module).read_text(), plant.name


def test_a_plant_whose_text_is_gone_fails_loudly():
    from dataclasses import replace

    stale = replace(PLANTS[0], old="text that is not in the spec")
    with pytest.raises(ValueError, match="not once"):
        planted_source(stale)


def test_every_batch_verb_has_refusal_plants_and_names_are_unique():
    assert len(BY_NAME) == len(PLANTS)
    for verb in BATCH_VERBS:
        refusals = [p for p in PLANTS if p.kind == "refusal" and p.contract == f"{verb}_rejection"]
        assert refusals, verb
    assert {p.kind for p in PLANTS} == {"refusal", "order"}


@pytest.mark.parametrize("name", QUICK)
def test_kvpool_contracts_finds_the_planted_batch_bug_at_the_ci_budget(name):
    result = check_plant(BY_NAME[name])
    assert result.status == "found", result


@pytest.mark.parametrize("name", BLIND_SPOTS)
def test_the_focused_contract_finds_the_blind_spot_at_the_ci_budget(name):
    plant = BY_NAME[name]
    result = check_plant(plant, contracts=(plant.focused,))
    assert result.status == "found", result
    assert result.found_by == plant.focused
    if plant.kind == "refusal":  # explain reads the focused contract's call tuple back
        assert "§12 rows: InvalidArgument" in result.broken, result.broken
    else:
        assert "free_blocks_post clause false: after.free_queue ==" in result.broken, result


def test_every_plant_the_large_contract_may_miss_has_a_focused_contract():
    from kvpool.verify.crosshair_check import focused_contract_names

    for name in BLIND_SPOTS:
        assert BY_NAME[name].focused in focused_contract_names()
    assert {p.focused for p in PLANTS if p.focused} <= set(focused_contract_names())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_plant_is_found_at_the_ci_budget(name):
    result = check_plant(BY_NAME[name])
    assert result.status == "found", result
