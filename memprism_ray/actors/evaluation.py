"""Distributed evaluation (paper appendix B): the ordered episode list is split over
``EvalWorker`` actors, each playing its share in-process with the same decision loop as
``memprism eval``; the driver gathers the episodes and writes the same reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from memprism_ray.actors.placement import set_ray_env


@ray.remote(max_restarts=2, max_task_retries=1)
class EvalWorker:
    """Env slots, Phi, task policy and (for Router conditions) the Router, in one process."""

    def __init__(self, cfg: Any, slots: int, router_state: dict[str, Any] | None) -> None:
        set_ray_env()
        import numpy as np
        import torch

        from memprism_ray.envs.alfworld import AlfworldEnv
        from memprism_ray.policy.factory import make_policy
        from memprism_ray.recorder.phi.alfworld import AlfworldPhi

        torch.set_num_threads(1)
        self.cfg = cfg
        self.env = AlfworldEnv(num_slots=slots)
        self.phi = AlfworldPhi()
        self.policy = make_policy(cfg.policy)
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
        )
        if marginal is not None:
            import json
            import tempfile

            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
                json.dump(list(marginal), fh)
            ev.marginal = fh.name
        eps = [EpisodeSpec(s["episode_id"], GameRef.from_dict(s["game"])) for s in specs]
        results, rows = run_condition(
            condition,
            eps,
            ev,
            env=self.env,
            phi=self.phi,
            policy=self.policy,
            router=self.router,
            features=self.features,
        )
        return {"results": results, "rows": rows}


def evaluate_distributed(
    cfg: Any,
    conditions: tuple[str, ...],
    router_state: dict[str, Any] | None,
    checkpoint: str,
    out_dir: Path,
    *,
    log: Any = print,
) -> dict[str, Any]:
    """Evaluate ``conditions`` on ``cfg.eval.split`` over ``cfg.eval.workers`` actors.

    ``freq_random`` samples from the view marginal measured in this run's ``memprism``
    condition (so list ``memprism`` first), as the paper's Frequency-Matched Random does.
    """
    from memprism_ray.agent import TokenCounter
    from memprism_ray.eval import report as rpt
    from memprism_ray.eval.episodes import build_episode_list
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.eval.runner import _safe, resolve_games, write_condition
    from memprism_ray.policy.prompts import PROMPT_VERSION
    from memprism_ray.policy.tokens import task_model_of

    games = resolve_games(cfg.eval.split, cfg.corpus.data_root)
    episodes = build_episode_list(cfg.eval.split, [g.game_id for g in games], cfg.eval.episodes or None, cfg.run.seed)
    by_id = {g.game_id: g for g in games}
    specs = [
        {"episode_id": eid, "game": by_id[gid].to_dict()} for eid, gid in zip(episodes.episode_ids, episodes.game_ids)
    ]
    needs_router = any(c.startswith(("memprism", "constrained")) for c in conditions)
    state_ref = ray.put(router_state) if (needs_router and router_state is not None) else None
    n_workers = max(1, min(cfg.eval.workers, len(specs)))
    workers = [
        EvalWorker.options(num_cpus=cfg.rollout.env_cpus).remote(cfg, cfg.eval.slots, state_ref)
        for _ in range(n_workers)
    ]
    tokens = TokenCounter(cfg.agent.token_counter, model=task_model_of(cfg.policy))
    reports, wins_by, marginal = [], {}, None
    out_dir.mkdir(parents=True, exist_ok=True)
    for condition in conditions:
        if condition == "freq_random" and marginal is None:
            raise ValueError("freq_random needs a memprism condition before it (its view marginal is sampled)")
        shares = [specs[i::n_workers] for i in range(n_workers)]
        parts = ray.get(
            [w.play.remote(condition, s, marginal) for w, s in zip(workers, shares) if s],
            timeout=cfg.run.call_timeout_s * 20,
        )
        order = {s["episode_id"]: i for i, s in enumerate(specs)}
        results = sorted((r for p in parts for r in p["results"]), key=lambda r: order[r.spec.episode_id])
        rows = [row for p in parts for row in p["rows"]]
        safe = _safe(condition)
        manifest = RunManifest.create(
            episodes=episodes,
            condition=condition,
            model_ids={"task_policy": cfg.policy.backend, "phi": "rule:alfworld"},
            checkpoint_sha256={},
            checkpoints={"router": checkpoint} if (checkpoint and condition.startswith("memprism")) else None,
            prompt_version=PROMPT_VERSION,
            decoding=cfg.policy.decoding(),
            output_paths={"dir": str(out_dir / safe)},
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
        wins_by[condition] = {r.spec.episode_id: r.won for r in results if not r.failed}
        log(f"eval {condition}: {rep['successes']}/{rep['n']} = {100 * rep['sr']:.1f}%")
    base = conditions[0]
    comparisons = {c: rpt.paired_comparison(wins_by[base], wins_by[c], seed=cfg.run.seed) for c in conditions}
    summary = {"base": base, "conditions": reports, "paired_vs_base": comparisons}
    if "memprism" in conditions:
        # The one table of issue 11: every condition against the trained Router.
        table, figures = rpt.final_table_markdown(reports, wins_by, router="memprism", seed=cfg.run.seed)
        summary["final_table"] = figures
        (out_dir / "final_table.md").write_text(table)
    rpt.write_json(out_dir / "summary.json", summary)
    (out_dir / "summary.md").write_text(rpt.summary_markdown(reports, comparisons, base))
    for w in workers:
        ray.kill(w)
    return summary
