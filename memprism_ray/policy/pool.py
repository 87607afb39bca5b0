"""Load bookkeeping of the task-policy pool (docs/gpu.md "Routing"): which replica serves a
group of decisions. Pure Python, no Ray. A group's requests go to one replica (shared prefixes hit
its caches); a new group claims the least loaded replica with the load it saw, refused if that grew
since. A group silent for ``ttl_s`` stops counting."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence


class GroupLoads:
    """The live groups of one replica and their sizes (requests per decision step)."""

    def __init__(self, ttl_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self.clock = clock
        self._groups: dict[str, tuple[int, float]] = {}

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, (_, seen) in self._groups.items() if now - seen > self.ttl_s]:
            del self._groups[key]

    def load(self) -> int:
        self._expire()
        return sum(n for n, _ in self._groups.values())

    def groups(self) -> dict[str, int]:
        self._expire()
        return {k: n for k, (n, _) in self._groups.items()}

    def claim(self, key: str, size: int, seen_load: int | None = None) -> tuple[bool, int]:
        """Register group ``key`` of ``size`` requests unless the load grew above ``seen_load``;
        returns ``(granted, load)``."""
        if size < 1:
            raise ValueError(f"a group has at least one request, got size {size}")
        current = self.load()
        if key in self._groups:  # a repeated claim (caller retry) only refreshes it
            self._groups[key] = (max(size, self._groups[key][0]), self.clock())
            return True, self.load()
        if seen_load is not None and current > seen_load:
            return False, current
        self._groups[key] = (size, self.clock())
        return True, current + size

    def touch(self, key: str, size: int) -> None:
        """A request of group ``key`` arrived: keep it alive (re-registered after a replica restart)."""
        old = self._groups.get(key, (0, 0.0))[0]
        self._groups[key] = (max(old, size), self.clock())

    def release(self, key: str) -> bool:
        return self._groups.pop(key, None) is not None


def pick_least_loaded(loads: Sequence[float], offset: int = 0) -> int:
    """Index of the smallest load; ties go to the first at or after ``offset`` (callers pass
    different offsets, so simultaneous first claims start on different replicas)."""
    if not loads:
        raise ValueError("no replica to choose from")
    n = len(loads)
    best, best_load = -1, math.inf
    for k in range(n):
        i = (offset + k) % n
        if loads[i] < best_load:
            best, best_load = i, loads[i]
    if best < 0:
        raise RuntimeError("every policy replica is unreachable")
    return best
