"""The evaluation actor (paper appendix C), playing one wave of episodes per call with the
rollouts' decision loop; the driver side is :mod:`memprism_ray.trainer.evaluate`. A model-backed
task policy is reached through the policy pool (docs/gpu.md): the worker never builds a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray

from memprism_ray.actors.services import task_token_counter
from memprism_ray.cluster.node_data import NodeData, node_label, node_place, on_this_node
from memprism_ray.cluster.placement import set_ray_env

if TYPE_CHECKING:
    from memprism_ray.benchmark import Benchmark
    from memprism_ray.config import ExperimentConfig


@ray.remote(max_restarts=2, max_task_retries=1)
class EvalWorker:
    """Env slots, Phi, task policy and (for Router conditions) the Router, in one process."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        slots: int,
        router_state: dict[str, Any] | None,
        pool: list[Any] | None = None,
        key: str = "",
        data: NodeData | None = None,
        *,
        benchmark: Benchmark,
    ) -> None:
        set_ray_env()
        self.key = key or "eval"
        self.doing = "starting"
        self.place = node_place()
        self.data = data or NodeData()
        # As in RolloutWorker: a start failure is raised by the first call, with its type.
        self.setup_error: BaseException | None = None
        try:
            self._setup(cfg, benchmark, slots, router_state, pool, key)
            self.doing = "idle"
        except Exception as exc:
            self.setup_error = exc

    @on_this_node  # this node's copies of the games, fixtures, releases
    def _setup(
        self, cfg: ExperimentConfig, benchmark: Benchmark, slots: int, router_state: Any, pool: Any, key: str
    ) -> None:
        import numpy as np
        import torch

        from memprism_ray.actors.services import build_actor_phi, decision_policy

        torch.set_num_threads(1)
        self.cfg = cfg
        self.contract = benchmark.task_contract()
        self.env = benchmark.make_env(slots, benchmark.env_options(cfg))
        self.phi = build_actor_phi(
            benchmark, cfg.phi, pool, timeout_s=cfg.run.call_timeout_s, key=f"phi-{key or 'eval'}"
        )
        self.policy = decision_policy(cfg, self.contract, pool, key, "evaluation")
        self.tokens = task_token_counter(cfg)  # once: a tokenizer load per wave is wasted
        self.router = None
        self.features = None
        if router_state is not None:
            from memprism_ray.router.encoder import TextEncoder
            from memprism_ray.router.features import FeatureExtractor
            from memprism_ray.router.model import ViewPolicyModel

            self.router = ViewPolicyModel(cfg.router)
            self.router.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in router_state.items()})
            self.router.eval()
            self.features = FeatureExtractor(TextEncoder(cfg.encoder))

    def __repr__(self) -> str:
        place = getattr(self, "place", None)
        where = f" on {node_label(place)}" if place else ""
        return f"eval-worker {getattr(self, 'key', '?')}{where}: {getattr(self, 'doing', 'starting')}"

    def start(self) -> dict[str, Any]:
        """Where this worker runs; raises what kept it from starting (data missing here)."""
        if self.setup_error is not None:
            raise self.setup_error
        return dict(self.place)

    @on_this_node  # the episodes' games as this node has them
    def play(self, condition: str, specs: list[dict[str, Any]], marginal: list[float] | None) -> list[Any]:
        """Play ``specs`` (one wave: at most ``slots`` episodes) under ``condition``: one result per
        spec, in order, each with its step rows (``freq_random`` samples ``marginal``)."""
        if self.setup_error is not None:
            raise self.setup_error
        self.doing = f"{condition}, {len(specs)} episodes from {specs[0]['episode_id'] if specs else '-'}"
        import dataclasses

        from memprism_ray.agent import Agent, EpisodeResult, EpisodeSpec, LocalServices
        from memprism_ray.baselines import make_selector
        from memprism_ray.envs.base import GameRef
        from memprism_ray.views import ViewService

        cfg = self.cfg
        eps = [EpisodeSpec(s["episode_id"], GameRef.from_dict(s["game"])) for s in specs]
        try:
            selector = make_selector(
                condition, router=self.router, marginal=marginal, seed=cfg.run.seed, memory=cfg.eval.memory
            )
            agent = Agent(
                LocalServices(self.env, self.phi, self.policy, ViewService(cfg.render)),  # the run's render.*
                selector,
                dataclasses.replace(cfg.agent, keep_views=cfg.eval.artifacts > 0),
                features=self.features if selector.uses_features else None,
                keep_views_for=[s["episode_id"] for s in specs if s.get("keep_views")],
                token_counter=self.tokens,
                contract=self.contract,
            )
            results = agent.run(eps)
        except Exception as exc:  # a crash of the loop itself: its episodes fail, the run goes on
            results = [EpisodeResult(e, status="failed", error=f"crashed: {type(exc).__name__}: {exc}") for e in eps]
        self.doing = f"idle after {condition}"
        return results
