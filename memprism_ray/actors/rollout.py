"""``RolloutWorker``: plays one GRPO group of G trajectories of one task step-synchronously
(docs/architecture.md "Distributed rollout"; paper "Adapter", outcome-guided optimisation).
It owns the group's event streams and a CPU copy of the Router, and reaches the other stages
through actors; the driver hands its step tables to the learner unread.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from memprism_ray.actors.services import PolicyPool, Pool, RayServices, RemoteViews, task_token_counter
from memprism_ray.actors.workers import EnvWorker
from memprism_ray.cluster.node_data import NodeData, node_label, node_place, on_this_node
from memprism_ray.cluster.placement import set_ray_env

if TYPE_CHECKING:
    from memprism_ray.benchmark import Benchmark
    from memprism_ray.config import ExperimentConfig


@dataclass(frozen=True)
class GroupSpec:
    """One task group: an explicit game, the trajectory ids and the sampling seed."""

    group_id: str
    game: dict[str, str]
    episode_ids: tuple[str, ...]
    seed: int
    iteration: int = 0


@dataclass
class GroupSummary:
    """What the driver reads of one played group (small: one dict per trajectory)."""

    group_id: str
    game_id: str
    weights_version: int
    episodes: list[dict[str, Any]] = field(default_factory=list)
    num_steps: int = 0
    seconds: float = 0.0
    worker: str = ""
    node: str = ""
    """where the group played (``node 10.0.0.3 (ab12cd34)``)"""
    phi_fallbacks: int = 0
    """decisions whose event an LLM Phi failed to extract, recorded by the rules (docs/phi.md)"""
    phi_fallback_first: str = ""

    @property
    def failed(self) -> int:
        return sum(1 for e in self.episodes if e["status"] == "failed")


class _Fault:
    """Fault injection: at the ``after_steps``-th step call the worker hangs, exits or raises."""

    def __init__(self, inner: Any, kind: str, after_steps: int) -> None:
        self.inner = inner
        self.kind = kind
        self.left = after_steps

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, requests: Any) -> Any:
        self.left -= 1
        if self.left <= 0:
            if self.kind == "crash":
                os._exit(1)
            if self.kind == "fail":
                raise RuntimeError("injected fault: this rollout worker fails every group")
            while True:  # a hang: only the driver's group timeout (ray.kill) ends it
                time.sleep(3600)
        return self.inner.step(requests)


@ray.remote(max_restarts=0, max_task_retries=0)
class RolloutWorker:
    """No automatic restart: the driver replaces a hung or dead worker (``RolloutFleet``);
    ``generation`` counts those replacements and keeps the EnvWorker names of each apart."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        index: int,
        model_state: dict[str, np.ndarray],
        phi_handles: list[Any],
        view_handles: list[Any],
        policy_handles: list[Any],
        needs_view_text: bool,
        run_name: str,
        generation: int = 0,
        data: NodeData | None = None,
        *,
        benchmark: Benchmark,
    ) -> None:
        set_ray_env()
        self.index = index
        self.run_name = run_name
        self.generation = generation
        self.doing = "placed"
        self.place = node_place()
        self.data = data or NodeData()  # what _setup and run_group localize their arguments with
        self._fault: tuple[str, int] | None = None
        # Two phases: __init__ only records where the worker was placed (so the driver can tell
        # a placed seat that is still loading from one that waits for a node), the first call
        # builds the rest. A build failure is raised by every call with its type (Ray keeps only
        # the text of an exception raised in __init__), so the driver can name it in one line.
        self._args = (cfg, benchmark, model_state, phi_handles, view_handles, policy_handles, needs_view_text)
        self.setup_error: BaseException | None = None

    def _ensure_setup(self) -> None:
        if self.setup_error is not None:
            raise self.setup_error
        if self._args is None:
            return
        args, self._args = self._args, None
        self.doing = "starting"
        try:
            self._setup(*args)
        except Exception as exc:
            self.setup_error = exc
            self.doing = f"failed to start: {type(exc).__name__}"
            raise
        self.doing = "idle"

    @on_this_node  # this node's copies of the games, fixtures, releases
    def _setup(
        self,
        cfg: ExperimentConfig,
        benchmark: Benchmark,
        model_state: dict[str, np.ndarray],
        phi_handles: list[Any],
        view_handles: list[Any],
        policy_handles: list[Any],
        needs_view_text: bool,
    ) -> None:
        """Build the worker from its constructor's arguments."""
        import torch
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from memprism_ray.router.encoder import TextEncoder
        from memprism_ray.router.features import FeatureExtractor
        from memprism_ray.router.model import ViewPolicyModel

        torch.set_num_threads(1)
        self.cfg = cfg
        ro = cfg.rollout
        self.benchmark = benchmark
        per = -(-ro.env_slots_per_worker // ro.env_workers_per_rollout)
        # The EnvWorkers run on this worker's node, inside the CPUs it reserved for its seat
        # (rollout_cpus + env_workers_per_rollout x env_cpus, trainer.grpo): a group's games
        # and its decision loop never step across nodes, and a seat is placed whole or not at all.
        here = NodeAffinitySchedulingStrategy(node_id=self.place["node_id"], soft=False)
        self.env_workers = [
            EnvWorker.options(
                name=self._env_name(k),
                num_cpus=0,
                max_restarts=ro.max_restarts,
                lifetime=None,
                scheduling_strategy=here,
            ).remote(per, benchmark, benchmark.env_options(cfg))
            for k in range(ro.env_workers_per_rollout)
        ]
        timeout = cfg.run.call_timeout_s
        if phi_handles:
            phi: Any = Pool(phi_handles, "extract", timeout)
        else:
            from memprism_ray.actors.services import build_actor_phi

            phi = build_actor_phi(
                benchmark, cfg.phi, policy_handles, timeout_s=timeout, key=f"phi-rollout-{self.index}"
            )
        if view_handles:
            # Rollout workers start pinning at different ViewWorkers so small groups spread too.
            views: Any = RemoteViews(view_handles, timeout, offset=self.index * cfg.grpo.group_size)
        else:
            from memprism_ray.views import ViewService

            views = ViewService(cfg.render, cache_size=ro.view_cache_size)
        if policy_handles:
            policy: Any = PolicyPool(policy_handles, timeout, caller=f"rollout-{self.index}")
        else:
            from memprism_ray.policy.factory import make_policy

            policy = make_policy(cfg.policy, self.benchmark.task_contract())
        self.services = RayServices(
            self.env_workers,
            per,
            phi=phi,
            views=views,
            policy=policy,
            timeout_s=timeout,
            needs_view_text=needs_view_text,
        )
        self.model = ViewPolicyModel(cfg.router)
        self.model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model_state.items()})
        self.model.eval()
        self.weights_version = 0
        self.features = FeatureExtractor(TextEncoder(cfg.encoder))
        self.tokens = task_token_counter(cfg)  # once: not a tokenizer load per group

    def __repr__(self) -> str:
        index, generation = getattr(self, "index", "?"), getattr(self, "generation", 0)
        place = getattr(self, "place", None)
        where = f" on {node_label(place)}" if place else ""
        return f"rollout-worker-{index}.{generation}{where}: {getattr(self, 'doing', 'starting')}"

    def placed(self) -> dict[str, Any]:
        """Where this worker was placed (answers as soon as Ray started its process)."""
        return dict(self.place)

    def start(self) -> dict[str, Any]:
        """Build the worker and wait for its EnvWorkers; where it runs. Raises what kept it from
        starting (e.g. :class:`NodeDataError`: its data missing on this node)."""
        self._ensure_setup()
        self._wait_for_envs()
        return {**self.place, "env_workers": self.env_worker_names()}

    def _env_name(self, k: int) -> str:
        return f"{self.run_name}-env-{self.index}.{self.generation}-{k}"

    def env_worker_names(self) -> list[str]:
        self._ensure_setup()
        return [self._env_name(k) for k in range(len(self.env_workers))]

    def inject_fault(self, kind: str, after_steps: int = 1) -> None:
        """Fault injection for tests and drills (:class:`_Fault`; ``"fail"``: every later group)."""
        if kind not in ("hang", "crash", "fail") or after_steps < 1:
            raise ValueError(
                f"inject_fault: kind must be 'hang', 'crash' or 'fail' and after_steps >= 1, got {kind!r}, "
                f"{after_steps!r}"
            )
        self._fault = (kind, after_steps)

    def _load_weights(self, weights: dict[str, np.ndarray] | None, version: int) -> None:
        import torch

        if weights is None or version == self.weights_version:
            return
        state = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
        missing = set(state) - set(self.model.state_dict())
        if missing:
            raise ValueError(f"weights for unknown Router parameters: {sorted(missing)[:3]}")
        self.model.load_state_dict(state, strict=False)
        self.model.eval()
        self.weights_version = version

    def _wait_for_envs(self, timeout_s: float = 120.0) -> None:
        """Block until every EnvWorker answers: after a crash Ray restarts it, and calls made
        in the moment between death and restart fail instead of queueing."""
        self._ensure_setup()
        deadline = time.monotonic() + timeout_s
        pending = list(self.env_workers)
        while pending:
            still = []
            for w in pending:
                try:
                    ray.get(w.pid.remote(), timeout=10)
                except Exception:
                    still.append(w)
            pending = still
            if pending:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{len(pending)} EnvWorker(s) did not come back within {timeout_s:.0f}s")
                time.sleep(0.5)

    @on_this_node  # the group's game as this node has it (outside: wraps copies ray.method's attributes)
    @ray.method(num_returns=2)
    def run_group(
        self, spec: GroupSpec, weights: dict[str, np.ndarray] | None, version: int
    ) -> tuple[GroupSummary, Any]:
        """Play ``spec``'s trajectories under Router weights ``version``: the group summary and
        its step table, two refs for the caller."""
        from memprism_ray.actors import metrics
        from memprism_ray.agent import Agent, EpisodeSpec, rows_to_arrow
        from memprism_ray.baselines import RouterSelector
        from memprism_ray.envs.base import GameRef

        self._ensure_setup()
        t0 = time.perf_counter()
        self.doing = f"iteration {spec.iteration + 1}, group {spec.group_id} ({len(spec.episode_ids)} trajectories)"
        self._wait_for_envs()
        self._load_weights(weights, version)
        cfg = self.cfg
        selector = RouterSelector(
            self.model,
            greedy=False,
            temperature=cfg.grpo.rollout_temperature,
            top_p=cfg.grpo.top_p,
            seed=spec.seed,
            name="memprism-rollout",
        )
        services: Any = self.services
        if self._fault is not None:
            services = _Fault(self.services, *self._fault)
        agent = Agent(
            services,
            selector,
            cfg.agent,
            features=self.features,
            record_features=True,
            token_counter=self.tokens,
            step_meta={"weights_version": version, "group_id": spec.group_id, "iteration": spec.iteration},
            contract=self.benchmark.task_contract(),
        )
        game = GameRef.from_dict(spec.game)
        specs = [EpisodeSpec(eid, game) for eid in spec.episode_ids]
        results = agent.run(specs, slots=list(range(len(specs))))
        rows, episodes = [], []
        for r in results:
            episodes.append({**r.summary(), "group_id": spec.group_id, "weights_version": version})
            for row in r.rows:
                row["traj_return"] = self.benchmark.trajectory_return(r, cfg.grpo)
                row["failed"] = r.failed
            rows.extend(r.rows)
        metrics.record_steps(self.run_name, rows)
        fallbacks = [str(row["phi_fallback"]) for row in rows if row.get("phi_fallback")]
        summary = GroupSummary(
            spec.group_id,
            game.game_id,
            version,
            episodes,
            num_steps=len(rows),
            seconds=time.perf_counter() - t0,
            worker=f"rollout-{self.index}.{self.generation}",
            node=node_label(self.place),
            phi_fallbacks=len(fallbacks),
            phi_fallback_first=fallbacks[0] if fallbacks else "",
        )
        self.doing = f"idle after group {spec.group_id}"
        return summary, rows_to_arrow(rows)

    def ping(self) -> int:
        self._ensure_setup()
        return self.index
