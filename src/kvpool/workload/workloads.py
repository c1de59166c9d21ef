"""The built-in workloads of ``kvpool simulate --workload``: seeded, deterministic traces.

Each stresses the prefix cache differently:

* ``chat`` (default) — a chat service: shared system prompts on half the conversations,
  a few turns each (:class:`~kvpool.workload.synthetic.ChatWorkload`'s defaults).
* ``multi-turn`` — long conversations without shared system prompts: each turn's prompt is
  the previous prompt, its reply and a new message, so hits come from the user's own history.
* ``doc-qa`` — long-document QA: a few long shared documents, many short questions about
  them; most of every prompt is a hit once its document is cached.
* ``agentic`` — agentic tool loops: a long shared tool schema, then many short turns (a tool
  call, its result appended) per task; short outputs, little think time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvpool.errors import InvalidConfig
from kvpool.workload.synthetic import ChatWorkload
from kvpool.workload.tokens import OUTPUT_VOCAB_SIZE
from kvpool.workload.trace import TraceRequest

DEFAULT_WORKLOAD = "chat"


@dataclass(frozen=True)
class DocumentQAWorkload:
    """Questions about a few long shared documents (``doc-qa``)."""

    num_requests: int = 1500
    seed: int = 0
    num_documents: int = 6
    document_tokens: tuple[int, int] = (3000, 8000)
    question_tokens: tuple[int, int] = (12, 64)
    output_tokens: tuple[int, int] = (16, 160)
    arrival_rate: float = 0.5  # questions per step
    popularity: float = 1.2  # Zipf exponent over documents: a few are asked about most

    def validate(self) -> None:
        checks = [
            (self.num_requests >= 1, "num_requests must be >= 1"),
            (self.seed >= 0, "seed must be >= 0"),
            (self.num_documents >= 1, "num_documents must be >= 1"),
            (1 <= self.document_tokens[0] <= self.document_tokens[1],
             "document_tokens must be a range 1 <= low <= high"),
            (1 <= self.question_tokens[0] <= self.question_tokens[1],
             "question_tokens must be a range 1 <= low <= high"),
            (0 <= self.output_tokens[0] <= self.output_tokens[1],
             "output_tokens must be a range 0 <= low <= high"),
            (self.arrival_rate > 0, "arrival_rate must be > 0"),
            (self.popularity >= 0, "popularity must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidConfig(f"{message} (got {self})")

    def generate(self) -> list[TraceRequest]:
        """``num_requests`` questions sorted by arrival step. O(total tokens)."""
        self.validate()
        rng = np.random.default_rng([self.seed, 3])
        low, high = self.document_tokens
        documents = [rng.integers(0, OUTPUT_VOCAB_SIZE, int(rng.integers(low, high + 1)))
                     .tolist() for _ in range(self.num_documents)]
        weights = 1.0 / np.arange(1, self.num_documents + 1) ** self.popularity
        weights /= weights.sum()
        requests = []
        arrival = 0.0
        for i in range(self.num_requests):
            arrival += rng.exponential(1.0 / self.arrival_rate)
            doc = int(rng.choice(self.num_documents, p=weights))
            question = rng.integers(0, OUTPUT_VOCAB_SIZE,
                                    int(rng.integers(*self.question_tokens, endpoint=True)))
            output_len = int(rng.integers(*self.output_tokens, endpoint=True))
            requests.append(TraceRequest(f"d{doc}-q{i:05d}", int(arrival),
                                         tuple(documents[doc] + question.tolist()), output_len))
        return requests


@dataclass(frozen=True)
class Workload:
    """A named built-in workload: its one-line description and its trace generator."""

    name: str
    description: str
    default_requests: int
    make: Callable[[int, int], list[TraceRequest]]


def _chat(n: int, seed: int) -> list[TraceRequest]:
    return ChatWorkload(num_requests=n, seed=seed).generate()


def _multi_turn(n: int, seed: int) -> list[TraceRequest]:
    return ChatWorkload(num_requests=n, seed=seed, system_prompt_share=0.0, mean_turns=8.0,
                        user_message_tokens=64, output_tokens=96, max_prompt_tokens=8192,
                        conversation_rate=0.04, think_steps=20.0).generate()


def _doc_qa(n: int, seed: int) -> list[TraceRequest]:
    return DocumentQAWorkload(num_requests=n, seed=seed).generate()


def _agentic(n: int, seed: int) -> list[TraceRequest]:
    return ChatWorkload(num_requests=n, seed=seed, num_system_prompts=2,
                        system_prompt_share=1.0, system_prompt_tokens=(2500, 3500),
                        mean_turns=10.0, user_message_tokens=80, output_tokens=32,
                        max_output_tokens=256, max_prompt_tokens=12000,
                        conversation_rate=0.05, think_steps=2.0).generate()


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("chat", "chat service: shared system prompts, a few turns per conversation "
             "(default)", 2000, _chat),
    Workload("multi-turn", "long conversations, each turn extends the previous prompt",
             1500, _multi_turn),
    Workload("doc-qa", "long-document QA: few long shared documents, many short questions",
             1500, _doc_qa),
    Workload("agentic", "agentic tool loops: long shared tool schema, many short turns",
             1500, _agentic),
)}
"""The built-in workloads, by name."""


def generate_workload(name: str, *, num_requests: int | None = None,
                      seed: int = 0) -> list[TraceRequest]:
    """The trace of built-in workload ``name`` (its default size if ``num_requests`` is
    ``None``); :class:`InvalidConfig` for an unknown name."""
    workload = WORKLOADS.get(name)
    if workload is None:
        raise InvalidConfig(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return workload.make(workload.default_requests if num_requests is None else num_requests,
                         seed)


__all__ = ["DEFAULT_WORKLOAD", "DocumentQAWorkload", "WORKLOADS", "Workload",
           "generate_workload"]
