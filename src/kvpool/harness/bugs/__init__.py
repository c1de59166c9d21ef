"""Planted bugs: deliberately broken pools and policies the machines must catch.

:mod:`~kvpool.harness.bugs.pool` holds the pool bugs (``kvpool check --planted NAME``, and
``python -m kvpool.harness.detection`` for how many steps each takes to be found);
:mod:`~kvpool.harness.bugs.stack` the policy-layer bugs of the whole-stack machine.
"""
