"""Grouped GRPO for the MemPrism Router on Mind2Web under teacher-forced replay (paper
"Adapter", outcome-guided optimisation; appendix "Training dataset setup"; Table A.4 "D1,
Mind2Web" and "GRPO, Mind2Web"; docs/mind2web.md).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_mind2web.py --config configs/mind2web_paper.yaml
    python jobs/grpo_mind2web.py --config configs/mind2web_smoke.yaml      # CPU, the fixture

Without ``init_checkpoint`` the job first builds the D1 reference policy from
action-conditioned view-teacher records of the training split: each human trajectory is
replayed and recorded with the rule Phi, and every decision state, with the human next
action as the reference, is labelled by the view teacher (the LLM teacher with the
Mind2Web view-teacher prompt on GPU; the counterfactual teacher on the scripted stand-in
on CPU). One GRPO iteration samples ``grpo.groups_per_iteration`` training tasks; each
RolloutWorker replays one task ``grpo.group_size`` times with Router views sampled at
``grpo.rollout_temperature`` within the ``grpo.top_p`` nucleus (0.85); a trajectory's return
is its decisions' reward 1[action correct] averaged (``grpo.reward: action_correct``); the
Learner updates the planner and head with group-normalised advantages. It ends with the
Mind2Web evaluation of ``eval.conditions`` on ``mind2web.eval_splits`` (step action accuracy
and exact episode success per split, paired against the first condition).
"""

from __future__ import annotations

import sys
from pathlib import Path

from memprism_ray.actors.d1 import d1_cost_line
from memprism_ray.actors.mind2web import evaluate_mind2web, run_mind2web_d1
from memprism_ray.actors.placement import init_ray
from memprism_ray.actors.training import (
    final_eval_dir,
    run_grpo_iterations,
    start_training_actors,
    stop_training_actors,
)
from memprism_ray.actors.workers import stop_policy_replicas
from memprism_ray.pipeline.jobs import parse_job_args
from memprism_ray.pipeline.mind2web import check_benchmark, resolve_corpus
from memprism_ray.pipeline.mind2web import train_games as mind2web_train_games
from memprism_ray.pipeline.run_dir import (
    RunDirError,
    RunLogger,
    checkpoint_dir,
    checkpoint_extra,
    checkpoint_iteration,
    d1_dir,
    prepare_run_dir,
)


def say(msg: str) -> None:
    print(f"[grpo] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    _, cfg = parse_job_args(__doc__.split("\n\n")[0], argv, job="grpo_mind2web")
    try:  # before the run directory or Ray: a wrong benchmark or a missing data path is one line
        check_benchmark(cfg)
        resolve_corpus(cfg, lambda _: None)
    except ValueError as exc:
        print(f"[grpo] error: {exc}", file=sys.stderr, flush=True)
        return 2
    run_dir = cfg.run.dir
    try:
        resume_from = prepare_run_dir(run_dir, cfg.run.resume, cfg)
    except RunDirError as exc:
        print(f"[grpo] error: {exc}", file=sys.stderr, flush=True)
        return 2
    ck_extra = checkpoint_extra(cfg)  # the config as given (before the corpus path is resolved)
    resources = init_ray(cfg.run.ray_address, cfg.run.num_cpus)
    say(f"run directory {run_dir}; cluster {dict(resources)}")
    resumed_at = checkpoint_iteration(resume_from) if resume_from is not None else 0
    logger = RunLogger(run_dir, cfg.run.tensorboard, resume_step=resumed_at if cfg.run.resume else None)

    # 1. Tasks: the official release (or the generated fixture for smoke runs).
    cfg = resolve_corpus(cfg, say)
    train_games = mind2web_train_games(cfg)
    say(f"{len(train_games)} training tasks")

    # 2. The D1 reference policy (also GRPO's starting point): action-conditioned
    # view-teacher records of human trajectories of the training split.
    if not cfg.init_checkpoint:
        say(d1_cost_line(cfg).replace("expert trajectories of", "human trajectories of").replace(" games;", " tasks;"))
    reference = Path(cfg.init_checkpoint) if cfg.init_checkpoint else run_mind2web_d1(cfg, d1_dir(run_dir, cfg), say)

    # 3. Actors: learner, policy replicas, Phi/View pools, rollout workers.
    actors = start_training_actors(cfg, reference, resume_from, resources, say)

    # 4. GRPO iterations: offline-replay groups, return = mean 1[action correct] (grpo.reward).
    run_grpo_iterations(cfg, actors, train_games, logger, run_dir, ck_extra)

    # 5. Final evaluation: every condition of cfg.eval.conditions on the same episodes, one
    # table against the trained Router (greedy), and training success per iteration.
    final = stop_training_actors(cfg, actors)
    replicas = actors.replicas
    eval_dir = final_eval_dir(run_dir, cfg, say, "exact success")
    if cfg.eval.enabled and eval_dir is not None:
        latest = checkpoint_dir(run_dir, cfg.grpo.iterations)
        # The replicas stay up for the evaluation: one engine start (60-75 s on an H100) saved.
        summary = evaluate_mind2web(
            cfg, cfg.eval.conditions, final, str(latest), eval_dir, log=say, pool=replicas or None
        )
        for condition, m in summary["metrics"].items():
            o = m["overall"]
            logger.log(
                "eval",
                cfg.grpo.iterations,
                {
                    "condition": condition,
                    "step_accuracy": o["step_accuracy"]["rate"],
                    "episode_success": o["episode_success"]["rate"],
                },
            )
        print((eval_dir / "mind2web.md").read_text())
        if summary.get("failed_episodes"):
            say(f"warning: {summary['failed_episodes']} evaluation episode(s) failed; see {eval_dir}")
    stop_policy_replicas(replicas)
    logger.close()
    say(f"done: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
