"""Mind2Web on Ray: distributed teacher-forced evaluation and D1 labelling (paper
"Benchmarks"; appendix "Training dataset setup"; docs/mind2web.md). Thin: the work is in
:mod:`memprism_ray.pipeline.mind2web` and :mod:`memprism_ray.eval.mind2web`; the actors are
the shared ``EvalWorker`` (env and Phi built from ``corpus.benchmark``) and Ray tasks.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import ray

from memprism_ray.actors import waits
from memprism_ray.actors.evaluation import POOL_BACKENDS, EvalWorker, play_condition
from memprism_ray.actors.placement import set_ray_env
from memprism_ray.actors.workers import replicas_for, stop_policy_replicas
from memprism_ray.recorder.phi.factory import phi_id


def evaluate_mind2web(
    cfg: Any,
    conditions: tuple[str, ...],
    router_state: dict[str, Any] | None,
    checkpoint: str,
    out_dir: Path,
    *,
    log: Any = print,
    pool: list[Any] | None = None,
) -> dict[str, Any]:
    """Evaluate ``conditions`` on ``mind2web.eval_splits`` over ``eval.workers`` actors; every
    condition plays the same ordered plan. Writes per condition the generic report plus the
    Mind2Web metrics, and ``mind2web.md`` / ``mind2web.json`` (per split, paired against the
    first condition) beside the generic ``summary.md``. Returns the Mind2Web summary with the
    generic one under ``"generic"``."""
    from memprism_ray.agent import TokenCounter
    from memprism_ray.eval import mind2web as m2w
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.eval.runner import _safe, check_fresh_output, write_summary
    from memprism_ray.pipeline.mind2web import plan_episodes
    from memprism_ray.policy.prompts import PROMPT_VERSION
    from memprism_ray.policy.tokens import task_model_of

    check_fresh_output(out_dir)
    plan, expected = plan_episodes(cfg.corpus.data_root, cfg.mind2web.eval_splits, cfg.mind2web.eval_tasks)
    log(f"eval: {len(plan)} tasks, {sum(expected.values())} recorded steps over {', '.join(cfg.mind2web.eval_splits)}")
    specs = [{"episode_id": s.episode_id, "game": s.game.to_dict()} for s in plan]
    needs_router = any(c.startswith(("memprism", "constrained")) for c in conditions)
    state_ref = ray.put(router_state) if (needs_router and router_state is not None) else None
    n_workers = max(1, min(cfg.eval.workers, len(specs) or 1))
    handles, started = replicas_for(cfg, pool, cfg.policy.backend in POOL_BACKENDS, log, "the evaluation")
    workers = [
        EvalWorker.options(num_cpus=cfg.rollout.env_cpus).remote(cfg, cfg.eval.slots, state_ref, handles, f"eval-{i}")
        for i in range(n_workers)
    ]
    tokens = TokenCounter(cfg.agent.token_counter, model=task_model_of(cfg.policy))
    reports, results_by, rows_by, marginal = [], {}, {}, None
    out_dir.mkdir(parents=True, exist_ok=True)
    episode_list = _episode_list(plan, cfg.run.seed)
    try:
        for condition in conditions:
            if condition == "freq_random" and marginal is None:
                raise ValueError("freq_random needs a memprism condition before it (its view marginal is sampled)")
            results, rows = play_condition(workers, condition, specs, plan, marginal, cfg.run.call_timeout_s * 20)
            manifest = RunManifest.create(
                episodes=episode_list,
                condition=condition,
                model_ids={"task_policy": cfg.policy.backend, "phi": phi_id(cfg)},
                benchmark="mind2web",
                checkpoint_sha256={},
                checkpoints={"router": checkpoint} if (checkpoint and condition.startswith("memprism")) else None,
                prompt_version=PROMPT_VERSION,
                decoding=cfg.policy.decoding(),
                output_paths={"dir": str(out_dir / _safe(condition))},
            )
            rep = m2w.write_condition(
                condition,
                results,
                rows,
                out_dir / _safe(condition),
                manifest,
                expected_steps=expected,
                tokenizer=tokens.name,
                max_steps=cfg.agent.max_steps,
                artifacts=cfg.eval.artifacts,
            )
            if condition == "memprism":
                marginal = rep["view_selection"]["view_marginal"]
            reports.append(rep)
            results_by[condition] = results
            rows_by[condition] = rows
            o = rep["mind2web"]["overall"]
            log(
                f"eval {condition}: step accuracy {o['step_accuracy']['correct']}/{o['step_accuracy']['n']}"
                f" = {100 * o['step_accuracy']['rate']:.1f}%, exact success {o['episode_success']['correct']}"
                f"/{o['episode_success']['n']}" + (f", {o['failed_episodes']} failed" if o["failed_episodes"] else "")
            )
        generic = write_summary(out_dir, reports, results_by, seed=cfg.run.seed)
        summary = m2w.write_summary(out_dir, reports, results_by, rows_by, expected, seed=cfg.run.seed)
    finally:
        for w in workers + started:
            ray.kill(w)
    summary["generic"] = generic
    return summary


def _episode_list(plan: list[Any], seed: int) -> Any:
    """The plan as the manifest records it: every task of each split once, in file order."""
    from memprism_ray.eval.episodes import EpisodeList

    splits = list(dict.fromkeys(s.game.split for s in plan))
    return EpisodeList(
        split="mind2web",
        seed=seed,
        episode_ids=tuple(s.episode_id for s in plan),
        n_unique_games=len({(s.game.split, s.game.game_id) for s in plan}),
        rule=f"mind2web-file-order-v1: each task of {', '.join(splits)} once, splits and files in order",
    )


@ray.remote(num_cpus=1, max_retries=1)
def mind2web_label_task(games: list[dict[str, str]], cfg: Any, pool: list[Any] | None = None, key: str = "") -> bytes:
    """D1 records of some training tasks: human trajectories -> view-teacher labels, as
    SFT-dataset Parquet bytes. Counterfactual teacher with the task policy (scripted on
    CPU, the policy pool on GPU) or the LLM teacher with the Mind2Web prompt."""
    set_ray_env()
    import pyarrow.parquet as pq

    from memprism_ray.envs.base import GameRef
    from memprism_ray.pipeline import mind2web as pm
    from memprism_ray.router.encoder import TextEncoder
    from memprism_ray.router.features import FeatureExtractor

    states = pm.label_states(pm.human_streams([GameRef.from_dict(g) for g in games]))
    extractor = FeatureExtractor(TextEncoder(cfg.encoder))
    if cfg.label.teacher == "llm":
        from memprism_ray.actors.d1 import _pool, llm_teacher_config
        from memprism_ray.pipeline.llm_labels import llm_labels

        complete_many = None
        if pool:
            policy_pool = _pool(pool, cfg, key)

            def complete_many(prompts: list[str]) -> list[Any]:
                return policy_pool.complete(prompts, max_tokens=cfg.label.llm_max_tokens, temperature=0.0, group=key)

        teacher_cfg = llm_teacher_config(cfg)
        teacher_cfg.prompt = "mind2web"
        with pm.Mind2WebLLMTeacher(teacher_cfg) as teacher:
            dataset, _ = llm_labels(
                states, extractor, teacher, complete_many=complete_many, concurrency=cfg.label.llm_concurrency
            )
    else:
        from memprism_ray.actors.d1 import POOL_BACKENDS as D1_POOL
        from memprism_ray.policy.config import PolicyConfig
        from memprism_ray.policy.factory import make_policy
        from memprism_ray.policy.factory import needs_view_text as policy_needs_view_text

        if pool:
            from memprism_ray.actors.d1 import _pool
            from memprism_ray.actors.services import PoolPolicy

            policy: Any = PoolPolicy(_pool(pool, cfg, key), key, policy_needs_view_text(cfg.policy))
        elif cfg.policy.backend == "scripted":
            scripted = {"temperature": cfg.label.policy_temperature, "seed": cfg.run.seed}
            policy = make_policy(PolicyConfig(backend="scripted", scripted=scripted))
        elif cfg.policy.backend in D1_POOL:
            raise ValueError(f"policy.backend={cfg.policy.backend}: D1 labelling runs on the policy pool, none given")
        else:
            policy = make_policy(cfg.policy)
        dataset, _ = pm.counterfactual_labels(
            states,
            extractor,
            policy,
            render_config=cfg.render,
            short_history=cfg.agent.short_history,
            samples_per_view=cfg.label.samples_per_view,
            cost_temperature=cfg.label.cost_temperature,
            uninformative=cfg.label.uninformative,
            tie_break_temperature=cfg.label.tie_break_temperature,
            page_token_temperature=cfg.label.page_token_temperature,
        )
    buf = io.BytesIO()
    if len(dataset):
        pq.write_table(dataset.to_arrow(), buf)
    return buf.getvalue()


def run_mind2web_d1(cfg: Any, d1_dir: Path, log: Any = print, pool: list[Any] | None = None) -> Path:
    """The D1 reference Router from action-conditioned view-teacher records of the first
    ``label.games`` tasks of the training split (reusing finished stages under ``d1_dir``,
    whose key covers ``corpus`` and ``label``: the records depend on nothing else)."""

    from memprism_ray.actors.d1 import train_d1, uses_pool, write_labels
    from memprism_ray.envs.mind2web.data import list_games

    games = list_games("train", cfg.corpus.data_root)

    d1_dir.mkdir(parents=True, exist_ok=True)
    ckpt = d1_dir / "checkpoint"
    if (ckpt / "config.json").exists():
        log(f"D1: reusing {ckpt}")
        return ckpt
    labels = d1_dir / "labels.parquet"
    if not labels.exists():
        chosen = games[: cfg.label.games]
        workers = max(1, min(cfg.label.workers, len(chosen)))
        log(f"D1: {cfg.label.teacher} view-teacher records of {len(chosen)} Mind2Web training tasks ({workers} tasks)")
        handles, started = replicas_for(cfg, pool, uses_pool(cfg), log, "D1 labelling")
        try:
            parts = waits.get(
                [
                    mind2web_label_task.remote([g.to_dict() for g in chosen[i::workers]], cfg, handles, f"d1-{i}")
                    for i in range(workers)
                ],
                cfg.run.call_timeout_s * max(1, len(chosen[0::workers])),
                "D1 Mind2Web labelling tasks",
            )
        finally:
            stop_policy_replicas(started)
        write_labels(parts, labels, log, "check the task policy and the Mind2Web data")
    return train_d1(cfg, labels, ckpt, log)
