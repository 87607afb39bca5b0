"""Distributed evaluation (paper appendix C): the ordered episode list is split over
``EvalWorker`` actors, each playing its share in-process with the same decision loop as
``memprism eval``; the driver gathers the episodes and writes the same reports. With a
model-backed task policy (vllm, hf) the workers decide through the policy pool's replicas
(docs/gpu.md): no evaluation worker builds a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from memprism_ray.actors.placement import set_ray_env
from memprism_ray.actors.workers import replicas_for, stop_policy_replicas
from memprism_ray.recorder.phi.factory import phi_id

#: Backends whose model lives in the policy pool's replicas.
POOL_BACKENDS = ("vllm", "hf")


@ray.remote(max_restarts=2, max_task_retries=1)
class EvalWorker:
    """Env slots, Phi, task policy and (for Router conditions) the Router, in one process."""

    def __init__(
        self, cfg: Any, slots: int, router_state: dict[str, Any] | None, pool: list[Any] | None = None, key: str = ""
    ) -> None:
        set_ray_env()
        import numpy as np
        import torch

        from memprism_ray.actors.services import build_actor_phi
        from memprism_ray.envs.registry import env_options, make_env
        from memprism_ray.policy.factory import make_policy

        torch.set_num_threads(1)
        self.cfg = cfg
        self.env = make_env(cfg.corpus.benchmark, slots, env_options(cfg))
        self.phi = build_actor_phi(
            cfg.corpus.benchmark, cfg.phi, pool, timeout_s=cfg.run.call_timeout_s, key=f"phi-{key or 'eval'}"
        )
        if pool:
            from memprism_ray.actors.services import PolicyPool, PoolPolicy
            from memprism_ray.policy.factory import needs_view_text

            self.policy = PoolPolicy(
                PolicyPool(pool, cfg.run.call_timeout_s, caller=key), key, needs_view_text(cfg.policy)
            )
        elif cfg.policy.backend in POOL_BACKENDS:
            raise ValueError(f"policy.backend={cfg.policy.backend}: evaluation runs on the policy pool, none was given")
        else:
            self.policy = make_policy(cfg.policy)  # scripted stand-in or an HTTP client: no model here
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

    def play(self, condition: str, specs: list[dict[str, Any]], marginal: list[float] | None) -> dict[str, Any]:
        from memprism_ray.agent import EpisodeSpec
        from memprism_ray.envs.base import GameRef
        from memprism_ray.eval.runner import EvalConfig, run_condition

        ev = EvalConfig(
            conditions=(condition,),
            seed=self.cfg.run.seed,
            slots=self.env.num_slots,
            artifacts=self.cfg.eval.artifacts,
            agent=self.cfg.agent,
            policy=self.cfg.policy,
            memory=self.cfg.eval.memory,
        )
        if marginal is not None:
            import json
            import tempfile

            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
                json.dump(list(marginal), fh)
            ev.marginal = fh.name
        eps = [EpisodeSpec(s["episode_id"], GameRef.from_dict(s["game"])) for s in specs]
        keep = [s["episode_id"] for s in specs if s.get("keep_views")]
        results, rows = run_condition(
            condition,
            eps,
            ev,
            env=self.env,
            phi=self.phi,
            policy=self.policy,
            router=self.router,
            features=self.features,
            keep_views_for=keep,
        )
        return {"results": results, "rows": rows}


def router_state_for(cfg: Any, checkpoint: str) -> dict[str, Any] | None:
    """The Router weights (numpy, for the evaluation workers) when ``eval.conditions`` has a
    Router condition, with ``cfg.router`` set to the checkpoint's architecture; ``None``
    otherwise. A Router condition without a checkpoint is a ``ValueError``."""
    if not any(c.startswith(("memprism", "constrained")) for c in cfg.eval.conditions):
        return None
    if not checkpoint:
        raise ValueError("Router conditions need --checkpoint DIR (a D1 or D2 checkpoint directory)")
    from memprism_ray.actors.learner import state_to_numpy
    from memprism_ray.adapter.checkpoint import load_model

    model = load_model(checkpoint)
    cfg.router = model.config
    return state_to_numpy(model.state_dict())


def play_condition(
    workers: list[Any],
    condition: str,
    specs: list[dict[str, Any]],
    plan: list[Any],
    marginal: list[float] | None,
    timeout_s: float,
    known: dict[str, Any] | None = None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Play ``condition`` on every episode of ``plan`` (``specs``: the same episodes as dicts),
    split evenly over the :class:`EvalWorker` actors: ``(one result per planned episode, in
    plan order; the step rows)``. A worker that dies or times out fails its share of the plan
    with the reason; an episode that got no result fails as lost; ``known`` results (e.g.
    broken game files) are kept. Nothing planned is dropped from the denominators."""
    from memprism_ray.eval.runner import failed_result

    n = len(workers)
    shares = [specs[i::n] for i in range(n)]
    calls = [(w.play.remote(condition, s, marginal), s) for w, s in zip(workers, shares, strict=True) if s]
    by_id: dict[str, Any] = dict(known or {})
    rows: list[dict[str, Any]] = []
    for ref, share in calls:
        try:
            part = ray.get(ref, timeout=timeout_s)
        except Exception as exc:  # a lost worker: its share of the plan fails, with the reason
            error = f"crashed: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
            lost = {x["episode_id"] for x in share}
            part = {"results": [failed_result(s, error) for s in plan if s.episode_id in lost], "rows": []}
        by_id.update({r.spec.episode_id: r for r in part["results"]})
        rows.extend(part["rows"])
    lost_reason = "lost: no result came back for this episode"
    return [by_id.get(s.episode_id) or failed_result(s, lost_reason) for s in plan], rows


