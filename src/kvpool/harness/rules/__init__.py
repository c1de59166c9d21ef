"""The rule sets of the pool machine, one family of calls each.

:mod:`~kvpool.harness.rules.cache` (lookups and cache writes), :mod:`~kvpool.harness.rules.
release` (frees, unpins, watchers, evictions, resets), :mod:`~kvpool.harness.rules.invalid`
(calls the spec rejects), :mod:`~kvpool.harness.rules.hostile` with
:mod:`~kvpool.harness.rules.hostile_values` (wrong types, callbacks that raise or re-enter).
"""
