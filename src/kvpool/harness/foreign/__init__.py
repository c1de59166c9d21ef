"""Adapters for pools and managers not written for kvpool, so the machines can drive them.

:mod:`~kvpool.harness.foreign.objects` wraps any vLLM-shaped object pool in kvpool's id-based
API; :mod:`~kvpool.harness.foreign.vllm_pool` is vLLM's own ``BlockPool`` within its version's
scope; :mod:`~kvpool.harness.foreign.vllm_stack` is vLLM's ``KVCacheManager`` for the stack
machine. The vLLM modules import vLLM only when used.
"""
