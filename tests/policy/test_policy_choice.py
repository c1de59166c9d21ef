"""Which policy a manager gets: the fast policy where it serves the backend, named or as a
:class:`~kvpool.PoolRecipe` (options do not hide the backend), the generic one otherwise."""

from __future__ import annotations

import pytest

from kvpool import PoolRecipe
from kvpool.backends import backend_name
from kvpool.workload import simulate
from kvpool.workload.models import build_manager


def _manager(backend):
    return build_manager("full", 64, 16, 1024, backend=backend)


def test_a_named_fast_backend_gets_the_fast_policy() -> None:
    assert _manager("fast").policy_name == "fast"
    assert _manager("reference").policy_name == "generic"


def test_a_recipe_keeps_its_backends_name_and_applies_its_options() -> None:
    manager = _manager(PoolRecipe("fast", {"enable_kv_cache_events": False}))
    assert manager.policy_name == "fast"
    # build_manager asks for events; the recipe's option wins.
    assert manager.block_pool.enable_kv_cache_events is False
    assert _manager(PoolRecipe("reference", {})).policy_name == "generic"


def test_a_factory_that_names_no_backend_gets_the_generic_policy() -> None:
    from kvpool import make_pool

    factory = lambda n, **kw: make_pool(n, backend="fast", **kw)  # noqa: E731
    assert backend_name(factory) is None
    assert _manager(factory).policy_name == "generic"


@pytest.mark.parametrize("options", [{"use_int_block_hashes": False},
                                     {"enable_kv_cache_events": False}])
def test_simulate_with_pool_options_keeps_the_fast_policy_and_its_decisions(options) -> None:
    """``kvpool simulate --publish`` passes pool options: it used to fall back to the
    generic policy (a plain factory hid the backend's name)."""
    fast = simulate(backend="fast", num_requests=40, num_blocks=256, seed=3, warmup=False,
                    pool_options=options)
    generic = simulate(backend="reference", num_requests=40, num_blocks=256, seed=3,
                       warmup=False, pool_options=options)
    assert (fast.policy, generic.policy) == ("fast", "generic")
    assert fast.hit_tokens > 0 and fast.decisions() == generic.decisions()


def test_a_recipe_with_a_bad_backend_or_option_is_a_typed_error() -> None:
    # Refused when the manager builds its pool, as make_pool refuses them: nothing built.
    from kvpool.errors import BackendUnavailable, InvalidConfig

    with pytest.raises(BackendUnavailable, match="unknown backend"):
        _manager(PoolRecipe("no-such-backend", {}))
    with pytest.raises(InvalidConfig, match="unknown option"):
        _manager(PoolRecipe("fast", {"no_such_option": 1}))
    with pytest.raises(InvalidConfig):
        _manager(PoolRecipe("fast", {"use_int_block_hashes": "False"}))
    assert backend_name(PoolRecipe("no-such-backend", {})) == "no-such-backend"
