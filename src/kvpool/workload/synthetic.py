"""The built-in trace: a seeded, deterministic chat service with shared prefixes.

The workload :class:`ChatWorkload` describes is a chat service:

* **Conversations** start at Poisson-distributed steps (``conversation_rate`` per step).
* About ``system_prompt_share`` of them begin with one of ``num_system_prompts`` shared
  system prompts (an assistant persona, a tool description, ...): the cross-user prefix the
  cache can share. The others start straight with a user message.
* A conversation has a geometric number of **turns** (mean ``mean_turns``). Each follow-up
  prompt is the previous prompt, plus the tokens the previous turn generated
  (:func:`~kvpool.workload.tokens.output_tokens`), plus a new user message: the per-user
  multi-turn prefix the cache can share. A turn arrives after the previous one could have
  finished (``output_len`` decode steps) plus an exponential think time.
* User messages and replies have log-normal lengths (long-tailed, like real chats), capped;
  a conversation ends early once its next prompt would exceed ``max_prompt_tokens``.

Every random draw comes from one ``numpy.random.Generator`` seeded with ``seed``, in a fixed
order, so a seed always gives the same trace (with a given numpy version).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpool.errors import InvalidConfig
from kvpool.workload.tokens import OUTPUT_VOCAB_SIZE, output_tokens
from kvpool.workload.trace import TraceRequest


@dataclass(frozen=True)
class ChatWorkload:
    """Parameters of the synthetic chat trace (defaults: a few seconds on the fast pool)."""

    num_requests: int = 2000
    seed: int = 0
    num_system_prompts: int = 4
    system_prompt_share: float = 0.5
    system_prompt_tokens: tuple[int, int] = (256, 1536)
    mean_turns: float = 3.0
    user_message_tokens: int = 96
    output_tokens: int = 128
    max_output_tokens: int = 1024
    max_prompt_tokens: int = 4096
    conversation_rate: float = 0.12
    think_steps: float = 40.0
    vocab_size: int = OUTPUT_VOCAB_SIZE

    def validate(self) -> None:
        """Raise :class:`InvalidConfig` for parameters that cannot describe a workload."""
        low, high = self.system_prompt_tokens
        checks = [
            (self.num_requests >= 1, "num_requests must be >= 1"),
            (self.seed >= 0, "seed must be >= 0"),
            (self.num_system_prompts >= 1, "num_system_prompts must be >= 1"),
            (0.0 <= self.system_prompt_share <= 1.0, "system_prompt_share must be in [0, 1]"),
            (1 <= low <= high, "system_prompt_tokens must be a range 1 <= low <= high"),
            (self.mean_turns >= 1.0, "mean_turns must be >= 1"),
            (self.user_message_tokens >= 1, "user_message_tokens must be >= 1"),
            (self.output_tokens >= 1, "output_tokens must be >= 1"),
            (self.max_output_tokens >= 1, "max_output_tokens must be >= 1"),
            (self.max_prompt_tokens > high, "max_prompt_tokens must exceed the system prompts"),
            (self.conversation_rate > 0, "conversation_rate must be > 0"),
            (self.think_steps >= 0, "think_steps must be >= 0"),
            (self.vocab_size >= 2, "vocab_size must be >= 2"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidConfig(f"{message} (got {self})")

    def system_prompts(self) -> list[tuple[int, ...]]:
        """The shared system prompts of this seed (the prefixes requests share)."""
        rng = np.random.default_rng([self.seed, 1])
        low, high = self.system_prompt_tokens
        return [
            tuple(rng.integers(0, self.vocab_size, int(rng.integers(low, high + 1))).tolist())
            for _ in range(self.num_system_prompts)
        ]

    def generate(self) -> list[TraceRequest]:
        """The trace: ``num_requests`` requests sorted by arrival step. O(total tokens)."""
        self.validate()
        systems = self.system_prompts()
        rng = np.random.default_rng([self.seed, 2])
        requests: list[TraceRequest] = []
        start = 0.0
        conversation = 0
        while len(requests) < self.num_requests:
            start += rng.exponential(1.0 / self.conversation_rate)
            turns = int(rng.geometric(1.0 / self.mean_turns))
            if rng.random() < self.system_prompt_share:
                prefix: tuple[int, ...] = systems[int(rng.integers(len(systems)))]
            else:
                prefix = ()
            self._conversation(rng, conversation, start, turns, prefix, requests)
            conversation += 1
        del requests[self.num_requests :]
        # Stable: requests of one step keep generation order, which is deterministic.
        requests.sort(key=lambda r: r.arrival_step)
        return requests

    def _conversation(
        self,
        rng: np.random.Generator,
        conversation: int,
        start: float,
        turns: int,
        prefix: tuple[int, ...],
        out: list[TraceRequest],
    ) -> None:
        prompt = list(prefix)
        arrival = start
        for turn in range(turns):
            if len(out) >= self.num_requests:
                return
            length = self._lognormal(rng, self.user_message_tokens)
            message = rng.integers(0, self.vocab_size, length)
            prompt.extend(message.tolist())
            if len(prompt) > self.max_prompt_tokens:
                return
            output_len = min(self._lognormal(rng, self.output_tokens), self.max_output_tokens)
            request_id = f"c{conversation:05d}-t{turn}"
            out.append(TraceRequest(request_id, int(arrival), tuple(prompt), output_len))
            prompt.extend(output_tokens(request_id, output_len))
            think = rng.exponential(self.think_steps) if self.think_steps else 0.0
            arrival += 1 + output_len + think

    @staticmethod
    def _lognormal(rng: np.random.Generator, median: int) -> int:
        # sigma 0.8: the longest ~2% of messages are 5x the median, as in chat logs.
        return max(1, int(round(median * math.exp(0.8 * rng.standard_normal()))))


def synthetic_trace(
    num_requests: int = 2000, seed: int = 0, **options: Any
) -> list[TraceRequest]:
    """The built-in chat trace (see :class:`ChatWorkload` for the options). Deterministic."""
    return ChatWorkload(num_requests=num_requests, seed=seed, **options).generate()


__all__ = ["ChatWorkload", "synthetic_trace"]
