"""Bounded waits on Ray objects that name what they wait for (Ray's ``GetTimeoutError`` does
not), so a hung actor ends a job with a one-line error that points at the stage.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import GetTimeoutError


class WaitTimeout(TimeoutError):
    """A bounded wait on a Ray actor call or task ran out; the message names what it waited for."""


def _message(what: str, timeout_s: float) -> str:
    return f"{what}: no result within {timeout_s:g}s (the actor may be hung or unplaceable; see `ray status`)"


def get(refs: Any, timeout_s: float, what: str) -> Any:
    """``ray.get(refs)`` that gives up after ``timeout_s`` with a :class:`WaitTimeout` naming ``what``."""
    if not timeout_s > 0:
        raise ValueError(f"timeout for {what} must be > 0 seconds, got {timeout_s!r}")
    try:
        return ray.get(refs, timeout=timeout_s)
    except GetTimeoutError:
        raise WaitTimeout(_message(what, timeout_s)) from None


def ready(refs: list[Any], timeout_s: float, what: str) -> None:
    """Wait until every ref in ``refs`` is ready without fetching it to this process
    (``fetch_local=False``: a weights ref stays where it was made until its readers pull it)."""
    if not refs:
        return
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s, fetch_local=False)
    if len(done) < len(refs):
        raise WaitTimeout(_message(what, timeout_s))


def get_reporting(refs: list[Any], timeout_s: float, what: str, log: Any, every_s: float = 20.0) -> list[Any]:
    """:func:`get` of ``refs`` (one deadline) that says ``what: k/n done, T s`` as each finishes
    and at least every ``every_s`` seconds, so a long stage is never silent."""
    import time

    t0 = time.monotonic()
    pending, done = list(refs), 0
    while pending:
        left = timeout_s - (time.monotonic() - t0)
        if left <= 0:
            raise WaitTimeout(_message(what, timeout_s))
        ready_now, pending = ray.wait(pending, num_returns=1, timeout=min(every_s, left), fetch_local=False)
        done += len(ready_now)
        log(f"{what}: {done}/{len(refs)} done, {time.monotonic() - t0:.0f} s")
    return get(refs, max(1.0, timeout_s - (time.monotonic() - t0)), what)
