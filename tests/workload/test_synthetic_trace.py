"""The built-in chat trace: deterministic per seed, with shared system prompts and turns."""

from __future__ import annotations

import pytest

from kvpool.errors import InvalidConfig
from kvpool.workload.synthetic import ChatWorkload, synthetic_trace
from kvpool.workload.tokens import output_tokens

SMALL = {"num_requests": 300}


def test_the_same_seed_gives_the_same_trace():
    assert synthetic_trace(seed=3, **SMALL) == synthetic_trace(seed=3, **SMALL)


def test_different_seeds_give_different_traces():
    assert synthetic_trace(seed=1, **SMALL) != synthetic_trace(seed=2, **SMALL)


def test_the_trace_has_the_requested_size_unique_ids_and_sorted_arrivals():
    trace = synthetic_trace(**SMALL)
    assert len(trace) == 300
    assert len({r.id for r in trace}) == 300
    steps = [r.arrival_step for r in trace]
    assert steps == sorted(steps)
    assert all(r.prompt and r.output_len >= 1 for r in trace)


def test_about_half_of_the_requests_start_with_a_shared_system_prompt():
    workload = ChatWorkload(num_requests=400, seed=5)
    systems = workload.system_prompts()
    trace = workload.generate()
    starts = [next((i for i, s in enumerate(systems) if r.prompt[: len(s)] == s), None)
              for r in trace]
    share = sum(s is not None for s in starts) / len(trace)
    assert 0.3 <= share <= 0.7
    assert len({s for s in starts if s is not None}) >= 2  # several prompts really are shared


def test_a_follow_up_turn_extends_the_previous_prompt_and_its_generated_tokens():
    trace = synthetic_trace(**SMALL)
    by_id = {r.id: r for r in trace}
    follow_ups = 0
    for request in trace:
        conversation, turn = request.id.rsplit("-t", 1)
        if int(turn) == 0:
            continue
        previous = by_id[f"{conversation}-t{int(turn) - 1}"]
        prefix = previous.prompt + tuple(output_tokens(previous.id, previous.output_len))
        assert request.prompt[: len(prefix)] == prefix
        assert len(request.prompt) > len(prefix)  # plus a new user message
        assert request.arrival_step > previous.arrival_step + previous.output_len
        follow_ups += 1
    assert follow_ups >= 50


def test_prompts_respect_the_length_cap():
    workload = ChatWorkload(num_requests=200, max_prompt_tokens=2000)
    assert max(len(r.prompt) for r in workload.generate()) <= 2000


@pytest.mark.parametrize(
    "changes",
    [{"num_requests": 0}, {"seed": -1}, {"system_prompt_share": 1.5},
     {"system_prompt_tokens": (10, 5)}, {"conversation_rate": 0}, {"mean_turns": 0.5}],
)
def test_impossible_parameters_raise_invalid_config(changes):
    with pytest.raises(InvalidConfig):
        ChatWorkload(**changes).generate()


def test_generated_tokens_depend_only_on_the_id_and_extend_consistently():
    assert output_tokens("a", 10) == output_tokens("a", 20)[:10]
    assert output_tokens("a", 10) != output_tokens("b", 10)
    assert output_tokens("a", 0) == []
