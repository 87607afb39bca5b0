"""Actor-backed :class:`~memprism_ray.agent.AgentServices`: the in-process decision loop with
each stage behind Ray actors; a failed call is an exception *value* for exactly the requests
it carried (docs/architecture.md "Failures").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import ray

from memprism_ray.actors.wire import to_request
from memprism_ray.envs.base import GameRef, Observation, Transition
from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.phi.base import Extraction
from memprism_ray.views import RenderedView, ViewRequest

if TYPE_CHECKING:
    from memprism_ray.agent import TokenCounter
    from memprism_ray.benchmark import Benchmark
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.recorder.phi.config import PhiConfig


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
    exception (a ``TimeoutError`` naming ``what`` when late) ``n_requests`` times."""
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
    """Round-robin over stateless actors: a batch in near-equal chunks, one per actor, from a
    rotating offset so concurrent callers spread the load."""

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


class PolicyPool:
    """The caller's side of the task-policy pool (docs/gpu.md "Routing").

    A group of decisions sticks to one :class:`~memprism_ray.actors.workers.PolicyReplica`
    (its prefix and image caches stay warm: on an H100, one repeated view image read at 85.4
    decisions/s against 28.5 for distinct ones, docs/gpu.md); a new group goes to the
    least-loaded replica. Without ``group``, the episodes of a batch that no replica serves yet
    form one new group, and a group whose episodes stopped appearing is released.
    """

    def __init__(self, handles: Sequence[Any], timeout_s: float, *, caller: str = "") -> None:
        if not handles:
            raise ValueError("a policy pool needs at least one PolicyReplica")
        self.handles = list(handles)
        self.timeout_s = timeout_s
        self.caller = caller or f"pool{next(Pool._offsets)}"
        # Different callers start their tie-breaks on different replicas.
        self._offset = sum(self.caller.encode()) % len(self.handles)
        self._group_replica: dict[str, int] = {}
        self._episode_group: dict[str, str] = {}
        self._groups = itertools.count()

    def _loads(self) -> list[float]:
        refs = [h.load.remote() for h in self.handles]
        out: list[float] = []
        for ref in refs:
            try:
                out.append(float(ray.get(ref, timeout=self.timeout_s)))
            except Exception:  # a dead or restarting replica takes no new group
                out.append(float("inf"))
        return out

    def assign(self, group: str, size: int) -> int:
        """The replica that serves ``group`` (claimed on first use)."""
        if group in self._group_replica:
            return self._group_replica[group]
        from memprism_ray.policy.pool import pick_least_loaded

        choice = self._offset
        for _ in range(2 * len(self.handles) + 2):
            loads = self._loads()
            if all(v == float("inf") for v in loads):
                break  # the call below fails per request and says why
            choice = pick_least_loaded(loads, self._offset)
            try:
                granted, _ = ray.get(
                    self.handles[choice].claim.remote(group, size, int(loads[choice])), timeout=self.timeout_s
                )
            except Exception:
                continue
            if granted:
                break
        self._group_replica[group] = choice
        return choice

    def release(self, group: str) -> None:
        idx = self._group_replica.pop(group, None)
        if idx is not None:
            self.handles[idx].release.remote(group)  # fire and forget; the TTL covers a lost message

    def _episode_groups(self, inputs: Sequence[PolicyInput]) -> list[str]:
        eids = [str(inp.meta.get("episode_id", "")) or f"#{i}" for i, inp in enumerate(inputs)]
        new = [e for e in eids if e not in self._episode_group]
        if new:
            live = {self._episode_group[e] for e in eids if e in self._episode_group}
            for g in set(self._group_replica) - live:  # the caller moved on from these groups
                self.release(g)
            self._episode_group = {e: g for e, g in self._episode_group.items() if g in live}
            key = f"{self.caller}:g{next(self._groups)}"
            for e in new:
                self._episode_group[e] = key
        return [self._episode_group[e] for e in eids]

    def act(self, inputs: Sequence[PolicyInput], group: str | None = None) -> list[PolicyOutput | BaseException]:
        if not inputs:
            return []
        keys = [group] * len(inputs) if group else self._episode_groups(inputs)
        by_key: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            by_key.setdefault(k, []).append(i)
        calls, order = [], []
        for k, idxs in by_key.items():
            h = self.handles[self.assign(k, len(idxs))]
            calls.append((h.act.remote([to_request(inputs[i]) for i in idxs], k), len(idxs)))
            order.extend(idxs)
        results = gather(calls, self.timeout_s)
        out: list[Any] = [None] * len(inputs)
        for i, r in zip(order, results, strict=True):
            out[i] = r
        for k, idxs in by_key.items():
            if isinstance(out[idxs[0]], ray.exceptions.RayActorError):
                # The replica died (or is restarting and reloading its model): this step's
                # requests failed; the group's next step goes to a live replica.
                self._group_replica.pop(k, None)
        return out

    def complete(
        self, prompts: Sequence[str], *, max_tokens: int, temperature: float = 0.0, group: str
    ) -> list[str | BaseException]:
        """Teacher completions (D1 LLM view teacher), one request per prompt, as ``group``."""
        if not prompts:
            return []
        h = self.handles[self.assign(group, len(prompts))]
        call = h.complete.remote(list(prompts), max_tokens, temperature, group)
        return gather([(call, len(prompts))], self.timeout_s)


