"""The pool machine: many pools driven with the same random calls, compared after each.

:mod:`~kvpool.harness.pool.backends` resolves names (kvpool backends, ``planted:NAME``,
``vllm``) and factories; :mod:`~kvpool.harness.pool.driver` runs one call on every pool and
compares replies, states and events (:func:`lockstep`); :mod:`~kvpool.harness.pool.machine` is
the Hypothesis state machine the rule sets (:mod:`kvpool.harness.rules`) extend;
:mod:`~kvpool.harness.pool.config` and :mod:`~kvpool.harness.pool.profiles` its settings.
"""
