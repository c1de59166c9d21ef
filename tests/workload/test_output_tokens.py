"""The generated tokens: all of a run at once (numpy) must equal the LCG stepped token by token.

``output_tokens`` computes a run of 16 or more tokens from jump tables (each state as
``mult[k] * seed + add[k]`` mod 2**32) and shorter runs with the loop that defines them. The
replay's decisions and every trace's follow-up prompts depend on these exact tokens.
"""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.workload import tokens
from kvpool.workload.tokens import OUTPUT_VOCAB_SIZE, output_tokens


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.integers(min_value=0, max_value=3000))
def test_a_run_equals_the_stepped_definition(request_id, count):
    got = output_tokens(request_id, count)
    assert got == tokens._stepped(zlib.crc32(request_id.encode("utf-8")), count)
    assert all(type(t) is int and 0 <= t < OUTPUT_VOCAB_SIZE for t in got)


def test_the_jump_tables_grow_and_stay_exact(monkeypatch):
    empty = tokens._JUMPS[0][:0]
    monkeypatch.setattr(tokens, "_JUMPS", (empty, empty))
    first = output_tokens("grow", 20)  # builds the smallest table
    assert tokens._JUMPS[0].shape[0] >= 20
    longer = output_tokens("grow", 5000)  # grows it
    assert tokens._JUMPS[0].shape[0] >= 5000
    assert longer[:20] == first
    assert longer == tokens._stepped(zlib.crc32(b"grow"), 5000)


def test_known_values_do_not_drift():
    # Pinned: traces, their follow-up prompts and the recorded figures depend on them.
    assert output_tokens("r1", 5) == [31223, 13099, 18052, 6535, 2162]
    assert output_tokens("req-7", 20)[:3] == [15409, 5641, 1975]
