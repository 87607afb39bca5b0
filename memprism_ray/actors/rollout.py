"""``RolloutWorker``: plays one GRPO group of G trajectories of one task step-synchronously
(docs/architecture.md "Distributed rollout"; paper "Adapter", outcome-guided optimisation).

It owns the group's event streams and a CPU copy of the Router (plus the frozen MiniLM
encoder for the Router features), and reaches environments, Phi, Composer/Render and the
task policy through actors. It returns a :class:`TrajectoryGroup`: an Arrow table with one
row per decision (features, sampled view index and its log-prob, weights version, action,
outcome, ...) and one summary per trajectory (return, status).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from memprism_ray.actors.placement import set_ray_env
from memprism_ray.actors.services import Pool, RayServices
from memprism_ray.actors.workers import EnvWorker


@dataclass(frozen=True)
class GroupSpec:
    """One task group: an explicit game, the trajectory ids and the sampling seed."""

    group_id: str
    game: dict[str, str]
    episode_ids: tuple[str, ...]
    seed: int
    iteration: int = 0


@dataclass
class TrajectoryGroup:
    """What a rollout worker returns for one group (plain data: crosses actor boundaries)."""

    group_id: str
    game_id: str
    weights_version: int
    steps: Any  # pyarrow.Table, one row per decision
    episodes: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    worker: str = ""

    @property
    def failed(self) -> int:
        return sum(1 for e in self.episodes if e["status"] == "failed")


def _local_policy(cfg: Any) -> Any:
    from memprism_ray.policy.factory import make_policy

    return make_policy(cfg.policy)


@ray.remote(max_restarts=3, max_task_retries=0)
class RolloutWorker:
    """See the module docstring. ``model_state`` is the full Router state dict (numpy)."""

    def __init__(
        self,
        cfg: Any,
        index: int,
        model_state: dict[str, np.ndarray],
        phi_handles: list[Any],
        view_handles: list[Any],
        policy_handles: list[Any],
        needs_view_text: bool,
        run_name: str,
    ) -> None:
        set_ray_env()
        import torch

        from memprism_ray.router.encoder import TextEncoder
        from memprism_ray.router.features import FeatureExtractor
        from memprism_ray.router.model import ViewPolicyModel

        torch.set_num_threads(1)
        self.cfg = cfg
        self.index = index
        self.run_name = run_name
        ro = cfg.rollout
        per = -(-ro.env_slots_per_worker // ro.env_workers_per_rollout)
        self.slots_per_env = per
        self.env_workers = [
            EnvWorker.options(
                name=f"{run_name}-env-{index}-{k}",
                num_cpus=ro.env_cpus,
                max_restarts=ro.max_restarts,
                lifetime=None,
            ).remote(per)
            for k in range(ro.env_workers_per_rollout)
        ]
        timeout = cfg.run.call_timeout_s
        if phi_handles:
            phi: Any = Pool(phi_handles, "extract", timeout)
        else:
            from memprism_ray.recorder.phi.alfworld import AlfworldPhi

            phi = AlfworldPhi()
        if view_handles:
            views: Any = Pool(view_handles, "render", timeout)
        else:
            from memprism_ray.views import ViewService

            views = ViewService(cfg.render, cache_size=ro.view_cache_size)
        self.services = RayServices(
            self.env_workers,
            per,
            phi=phi,
            views=views,
            policy=Pool(policy_handles, "act", timeout) if policy_handles else _local_policy(cfg),
            timeout_s=timeout,
            needs_view_text=needs_view_text,
        )
        self.model = ViewPolicyModel(cfg.router)
        self.model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model_state.items()})
        self.model.eval()
        self.weights_version = 0
        self.features = FeatureExtractor(TextEncoder(cfg.encoder))

    def env_worker_names(self) -> list[str]:
        return [f"{self.run_name}-env-{self.index}-{k}" for k in range(len(self.env_workers))]

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

    def run_group(self, spec: GroupSpec, weights: dict[str, np.ndarray] | None, version: int) -> TrajectoryGroup:
        """Play ``spec``'s trajectories under Router weights ``version``."""
        from memprism_ray.actors import metrics
        from memprism_ray.agent import Agent, EpisodeSpec, rows_to_arrow
        from memprism_ray.baselines import RouterSelector
        from memprism_ray.envs.base import GameRef

        t0 = time.perf_counter()
        self._wait_for_envs()
        self._load_weights(weights, version)
        cfg = self.cfg
        selector = RouterSelector(
            self.model, greedy=False, temperature=cfg.grpo.rollout_temperature, seed=spec.seed, name="memprism-rollout"
        )
        agent = Agent(
            self.services,
            selector,
            cfg.agent,
            features=self.features,
            record_features=True,
            step_meta={"weights_version": version, "group_id": spec.group_id, "iteration": spec.iteration},
        )
        game = GameRef.from_dict(spec.game)
        specs = [EpisodeSpec(eid, game) for eid in spec.episode_ids]
        results = agent.run(specs, slots=list(range(len(specs))))
        rows = []
        episodes = []
        for r in results:
            summary = r.summary()
            summary["group_id"] = spec.group_id
            summary["weights_version"] = version
            episodes.append(summary)
            for row in r.rows:
                row["traj_return"] = 1.0 if r.won else 0.0  # ALFWorld: binary terminal success
                row["failed"] = r.failed
            rows.extend(r.rows)
        metrics.record_steps(self.run_name, rows)
        return TrajectoryGroup(
            group_id=spec.group_id,
            game_id=game.game_id,
            weights_version=version,
            steps=rows_to_arrow(rows),
            episodes=episodes,
            seconds=time.perf_counter() - t0,
            worker=f"rollout-{self.index}",
        )

    def ping(self) -> int:
        return self.index