def task_token_counter(cfg: ExperimentConfig) -> TokenCounter:
    """The prompt-text token counter of a job's decision loops (``agent.token_counter`` with the
    task model's tokenizer; paper appendix C.1: counts compare only within one tokenizer). Read
    from the config: a worker deciding through the pool holds a policy that names no model."""
    from memprism_ray.agent import TokenCounter
    from memprism_ray.policy.tokens import task_model_of

    return TokenCounter(cfg.agent.token_counter, model=task_model_of(cfg.policy))


class PoolPolicy:
    """A task policy on the pool for an in-process decision loop: the whole caller is one group."""

    name = "pool"

    def __init__(self, pool: PolicyPool, group: str, needs_view_text: bool = False) -> None:
        self.pool = pool
        self.group = group
        self.needs_view_text = needs_view_text

    def act(self, inputs: Sequence[PolicyInput]) -> list[Any]:
        return self.pool.act(inputs, group=self.group)


def decision_policy(cfg: ExperimentConfig, contract: Any, pool: list[Any] | None, key: str, stage: str) -> Any:
    """The task policy of an in-process decision loop on Ray: the pool's replicas when given, else
    one without a model (the scripted stand-in or an HTTP client); ``stage`` names the caller."""
    from memprism_ray.policy.config import POOL_BACKENDS
    from memprism_ray.policy.factory import make_policy, needs_view_text

    if pool:
        policy_pool = PolicyPool(pool, cfg.run.call_timeout_s, caller=key)
        return PoolPolicy(policy_pool, key, needs_view_text(cfg.policy, contract))
    if cfg.policy.backend in POOL_BACKENDS:
        raise ValueError(f"policy.backend={cfg.policy.backend}: {stage} runs on the policy pool, none was given")
    return make_policy(cfg.policy, contract)


