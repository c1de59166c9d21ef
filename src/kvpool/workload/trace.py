"""Serving traces as JSONL: one request per line, validated line by line.

A trace is what a serving engine saw: which requests arrived at which scheduler step, with
which prompt, and how many tokens each generated. One JSON object per line, exactly these
fields::

    {"id": "c00012-t2", "arrival_step": 40, "prompt": [101, 7592, ...], "output_len": 57}

* ``id``: a non-empty string, unique in the file;
* ``arrival_step``: an int ``>= 0``, the scheduler step at which the request arrives;
* ``prompt``: a non-empty list of token ids (ints in ``[0, 2**63)``);
* ``output_len``: an int ``>= 0``, how many tokens the request generates.

Blank lines are skipped (a trailing newline is not an error). Every other line must be a
valid request, and :func:`load_trace` reports the first that is not as a :class:`TraceError`
naming the file, the 1-based line number and what is wrong. The generated tokens themselves are
not stored: the driver decodes :func:`~kvpool.workload.tokens.output_tokens`, a deterministic
function of the request id, so a trace file fully determines a replay.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kvpool.errors import KvPoolError
from kvpool.request import MAX_TOKEN_ID

TRACE_FIELDS = ("id", "arrival_step", "prompt", "output_len")
"""The fields of a trace line, in the order the writer emits them."""


class TraceError(KvPoolError, ValueError):
    """A trace line is malformed; ``str(error)`` is ``"FILE:LINE: what is wrong"``.

    Attributes:
        path: the trace file as given (``"<memory>"`` for in-memory lines).
        line: the 1-based line number.
        reason: what is wrong with that line.
    """

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace (validated: see the module docstring for the field rules)."""

    id: str
    arrival_step: int
    prompt: tuple[int, ...]
    output_len: int

    def to_json(self) -> str:
        """The request as one compact JSON line (without the newline)."""
        record = {
            "id": self.id,
            "arrival_step": self.arrival_step,
            "prompt": list(self.prompt),
            "output_len": self.output_len,
        }
        return json.dumps(record, separators=(",", ":"))


def _is_int(value: object) -> bool:
    # bool is an int subclass; ``true`` is never a valid count or token id.
    return type(value) is int


def parse_request(text: str) -> TraceRequest:
    """One trace line as a request; ``ValueError`` with the reason if it is not valid.

    The reason does not name a line: :func:`parse_lines` adds the location.
    """
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise ValueError("invalid JSON (nested too deeply)") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    missing = [f for f in TRACE_FIELDS if f not in record]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    extra = sorted(set(record) - set(TRACE_FIELDS))
    if extra:
        raise ValueError(f"unexpected field(s): {', '.join(extra)}")
    request_id = record["id"]
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"'id' must be a non-empty string, got {request_id!r}")
    try:
        request_id.encode("utf-8")  # the replay derives output tokens from these bytes
    except UnicodeEncodeError:
        raise ValueError(f"'id' is not valid Unicode (a lone surrogate): {request_id!r}") from None
    for name in ("arrival_step", "output_len"):
        value = record[name]
        if not _is_int(value):
            raise ValueError(f"'{name}' must be an integer, got {value!r}")
        if value < 0:
            raise ValueError(f"'{name}' must be >= 0, got {value}")
    prompt = record["prompt"]
    if not isinstance(prompt, list):
        raise ValueError(f"'prompt' must be a list of token ids, got {type(prompt).__name__}")
    if not prompt:
        raise ValueError("'prompt' is empty (a request needs at least one prompt token)")
    for position, token in enumerate(prompt):
        if not _is_int(token) or token < 0 or token > MAX_TOKEN_ID:
            raise ValueError(
                f"'prompt'[{position}] must be a token id (an int in [0, 2**63)), got {token!r}"
            )
    return TraceRequest(request_id, record["arrival_step"], tuple(prompt), record["output_len"])


def parse_lines(lines: Iterable[str], path: str = "<memory>") -> list[TraceRequest]:
    """Validate every line; the requests in file order, or a :class:`TraceError`.

    O(total tokens). Duplicate ids are reported at their second occurrence, naming the first.
    """
    requests: list[TraceRequest] = []
    first_line_of: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            request = parse_request(text)
        except ValueError as exc:
            raise TraceError(path, number, str(exc)) from None
        seen = first_line_of.setdefault(request.id, number)
        if seen != number:
            raise TraceError(path, number, f"duplicate id {request.id!r} (first on line {seen})")
        requests.append(request)
    return requests


def load_trace(path: str | os.PathLike[str]) -> list[TraceRequest]:
    """Read and validate a JSONL trace file (see the module docstring).

    Raises :class:`TraceError` for the first malformed line and ``OSError`` if the file
    cannot be read. Non-UTF-8 bytes are a :class:`TraceError` on the line that holds them.
    """
    name = os.fspath(path)
    with open(name, "rb") as handle:
        raw_lines = handle.read().split(b"\n")
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise TraceError(name, number, f"not UTF-8 ({exc.reason})") from None
    return parse_lines(lines, name)


def write_trace(requests: Iterable[TraceRequest], path: str | os.PathLike[str]) -> int:
    """Write ``requests`` as JSONL (one compact line each); returns how many were written."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for request in requests:
            handle.write(request.to_json())
            handle.write("\n")
            count += 1
    return count


def check_unique_ids(requests: Iterable[TraceRequest]) -> None:
    """Raise :class:`TraceError` (line = 1-based position) if two requests share an id.

    For traces built in memory, which :func:`parse_lines` has not seen.
    """
    first_of: dict[str, int] = {}
    for position, request in enumerate(requests, start=1):
        seen = first_of.setdefault(request.id, position)
        if seen != position:
            raise TraceError(
                "<memory>", position, f"duplicate id {request.id!r} (first at request {seen})"
            )


__all__ = [
    "TRACE_FIELDS",
    "TraceError",
    "TraceRequest",
    "check_unique_ids",
    "load_trace",
    "parse_lines",
    "parse_request",
    "write_trace",
]
