"""The whole-stack machine: kvpool's KV cache manager over every backend, against a reference.

:mod:`~kvpool.harness.stack.configs` names the model configurations it runs;
:mod:`~kvpool.harness.stack.invariants` states what must hold of a manager after every step;
:mod:`~kvpool.harness.stack.machine` drives the managers and compares every decision
(:mod:`~kvpool.harness.stack.compare` says what is compared); :mod:`~kvpool.harness.stack.run`
runs one check and reports it.
"""
