"""The JSONL trace format: round trip, and every malformed line named by file and line."""

from __future__ import annotations

import json

import pytest

from kvpool.errors import KvPoolError
from kvpool.workload.trace import TraceError, TraceRequest, load_trace, parse_lines, write_trace

GOOD = {"id": "a", "arrival_step": 0, "prompt": [1, 2, 3], "output_len": 4}


def _line(**changes: object) -> str:
    record = dict(GOOD, **changes)
    return json.dumps({k: v for k, v in record.items() if v is not _DROP})


_DROP = object()


def _write(tmp_path, lines: list[str]):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _error_for(tmp_path, bad_line: str, position: int = 3) -> TraceError:
    lines = [_line(id="x1"), _line(id="x2"), _line(id="x3")]
    lines.insert(position - 1, bad_line)
    path = _write(tmp_path, lines)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    error = info.value
    assert error.line == position
    assert error.path == str(path)
    assert str(error).startswith(f"{path}:{position}: ")
    return error


def test_a_written_trace_loads_back_equal(tmp_path):
    requests = [
        TraceRequest("r1", 0, (5, 6, 7), 3),
        TraceRequest("r2", 9, (1,), 0),
    ]
    path = tmp_path / "t.jsonl"
    assert write_trace(requests, path) == 2
    assert load_trace(path) == requests


def test_blank_lines_are_skipped_but_keep_line_numbers(tmp_path):
    path = _write(tmp_path, [_line(id="a"), "", "   ", "{not json"])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.line == 4


def test_trace_error_is_a_kvpool_error_and_a_value_error():
    assert issubclass(TraceError, KvPoolError)
    assert issubclass(TraceError, ValueError)


def test_bad_json_names_the_line(tmp_path):
    error = _error_for(tmp_path, '{"id": "a", "arrival_step": 0,', position=2)
    assert "invalid JSON" in error.reason


def test_a_line_that_is_not_an_object_is_rejected(tmp_path):
    error = _error_for(tmp_path, "[1, 2, 3]")
    assert "JSON object" in error.reason


@pytest.mark.parametrize("field", ["id", "arrival_step", "prompt", "output_len"])
def test_a_missing_field_is_named(tmp_path, field):
    error = _error_for(tmp_path, _line(**{field: _DROP}))
    assert "missing" in error.reason and field in error.reason


def test_an_unexpected_field_is_named(tmp_path):
    error = _error_for(tmp_path, _line(priority=3))
    assert "unexpected" in error.reason and "priority" in error.reason


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"id": 7}, ["'id'", "string"]),
        ({"id": ""}, ["'id'"]),
        ({"arrival_step": "3"}, ["'arrival_step'", "integer"]),
        ({"arrival_step": 1.5}, ["'arrival_step'", "integer"]),
        ({"output_len": True}, ["'output_len'", "integer"]),
        ({"prompt": "1 2 3"}, ["'prompt'", "list"]),
        ({"prompt": [1, "2"]}, ["'prompt'[1]", "token id"]),
        ({"prompt": [1, False]}, ["'prompt'[1]"]),
        ({"prompt": [0.5]}, ["'prompt'[0]"]),
    ],
)
def test_a_mistyped_field_is_named(tmp_path, changes, words):
    error = _error_for(tmp_path, _line(**changes))
    for word in words:
        assert word in error.reason


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"arrival_step": -1}, "'arrival_step'"), ({"output_len": -2}, "'output_len'"),
     ({"prompt": [3, -1]}, "'prompt'[1]")],
)
def test_negative_numbers_are_rejected(tmp_path, changes, field):
    error = _error_for(tmp_path, _line(**changes))
    assert field in error.reason


def test_an_empty_prompt_is_rejected(tmp_path):
    error = _error_for(tmp_path, _line(prompt=[]))
    assert "empty" in error.reason


def test_a_duplicate_id_names_both_lines(tmp_path):
    error = _error_for(tmp_path, _line(id="x1"), position=3)
    assert "duplicate" in error.reason and "'x1'" in error.reason and "line 1" in error.reason


def test_non_utf8_bytes_name_their_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(_line(id="a").encode() + b"\n" + b'{"id": "\xff"}\n')
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.line == 2 and "UTF-8" in info.value.reason


def test_parse_lines_uses_the_given_name():
    with pytest.raises(TraceError, match=r"^mem:1: "):
        parse_lines(["{}"], "mem")


def test_output_len_zero_and_step_zero_are_valid():
    (request,) = parse_lines([_line(output_len=0, arrival_step=0)])
    assert request.output_len == 0 and request.prompt == (1, 2, 3)
