"""The whole-stack differential machine: one scheduler workload through several stacks.

A *stack* is a :class:`kvpool.policy.KVCacheManager` over one pool backend. The machine
plays a small scheduler — new requests with shared prefixes and salts, chunked prefill,
decode with lookahead (EAGLE drafts accepted or rejected), tokens in flight (async
scheduling) and the keying of sampled tokens' blocks, preemption and resume, finish,
pop-then-free, cache reset, allocation failure under memory pressure, invalid calls — and
feeds every call to every stack. After every step it compares, stack against the first (the
oracle): each call's result or error type, every live request's block tables, hit lengths,
the pools' ``abstract()`` values (state and pending events) and the events handed over; and
it checks §11.21–27 as named predicates (:mod:`kvpool.harness.stack.invariants`) on every
stack.

It is a seeded random walk, not a Hypothesis machine: a stack step is a whole scheduler
decision, and the interesting failures need long histories (a cached prefix evicted by
memory pressure, then hit again), which shrinking would spend its budget on. A failure
reports the configuration, the seed and the step, and the ops leading to it in domain
words; ``kvpool check --layer stack --configuration C --seed S --steps N`` replays it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.errors import KvPoolError
from kvpool.harness.stack import invariants as inv
from kvpool.harness.stack.compare import (
    Outcome,
    event_fields,
    first_difference,
    normalize,
    outcome_difference,
    pool_projection,
)
from kvpool.harness.stack.configs import StackConfiguration
from kvpool.hashing import BlockHasher, get_request_block_hasher
from kvpool.policy.facade import KVCacheManager
from kvpool.policy.request import RequestStatus, SchedulerRequest


class StackDivergence(AssertionError):
    """Two stacks disagreed, or a stack broke a manager invariant.

    ``what`` names the call and ``outcomes`` holds (oracle's, other's) when two results
    differed; both are ``None`` for a state or invariant failure."""

    what: str | None = None
    outcomes: tuple[Any, Any] | None = None


@dataclass
class Stack:
    """One facade over one backend, plus the tables popped but not yet freed.

    ``native`` is true for kvpool's own facade; a foreign one (vLLM's, through
    :mod:`kvpool.harness.foreign.vllm_stack`) gets no invariant predicates (they read kvpool's
    managers) and is compared through :func:`pool_projection`.
    """

    name: str
    manager: Any
    popped: list[list[int]] = field(default_factory=list)
    native: bool = True
    #: Copy endpoints taken at the last step boundary, released at the next one (the
    #: copies run with the step in between).
    retained: list[int] = field(default_factory=list)


FAST_POLICY = "fast-policy"
"""The stack name of the fast policy (:mod:`kvpool.policy.fast`) over the fast pool; every
other name is a pool backend under the generic policy."""


def build_stack_manager(name: str, kwargs: dict[str, Any]) -> Any:
    """The facade a stack name stands for, or ``None`` for the fast policy where it does not
    serve the configuration."""
    if name != FAST_POLICY:
        return KVCacheManager(**kwargs, backend=name)
    from kvpool.policy.fast import fast_policy_class

    served = fast_policy_class(**kwargs, backend="fast")
    return None if isinstance(served, str) else served(**kwargs, backend="fast")


class StackMachine:
    """Drive ``backends`` (first = oracle) through one configuration; see module docstring.

    ``extra`` adds stacks built by a callable ``(configuration) -> (name, manager)`` — the
    planted-bug stacks use it.
    """

    def __init__(self, configuration: StackConfiguration, backends: Sequence[str],
                 seed: int, extra: Sequence[Callable[[StackConfiguration],
                                                     tuple[str, Any]]] = (),
                 foreign: Callable[[StackConfiguration], Any] | None = None) -> None:
        self.config = configuration
        kwargs = configuration.manager_kwargs()
        #: Stacks named but not built: the fast policy where it does not serve the
        #: configuration (the generic policy is what runs there).
        self.skipped: list[str] = []
        self.stacks = [] if foreign is None else [Stack("vllm", foreign(configuration),
                                                        native=False)]
        for name in backends:
            manager = build_stack_manager(name, kwargs)
            if manager is None:
                self.skipped.append(name)
            else:
                self.stacks.append(Stack(name, configuration.prepare(manager)))
        for build in extra:
            name, manager = build(configuration)
            self.stacks.append(Stack(name, configuration.prepare(manager)))
        #: Comparing with a foreign facade: projections instead of abstracts, events
        #: without sequence numbers, and no invalid calls (vLLM does not validate).
        self.foreign = foreign is not None
        #: Whether running steps may have tokens in flight (async scheduling): not against
        #: a vLLM that has no such field (0.25.1 frees behind every computed token).
        self.in_flight = not self.foreign or bool(
            getattr(self.stacks[0].manager, "models_tokens_in_flight", False))
        self.partial = configuration.allow_partial_hash_hits
        self.rng = random.Random(seed)
        self.seed = seed
        self.hasher = get_request_block_hasher(configuration.hash_block_size,
                                               BlockHasher("sha256", seed="kvpool-stack"))
        self.waiting: list[SchedulerRequest] = []
        self.running: list[SchedulerRequest] = []
        self.finished: list[SchedulerRequest] = []
        self.families = [[self.rng.randrange(1000) for _ in range(self.rng.randint(24, 140))]
                         for _ in range(4)]
        self.next_id = 0
        self.steps = 0
        #: How often the interesting things happened (hits, failures, ...): a run that
        #: never fails an allocation has not tested failure.
        self.coverage: Counter[str] = Counter()
        self.log: list[str] = []
        self.tables: list[dict[tuple[str, int], list[int]]] = [{} for _ in self.stacks]
        self.ops: list[tuple[float, Callable[[], None]]] = [
            (3.0, self.add_request), (4.0, self.admit_waiting_request),
            (9.0, self.schedule_running_request), (1.2, self.finish_request),
            (0.6, self.preempt_request), (0.4, self.pop_blocks_then_free_later),
            (2.0, self.start_new_step), (0.3, self.reset_prefix_cache),
            (0.05, self.drain_and_reset),
            (0.0 if foreign else 0.6, self.invalid_call_changes_nothing),
            (0.15, self.evict_cached_blocks),
        ]
        self._weights = [w for w, _ in self.ops]

    # -- plumbing -----------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.log.append(f"step {self.steps}: {text}")
        if len(self.log) > 40:
            del self.log[:-40]

    def fail(self, text: str, what: str | None = None,
             outcomes: tuple[Any, Any] | None = None) -> None:
        tail = "\n  ".join(self.log[-15:])
        error = StackDivergence(
            f"configuration {self.config.name!r}, seed {self.seed}, step {self.steps}: {text}"
            f"\nlast operations:\n  {tail}")
        error.what, error.outcomes = what, outcomes
        raise error

    def each(self, call: Callable[[Stack], Any], what: str) -> list[Outcome]:
        """Apply ``call`` to every stack; fail unless all outcomes equal the oracle's."""
        outcomes: list[Outcome] = []
        for stack in self.stacks:
            try:
                outcomes.append(("ok", normalize(call(stack))))
            except KvPoolError as error:
                outcomes.append(("error", type(error).__name__))
            except Exception as error:  # noqa: BLE001 - an untyped error is a finding
                outcomes.append(("crash", f"{type(error).__name__}: {error}"))
        for stack, outcome in zip(self.stacks[1:], outcomes[1:], strict=True):
            if outcome != outcomes[0]:
                difference = outcome_difference(self.stacks[0].name, outcomes[0],
                                                 stack.name, outcome)
                self.fail(f"{what}: {difference}", what, (outcomes[0], outcome))
        if outcomes[0][0] == "crash":
            self.fail(f"{what}: untyped exception {outcomes[0][1]}")
        return outcomes

    def live_ids(self) -> list[str]:
        return [r.request_id for r in self.running]

    def compare_and_check(self) -> None:
        """Tables, pool states and every predicate, after a step."""
        ids = self.live_ids()
        oracle = self.stacks[0]
        tables0 = inv.all_tables(oracle.manager, ids)
        view0 = self._pool_view(oracle)
        for i, stack in enumerate(self.stacks):
            m = stack.manager
            tables = tables0 if i == 0 else inv.all_tables(m, ids)
            if i:
                if tables != tables0:
                    diff = [k for k in tables0 if tables0[k] != tables.get(k)]
                    self.fail(f"block tables differ on {stack.name} at {diff[:3]}: "
                              f"{[tables0[k] for k in diff[:3]]} vs "
                              f"{[tables.get(k) for k in diff[:3]]}")
                view = self._pool_view(stack)
                if view != view0:
                    self.fail(f"pool state differs on {stack.name}: "
                              f"{first_difference(view0, view)}")
            if not stack.native:
                continue
            problems = (
                inv.every_reference_is_counted_once(m, ids, stack.popped)
                + inv.no_block_twice_in_a_table(m, ids)
                + inv.copy_endpoints_stay_out_of_the_free_queue(m)
                + inv.mamba_states_keyed_as_computed(
                    m, [(r.request_id, r.num_computed_tokens) for r in self.running])
                + inv.keyed_blocks_cover_their_table_position(m, ids)
                + inv.running_tables_are_append_only(self.tables[i], tables,
                                                     m.block_pool.null_block)
            )
            if problems:
                self.fail(f"invariant broken on {stack.name}: {problems[:3]}")
            self.tables[i] = tables

    def _pool_view(self, stack: Stack) -> Any:
        if self.foreign:
            return pool_projection(stack.manager, stack.native)
        abstract = stack.manager.block_pool.abstract()
        return abstract.state, abstract.pending_events

    def step(self) -> None:
        """One weighted random scheduler operation, then the comparison."""
        _, op = self.rng.choices(self.ops, weights=self._weights)[0]
        op()
        self.steps += 1
        self.compare_and_check()

    def run(self, steps: int, progress: Callable[[int], None] | None = None) -> None:
        for _ in range(steps):
            self.step()
            if progress is not None and self.steps % 500 == 0:
                progress(self.steps)

    # -- the scheduler's operations -----------------------------------------------------

    def add_request(self) -> None:
        """A new request: a shared prefix (cut anywhere), a private suffix, maybe a salt."""
        if len(self.waiting) + len(self.running) >= 10:
            return
        rng = self.rng
        recent = self.finished + self.running
        if recent and rng.random() < 0.1:  # a retried prompt: fully cached, if it survived
            twin = rng.choice(recent)
            prompt, salt = list(twin.prompt_token_ids), twin.cache_salt
        else:
            family = rng.choice(self.families)
            prompt = family[: rng.randint(0, len(family))]
            prompt += [rng.randrange(1000, 2000) for _ in range(rng.randint(1, 80))]
            prompt = prompt[: self.config.max_model_len - 48]
            if rng.random() < 0.3 and len(prompt) >= 32:  # block-aligned prompt lengths
                prompt = prompt[: len(prompt) // 32 * 32]
            salt = rng.choice(["tenant-a", "tenant-b"]) if rng.random() < 0.15 else None
        rid = f"r{self.next_id}"
        self.next_id += 1
        request = SchedulerRequest(rid, prompt, cache_salt=salt, block_hasher=self.hasher)
        self.waiting.append(request)
        self.note(f"new request {rid} with {len(prompt)} prompt tokens, salt {salt!r}")

    def _chunk(self, request: SchedulerRequest | None = None, start: int = 0) -> int:
        """A prefill chunk size; with partial hits, often one that ends exactly at the
        prompt's last hash boundary (vLLM 0.33's scheduler stops chunks there, so a
        Mamba state is checkpointed inside a block)."""
        if self.partial and request is not None and self.rng.random() < 0.4:
            hbs = self.config.hash_block_size
            boundary = (request.num_prompt_tokens - 1) // hbs * hbs
            if 0 < boundary - start <= self.config.max_num_batched_tokens:
                return boundary - start
        return self.rng.choice([8, 16, 24, 48, self.config.max_num_batched_tokens])

    def _lookahead(self) -> int:
        return self.config.num_lookahead_tokens

    def admit_waiting_request(self) -> None:
        """Lookup then allocation for the first waiting request (FCFS)."""
        if not self.waiting:
            return
        request = self.waiting[0]
        hits: dict[str, Any] = {}

        def lookup(stack: Stack) -> Any:
            result = stack.manager.get_computed_blocks(request)
            hits[stack.name] = result
            return result

        self.each(lookup, f"get_computed_blocks({request.request_id})")
        for stack in self.stacks:
            if not stack.native:
                continue
            blocks, n = hits[stack.name]
            problems = inv.hit_lengths_agree_across_groups(
                stack.manager, blocks.blocks, n, request.num_tokens - 1)
            if problems:
                self.fail(f"hit of {request.request_id} on {stack.name}: {problems}")
        n = hits[self.stacks[0].name][1]
        self.coverage["lookups"] += 1
        self.coverage["hits"] += n > 0
        if self.partial:
            self.coverage["partial hits"] += n % self.config.scheduler_block_size != 0
        rng = self.rng
        # A KV connector sometimes holds more of the prompt (external tokens).
        external = 0
        if rng.random() < 0.1 and request.num_tokens - n > 2:
            external = rng.randint(1, min(48, request.num_tokens - n - 1))
        num_new = min(request.num_tokens - n - external, self._chunk(request, n + external))
        must_fit = rng.random() < 0.2
        options = dict(
            num_external_computed_tokens=external,
            delay_cache_blocks=rng.random() < 0.05,
            reserved_blocks=rng.randint(1, 3) if rng.random() < 0.1 else 0,
            has_scheduled_reqs=rng.random() < 0.9,
        )
        self.note(f"admit {request.request_id}: hit {n} tokens, allocate {num_new} "
                  f"(full_sequence_must_fit={must_fit}, {options})")
        ok = self._allocate(request, num_new, n, hits, must_fit, **options)
        if ok:
            self.coverage["external tokens"] += external > 0
            self.waiting.pop(0)
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = n + external + num_new
            self._sample_if_caught_up(request, 0, 0)

    def _allocate(self, request: SchedulerRequest, num_new: int, num_hit: int,
                  hits: dict[str, Any] | None, must_fit: bool = False,
                  lookahead: int | None = None, **options: Any) -> bool:
        """``allocate_slots`` on every stack, with the §11.26/27 checks; success?"""
        la = self._lookahead() if lookahead is None else lookahead
        rid = request.request_id
        before: list[tuple[Any, Any, list[int]] | None] = []
        for stack in self.stacks:
            if not stack.native:
                before.append(None)
                continue
            pool = stack.manager.block_pool
            ids = list(range(1, pool.num_gpu_blocks))
            before.append((pool.observe().ref_cnts(ids), pool.get_num_free_blocks(),
                           [len(t) for t in stack.manager.get_block_ids(rid)]))

        def allocate(stack: Stack) -> Any:
            blocks = hits[stack.name][0] if hits else None
            return stack.manager.allocate_slots(
                request, num_new, num_hit, blocks, num_lookahead_tokens=la,
                full_sequence_must_fit=must_fit, **options)

        external = int(options.get("num_external_computed_tokens", 0))
        shown = f", {external} external" if external else ""
        outcome = self.each(allocate, f"allocate_slots({rid}, {num_new}, {num_hit}{shown})")[0]
        total = min(request.num_computed_tokens + num_hit + external,
                    self.config.max_model_len)
        need = min(total + num_new + la, self.config.max_model_len)
        for stack, seen in zip(self.stacks, before, strict=True):
            if seen is None:
                continue
            refs, free, lengths = seen
            m = stack.manager
            if outcome == ("ok", None):
                pool = m.block_pool
                after = pool.observe().ref_cnts(list(range(1, pool.num_gpu_blocks)))
                problems = inv.failed_allocation_touched_and_allocated_nothing(
                    refs, after, free, pool.get_num_free_blocks())
            elif outcome[0] == "ok":
                problems = inv.each_group_counts_in_its_own_block_size(m, rid, need, lengths)
            else:
                problems = []
            if problems:
                self.fail(f"allocate_slots({rid}) on {stack.name}: {problems}")
        if outcome[0] != "ok":
            self.fail(f"a valid allocate_slots({rid}) raised {outcome[1]}", "allocate_slots",
                      (outcome, outcome))
        ok = outcome[1] is not None
        self.coverage["allocations" if ok else "allocation failures"] += 1
        return ok

    def _sample_if_caught_up(self, request: SchedulerRequest, drafts: int, accepted: int) -> None:
        """After a step that computed every token, the model samples 1 + accepted tokens;
        rejected drafts are uncomputed again."""
        if request.num_computed_tokens < request.num_tokens:
            return
        request.num_computed_tokens -= drafts - accepted
        request.append_output_token_ids(
            [self.rng.randrange(2000, 3000) for _ in range(1 + accepted)])

    def schedule_running_request(self) -> None:
        """A prefill chunk or a decode step (with EAGLE drafts) for a running request; on
        failure, preempt the most recently admitted request (vLLM's victim)."""
        if not self.running:
            return
        request = self.rng.choice(self.running)
        if request.num_tokens >= self.config.max_model_len - 8:
            self._finish(request)
            return
        remaining = request.num_tokens - request.num_computed_tokens
        drafts = 0
        if remaining == 1 and self.config.num_lookahead_tokens:
            drafts = self.rng.randint(0, self.config.num_lookahead_tokens)
        num_new = min(remaining, self._chunk(request, request.num_computed_tokens)) + drafts
        # Async scheduling: the request's previous step may not be back yet; its tokens
        # are counted as computed, but the windows must keep what they read.
        in_flight = 0
        if self.in_flight and request.num_computed_tokens and self.rng.random() < 0.3:
            in_flight = self.rng.randint(1, min(request.num_computed_tokens, 64))
            self.coverage["steps with tokens in flight"] += 1
        request.num_in_flight_tokens = in_flight
        self.note(f"schedule {request.request_id}: {num_new} tokens ({drafts} drafts) at "
                  f"{request.num_computed_tokens}/{request.num_tokens}, {in_flight} in flight")
        try:
            ok = self._allocate(request, num_new, 0, None)
        finally:
            request.num_in_flight_tokens = 0
        if ok:
            request.num_computed_tokens += num_new
            accepted = self.rng.randint(0, drafts)
            sampled = request.num_computed_tokens >= request.num_tokens
            self._sample_if_caught_up(request, drafts, accepted)
            if sampled and self.rng.random() < 0.3:
                self._cache_sampled(request)
        else:
            self._preempt(self.running[-1])

    def _cache_sampled(self, request: SchedulerRequest) -> None:
        """vLLM's async scheduler, when a step's sampled tokens come back: key the blocks
        they filled (the step's allocation keyed only up to the tokens known then)."""
        n = min(request.num_computed_tokens, request.num_tokens)
        self.note(f"cache_blocks({request.request_id}, {n})")
        self.each(lambda s: s.manager.cache_blocks(request, n),
                  f"cache_blocks({request.request_id}, {n})")
        self.coverage["cache_blocks after a step"] += 1

    def _free(self, request: SchedulerRequest, what: str) -> None:
        self.each(lambda s: s.manager.free(request), f"free({request.request_id}) [{what}]")
        self.running.remove(request)

    def _finish(self, request: SchedulerRequest) -> None:
        self.note(f"finish {request.request_id}")
        self._free(request, "finish")
        request.status = RequestStatus.FINISHED
        self.finished = (self.finished + [request])[-8:]

    def finish_request(self) -> None:
        if self.running:
            self._finish(self.rng.choice(self.running))

    def _preempt(self, request: SchedulerRequest) -> None:
        self.note(f"preempt {request.request_id}")
        self._free(request, "preempt")
        self.coverage["preemptions"] += 1
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.insert(0, request)

    def preempt_request(self) -> None:
        if self.running:
            self._preempt(self.rng.choice(self.running))

    def pop_blocks_then_free_later(self) -> None:
        """A finished request whose blocks a KV transfer still reads: popped now, freed
        (reversed) at the next step."""
        if not self.running:
            return
        request = self.rng.choice(self.running)
        self.note(f"pop blocks of {request.request_id} for a later free")

        def pop(stack: Stack) -> Any:
            blocks = stack.manager.pop_blocks_for_free(request)
            stack.popped.append(blocks)
            return blocks

        self.each(pop, f"pop_blocks_for_free({request.request_id})")
        self.running.remove(request)
        request.status = RequestStatus.FINISHED
        self.finished = (self.finished + [request])[-8:]

    def start_new_step(self) -> None:
        """Free popped tables, tell the managers a step starts, hand over the events."""
        self.note("new step")
        for stack in self.stacks:
            for blocks in stack.popped:
                stack.manager.block_pool.free_blocks(blocks[::-1])
            stack.popped.clear()
        if self.partial:
            self._hand_over_copies()
        self.each(lambda s: s.manager.new_step_starts(), "new_step_starts()")
        # What vLLM 0.25's scheduler asks each step, of its first running request (0.33's
        # manager answers zeros: cascade attention is gone; kvpool keeps 0.25's rule).
        if self.running and not (self.foreign and self.config.vllm >= (0, 33)):
            rid = self.running[0].request_id
            self.each(lambda s: s.manager.get_num_common_prefix_blocks(rid),
                      f"get_num_common_prefix_blocks({rid})")
        if self.foreign:
            self.each(lambda s: [event_fields(e) for e in s.manager.take_events()],
                      "take_events()")
        else:
            self.each(lambda s: s.manager.take_events(), "take_events()")
            # The blocks to zero (vLLM 0.33 zeroes them): the fast policy records its own.
            self.each(lambda s: s.manager.take_new_block_ids(), "take_new_block_ids()")

    def _release_copies(self) -> None:
        """The copies taken at the last boundary have run: release their endpoints."""
        if any(stack.retained for stack in self.stacks):
            self.each(lambda s: s.manager.release_copy_endpoints(s.retained),
                      "release_copy_endpoints()")
        for stack in self.stacks:
            stack.retained = []

    def _hand_over_copies(self) -> None:
        """The scheduler's end of step: release what the last step's copies held, take
        this step's copies; a synchronous engine releases them at once."""
        self._release_copies()
        taken: dict[str, Any] = {}

        def take(stack: Stack) -> Any:
            taken[stack.name] = stack.manager.take_kv_cache_block_copies()
            return taken[stack.name]

        copies = self.each(take, "take_kv_cache_block_copies()")[0][1][0]
        self.coverage["copies"] += len(copies)
        tables = inv.all_tables(self.stacks[0].manager, self.live_ids())
        in_tables = {(g, b) for (_, g), table in tables.items() for b in table}
        self.coverage["running-request copies"] += sum(
            (c.group_id, c.dst_block_id) not in in_tables for c in copies)
        for stack in self.stacks:
            stack.retained = list(taken[stack.name][1])
        if copies:
            self.note(f"take {len(copies)} copies")
            if self.rng.random() < 0.4:
                self._release_copies()

    def reset_prefix_cache(self) -> None:
        self.note("reset prefix cache")
        outcome = self.each(lambda s: s.manager.reset_prefix_cache(), "reset_prefix_cache()")
        self.coverage["successful resets"] += outcome[0] == ("ok", True)

    def drain_and_reset(self) -> None:
        """Finish everything, then reset: the one way a reset succeeds mid-run."""
        for request in list(self.running):
            self._finish(request)
        self.start_new_step()
        if self.partial:
            self._release_copies()
        self.reset_prefix_cache()

    def evict_cached_blocks(self) -> None:
        """A KV connector reports lost blocks: their cache identity goes."""
        n = self.config.num_blocks
        ids = sorted(self.rng.sample(range(1, n), k=min(3, n - 1)))
        self.note(f"evict blocks {ids}")
        self.each(lambda s: s.manager.evict_blocks(ids), f"evict_blocks({ids})")

    def invalid_call_changes_nothing(self) -> None:
        """A bad call raises the same typed error everywhere and changes nothing; a second
        free is vLLM's no-op (a scheduler frees requests aborted while waiting)."""
        rng = self.rng
        choice = rng.randrange(4 if self.partial else 3)
        before = [(s.manager.block_pool.abstract(), inv.all_tables(s.manager, self.live_ids()))
                  for s in self.stacks]
        expected = "error"
        if choice == 0 and self.finished:
            request = rng.choice(self.finished)
            self.note(f"free {request.request_id} again (a no-op)")
            outcome = self.each(lambda s: s.manager.free(request), "second free")[0]
            expected = "ok"
        elif choice == 1 and self.running:
            request = rng.choice(self.running)
            self.note(f"allocate 0 tokens for {request.request_id} (must raise)")
            outcome = self.each(lambda s: s.manager.allocate_slots(request, 0), "zero tokens")[0]
        elif choice == 3:
            m = self.stacks[0].manager
            held = m.retained_copy_endpoints
            block = rng.choice([b for b in range(1, self.config.num_blocks) if b not in held])
            ids = [block] + list(self.stacks[0].retained[:1])
            self.note(f"release copy endpoints {ids} (not retained: must raise)")
            outcome = self.each(lambda s: s.manager.release_copy_endpoints(ids),
                                "release of a block that is not retained")[0]
        elif self.running:
            request = rng.choice(self.running)
            self.note(f"allocate for {request.request_id} with shrunk tokens (must raise)")
            saved = request.num_computed_tokens
            request.num_computed_tokens = -1
            try:
                outcome = self.each(lambda s: s.manager.allocate_slots(request, 1),
                                    "shrunk")[0]
            finally:
                request.num_computed_tokens = saved
        else:
            return
        self.coverage["rejected calls" if expected == "error" else "no-op frees"] += 1
        if outcome[0] != expected:
            self.fail(f"call answered {outcome!r}, expected {expected!r}")
        for stack, (abstract, tables) in zip(self.stacks, before, strict=True):
            if stack.manager.block_pool.abstract() != abstract or \
                    inv.all_tables(stack.manager, self.live_ids()) != tables:
                self.fail(f"rejected call changed {stack.name}")


__all__ = ["FAST_POLICY", "Stack", "StackDivergence", "StackMachine", "build_stack_manager"]