def evaluate_distributed(
    cfg: Any,
    conditions: tuple[str, ...],
    router_state: dict[str, Any] | None,
    checkpoint: str,
    out_dir: Path,
    *,
    log: Any = print,
    pool: list[Any] | None = None,
) -> dict[str, Any]:
    """Evaluate ``conditions`` on ``cfg.eval.split`` over ``cfg.eval.workers`` actors.

    ``pool``: policy replicas to decide with (a training job passes its own); when the
    backend needs one and none is given, replicas are started here and stopped at the end.

    ``freq_random`` samples from the view marginal measured in this run's ``memprism``
    condition (so list ``memprism`` first), as the paper's Frequency-Matched Random does.
    """
    from memprism_ray.agent import TokenCounter
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.eval.runner import (
        _safe,
        check_fresh_output,
        failed_result,
        memory_manifest,
        plan_episodes,
        write_condition,
        write_summary,
    )
    from memprism_ray.policy.prompts import PROMPT_VERSION
    from memprism_ray.policy.tokens import task_model_of

    check_fresh_output(out_dir)  # before any work: reports are never silently replaced

    # Every episode of the plan is reported: a broken game's episodes fail without being played.
    episodes, plan, broken = plan_episodes(cfg.eval.split, cfg.corpus.data_root, cfg.eval.episodes, cfg.run.seed)
    if broken:
        log(f"{len(broken)} broken game(s) in split {cfg.eval.split!r}: their episodes count as failures")
    # Only the episodes whose viewer is written (the plan's first eval.artifacts) keep their
    # step views: the others' PNGs would be encoded and shipped back only to be dropped.
    viewed = {s.episode_id for s in plan[: cfg.eval.artifacts]}
    specs = [
        {"episode_id": s.episode_id, "game": s.game.to_dict(), "keep_views": s.episode_id in viewed}
        for s in plan
        if s.game.game_id not in broken
    ]
    needs_router = any(c.startswith(("memprism", "constrained")) for c in conditions)
    state_ref = ray.put(router_state) if (needs_router and router_state is not None) else None
    n_workers = max(1, min(cfg.eval.workers, len(specs) or 1))
    handles, started = replicas_for(cfg, pool, cfg.policy.backend in POOL_BACKENDS, log, "the evaluation")
    workers = [
        EvalWorker.options(num_cpus=cfg.rollout.env_cpus).remote(cfg, cfg.eval.slots, state_ref, handles, f"eval-{i}")
        for i in range(n_workers)
    ]
    tokens = TokenCounter(cfg.agent.token_counter, model=task_model_of(cfg.policy))
    reports, results_by, marginal = [], {}, None
    out_dir.mkdir(parents=True, exist_ok=True)
    for condition in conditions:
        if condition == "freq_random" and marginal is None:
            raise ValueError("freq_random needs a memprism condition before it (its view marginal is sampled)")
        known = {s.episode_id: failed_result(s, broken[s.game.game_id]) for s in plan if s.game.game_id in broken}
        results, rows = play_condition(workers, condition, specs, plan, marginal, cfg.run.call_timeout_s * 20, known)
        safe = _safe(condition)
        manifest = RunManifest.create(
            episodes=episodes,
            condition=condition,
            model_ids={"task_policy": cfg.policy.backend, "phi": phi_id(cfg)},
            checkpoint_sha256={},
            checkpoints={"router": checkpoint} if (checkpoint and condition.startswith("memprism")) else None,
            prompt_version=PROMPT_VERSION,
            decoding=cfg.policy.decoding(),
            output_paths={"dir": str(out_dir / safe)},
            extra=memory_manifest(condition, cfg.eval.memory),
        )
        rep = write_condition(
            condition,
            results,
            rows,
            out_dir / safe,
            manifest,
            tokenizer=tokens.name,
            max_steps=cfg.agent.max_steps,
            artifacts=cfg.eval.artifacts,
        )
        if condition == "memprism":
            marginal = rep["view_selection"]["view_marginal"]
        reports.append(rep)
        results_by[condition] = results
        failed = f", {rep['failed_episodes']} failed" if rep["failed_episodes"] else ""
        log(f"eval {condition}: {rep['successes']}/{rep['n']} = {100 * rep['sr']:.1f}%{failed}")
    summary = write_summary(out_dir, reports, results_by, seed=cfg.run.seed)
    for w in workers:
        ray.kill(w)
    stop_policy_replicas(started)
    return summary
