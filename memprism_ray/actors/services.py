"""Actor-backed :class:`~memprism_ray.agent.AgentServices`: the same decision loop as
in-process runs, with each stage behind Ray actors.

Every call has a timeout. A call that fails (actor died, timeout) turns into an exception
*value* for exactly the requests it carried, so the loop fails only the trajectories on
that actor and the rest of the group goes on (DESIGN.md: a trajectory that failed for
infrastructure reasons is marked failed, never counted as a zero-reward sibling).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import ray

from memprism_ray.actors.workers import to_request
from memprism_ray.envs.base import GameRef, Observation, Transition
from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.phi.base import Extraction
from memprism_ray.views import RenderedView, ViewRequest


def _chunks(n: int, parts: int) -> list[range]:
    """``n`` items split into at most ``parts`` contiguous, near-equal ranges."""
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(range(start, end))
        start = end
    return [r for r in out if len(r)]


def gather(calls: Sequence[tuple[Any, int]], timeout_s: float, what: str = "actor call") -> list[Any]:
    """``ray.get`` each ``(ref, n_requests)`` with one deadline; a failed call yields its
    exception ``n_requests`` times (a ``TimeoutError`` naming ``what`` when it did not
    answer in time), a successful one its list of results."""
    refs = [ref for ref, _ in calls]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    ready_set = set(ready)
    out: list[Any] = []
    for ref, n in calls:
        if ref not in ready_set:
            ray.cancel(ref, force=False)
            out.extend([TimeoutError(f"{what}: no answer within {timeout_s:g}s")] * n)
            continue
        try:
            values = ray.get(ref, timeout=1.0)
        except Exception as exc:  # RayActorError, RayTaskError, ...
            out.extend([exc] * n)
            continue
        if len(values) != n:
            out.extend([RuntimeError(f"worker answered {len(values)} results for {n} requests")] * n)
        else:
            out.extend(values)
    return out


class Pool:
    """Round-robin over stateless actors: a batch is split into near-equal chunks, one per
    actor, starting at a rotating offset so concurrent callers spread the load."""

    _offsets = itertools.count()

    def __init__(self, handles: Sequence[Any], method: str, timeout_s: float) -> None:
        if not handles:
            raise ValueError(f"a {method} pool needs at least one actor")
        self.handles = list(handles)
        self.method = method
        self.timeout_s = timeout_s
        self._next = next(Pool._offsets) % len(self.handles)

    def map(self, items: Sequence[Any], make_args: Callable[[list[Any]], tuple[Any, ...]]) -> list[Any]:
        if not items:
            return []
        calls = []
        for k, rng in enumerate(_chunks(len(items), len(self.handles))):
            h = self.handles[(self._next + k) % len(self.handles)]
            calls.append((getattr(h, self.method).remote(*make_args([items[i] for i in rng])), len(rng)))
        self._next = (self._next + 1) % len(self.handles)
        return gather(calls, self.timeout_s, f"{self.method} on a pool actor")


class RayServices:
    """Agent services on actors.

    ``env_workers[k]`` holds ``slots_per_worker`` slots; global slot ``s`` lives on worker
    ``s // slots_per_worker``. ``phi`` is a pool or a local ``Phi``; ``views`` has
    ``render_each`` (a local ``ViewService`` or ``rollout.RemoteViews``); ``policy`` is a
    pool of :class:`PolicyReplica` or a local policy.
    """

    def __init__(
        self,
        env_workers: Sequence[Any],
        slots_per_worker: int,
        *,
        phi: Pool | Any,
        views: Any,
        policy: Pool | Any,
        timeout_s: float,
        needs_view_text: bool = False,
    ) -> None:
        self.env_workers = list(env_workers)
        self.slots_per_worker = slots_per_worker
        self.phi = phi
        self.view_pool = views
        self.policy_pool = policy
        self.timeout_s = timeout_s
        self.needs_view_text = needs_view_text
        # The agent reads this to decide whether optical conditions also need the view text.
        self.policy = type("PolicyTraits", (), {"needs_view_text": needs_view_text})()

    def _by_worker(self, requests: Sequence[tuple[int, Any]], method: str) -> list[Any]:
        groups: dict[int, list[int]] = {}
        for i, (slot, _) in enumerate(requests):
            groups.setdefault(slot // self.slots_per_worker, []).append(i)
        calls, order = [], []
        for w, idxs in groups.items():
            payload = [(requests[i][0] % self.slots_per_worker, requests[i][1]) for i in idxs]
            calls.append((getattr(self.env_workers[w], method).remote(payload), len(idxs)))
            order.extend(idxs)
        results = gather(calls, self.timeout_s, f"EnvWorker.{method}")
        out: list[Any] = [None] * len(requests)
        for i, r in zip(order, results):
            out[i] = r
        return out

    def reset(self, requests: Sequence[tuple[int, GameRef]]) -> list[Observation | BaseException]:
        return self._by_worker([(s, g.to_dict()) for s, g in requests], "reset")

    def step(self, requests: Sequence[tuple[int, str]]) -> list[Transition | BaseException]:
        return self._by_worker(requests, "step")

    def extract(self, raws: Sequence[RawEvent], states: Sequence[dict[str, str]]) -> list[Extraction | BaseException]:
        if isinstance(self.phi, Pool):
            pairs = list(zip(raws, states))
            return self.phi.map(pairs, lambda chunk: ([p[0] for p in chunk], [p[1] for p in chunk]))
        out: list[Any] = []
        for raw, state in zip(raws, states):
            try:
                out.append(self.phi.extract(raw, state))
            except Exception as exc:
                out.append(exc)
        return out

    def views(self, requests: Sequence[ViewRequest]) -> list[RenderedView | BaseException]:
        # A local ViewService, or the rollout worker's RemoteViews (composes here, where the
        # streams live, and has a ViewWorker pool draw): no stream leaves this process.
        return self.view_pool.render_each(requests)

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput | BaseException]:
        if isinstance(self.policy_pool, Pool):
            return self.policy_pool.map([to_request(i) for i in inputs], lambda chunk: (chunk,))
        try:  # an in-process policy (policy.num_replicas = 0)
            return list(self.policy_pool.act(inputs))
        except Exception as exc:
            return [exc for _ in inputs]
