"""Will a pool fit? A memory estimate checked before any backend builds its structures.

A pool too large for the machine used to fail late and badly: the spec with ``MemoryError``
half-way through building its tuples, the reference after minutes of creating block objects,
the fast pool with numpy's allocation error. Each backend states what one block costs it
(``bytes_per_block``, measured with ``tracemalloc`` and rounded up, working copies included)
and the shell compares ``num_blocks × bytes_per_block`` with the memory the kernel reports
as available, raising :class:`~kvpool.errors.InvalidConfig` that names both numbers.
"""

from __future__ import annotations

from pathlib import Path

from kvpool.errors import InvalidConfig

CHECK_ABOVE_BYTES = 64 * 2**20
"""Estimates below this are not checked (no file read for the many small pools of tests)."""

MEMINFO = Path("/proc/meminfo")


def available_memory_bytes(meminfo: Path = MEMINFO) -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` in bytes; ``None`` where it cannot be read
    (not Linux): the check is then skipped rather than guessed."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            fields = line.split()
            try:
                return int(fields[1]) * (1024 if fields[2:3] == ["kB"] else 1)
            except (IndexError, ValueError):
                return None
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_pool_fits(backend: str, num_blocks: int, bytes_per_block: int,
                    available: int | None = None) -> None:
    """Raise :class:`InvalidConfig` if ``num_blocks`` blocks of ``backend`` need more memory
    than is available (``available`` defaults to ``MemAvailable``). O(1)."""
    estimate = num_blocks * bytes_per_block
    if estimate < CHECK_ABOVE_BYTES:
        return
    if available is None:
        available = available_memory_bytes()
        if available is None:
            return
    if estimate > available:
        hint = "" if backend == "fast" else " or the fast backend"
        raise InvalidConfig(
            f"a {backend} pool of {num_blocks} blocks needs about {_gib(estimate)} "
            f"({bytes_per_block} bytes per block), but only {_gib(available)} is available "
            f"(MemAvailable); use fewer blocks{hint}"
        )


__all__ = ["CHECK_ABOVE_BYTES", "available_memory_bytes", "check_pool_fits"]