class RemoteViews:
    """Views for a ``ViewWorker`` pool, each stream pinned to one worker and sent as deltas."""

    def __init__(self, handles: Sequence[Any], timeout_s: float, offset: int = 0) -> None:
        from memprism_ray.views import DeltaTracker

        if not handles:
            raise ValueError("RemoteViews needs at least one ViewWorker")
        self.handles = list(handles)
        self.timeout_s = timeout_s
        self.tracker = DeltaTracker(len(self.handles), offset=offset)

    def render_each(self, requests: Sequence[ViewRequest]) -> list[RenderedView | BaseException]:
        from memprism_ray.views import StreamOutOfSync

        out: list[Any] = self._send(requests, range(len(requests)), full=False)
        resend = [i for i, r in enumerate(out) if isinstance(r, StreamOutOfSync)]
        if resend:  # the worker restarted or dropped the replica: send those streams whole
            for i, r in zip(resend, self._send(requests, resend, full=True), strict=True):
                out[i] = r
        for req, r in zip(requests, out, strict=True):
            self.tracker.acknowledge(req.stream, 0 if isinstance(r, BaseException) else len(req.stream))
        return out

    def _send(self, requests: Sequence[ViewRequest], idxs: Sequence[int], *, full: bool) -> list[Any]:
        by_worker: dict[int, list[int]] = {}
        deltas = {}
        for i in idxs:
            w, deltas[i] = self.tracker.request(requests[i], full=full)
            by_worker.setdefault(w, []).append(i)
        calls, order = [], []
        for w, members in by_worker.items():
            calls.append((self.handles[w].render_deltas.remote([deltas[i] for i in members]), len(members)))
            order.extend(members)
        results = dict(zip(order, gather(calls, self.timeout_s, "ViewWorker.render_deltas"), strict=True))
        return [results[i] for i in idxs]


class RayServices:
    """Agent services on actors: global slot ``s`` lives on ``env_workers[s // slots_per_worker]``."""

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
        for i, r in zip(order, results, strict=True):
            out[i] = r
        return out

    def reset(self, requests: Sequence[tuple[int, GameRef]]) -> list[Observation | BaseException]:
        return self._by_worker([(s, g.to_dict()) for s, g in requests], "reset")

    def step(self, requests: Sequence[tuple[int, str]]) -> list[Transition | BaseException]:
        return self._by_worker(requests, "step")

    def extract(self, raws: Sequence[RawEvent], states: Sequence[dict[str, str]]) -> list[Extraction | BaseException]:
        if isinstance(self.phi, Pool):
            pairs = list(zip(raws, states, strict=True))
            return self.phi.map(pairs, lambda chunk: ([p[0] for p in chunk], [p[1] for p in chunk]))
        from memprism_ray.recorder.phi.factory import extract_each  # batched for an LLM Phi (docs/phi.md)

        return extract_each(self.phi, raws, states)

    def views(self, requests: Sequence[ViewRequest]) -> list[RenderedView | BaseException]:
        # A local ViewService, or the rollout worker's RemoteViews (composes here, where the
        # streams live, and has a ViewWorker pool draw): no stream leaves this process.
        return self.view_pool.render_each(requests)

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput | BaseException]:
        if isinstance(self.policy_pool, PolicyPool):
            return self.policy_pool.act(inputs)
        try:  # an in-process policy (policy.num_replicas = 0)
            return list(self.policy_pool.act(inputs))
        except Exception as exc:
            return [exc for _ in inputs]


def build_actor_phi(
    benchmark: Benchmark,
    phi_config: PhiConfig | None,
    pool: Sequence[Any] | None = None,
    *,
    timeout_s: float = 300.0,
    key: str = "phi",
) -> Any:
    """The Phi an actor records with (docs/phi.md): the benchmark's rule Phi, or an LLM Phi over
    it asking an endpoint or the policy pool (``pool``, as group ``key``: one replica per actor)."""
    from memprism_ray.recorder.phi.factory import build_phi

    spec = benchmark.phi_spec()
    if phi_config is None or phi_config.kind != "llm" or phi_config.llm_source != "pool":
        return build_phi(spec, phi_config)
    if not pool:
        raise ValueError(
            f"phi.llm_source=pool, but {key} was started without policy replicas (policy.num_replicas >= 1 and "
            "policy.backend vllm are needed)"
        )
    from memprism_ray.recorder.phi.llm_client import PoolComplete

    complete_texts = partial(
        PolicyPool(list(pool), timeout_s, caller=key).complete,
        max_tokens=phi_config.max_tokens,
        temperature=phi_config.temperature,
        group=key,
    )
    return build_phi(spec, phi_config, complete=PoolComplete(complete_texts))
