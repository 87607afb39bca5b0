"""Grouped GRPO for the MemPrism Router on ALFWorld (paper "Adapter", outcome-guided
optimisation; Table A.4 "GRPO, ALFWorld"; docs/architecture.md "Distributed rollout").

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_alfworld.py --config configs/local.yaml
    python jobs/grpo_alfworld.py --config configs/local.yaml          # starts a local Ray
    python jobs/grpo_alfworld.py --config configs/local.yaml --resume auto

One iteration: sample ``grpo.groups_per_iteration`` task ids; each RolloutWorker plays one
group of ``grpo.group_size`` trajectories of its task step-synchronously with the current
Router weights (the learner's object ref, resolved by the workers: the weights do not pass
through this driver); the Learner receives the groups' step tables as object refs straight
from the rollout workers, computes trajectory-level group advantages and updates the planner
and head; a hung or dead rollout worker is killed and replaced and its group re-run once
(counted in the iteration's metrics); metrics go to the dashboard, JSONL and TensorBoard;
a checkpoint is written every ``run.checkpoint_every`` iterations.
Without ``init_checkpoint`` the job first builds the D1 reference policy (expert
trajectories -> counterfactual view labels -> supervised Router). It ends with an
evaluation of ``eval.conditions`` (in the local preset: the trained Router, Frequency-Matched
Random, No Memory, Full History, Recent-4 and the four fixed views) on the same episodes,
printed as one table against the Router, and a plot of training success per iteration.
"""

from __future__ import annotations

import sys
from pathlib import Path

from memprism_ray.actors.d1 import d1_cost_line, run_d1
from memprism_ray.actors.evaluation import evaluate_distributed
from memprism_ray.actors.placement import init_ray
from memprism_ray.actors.training import (
    final_eval_dir,
    run_grpo_iterations,
    start_training_actors,
    stop_training_actors,
)
from memprism_ray.actors.workers import stop_policy_replicas
from memprism_ray.envs.alfworld import list_games
from memprism_ray.pipeline.jobs import parse_job_args, resolve_corpus
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
    _, cfg = parse_job_args(__doc__.split("\n\n")[0], argv, job="grpo_alfworld")
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

    # 1. Games: an ALFWorld tree, or the embedded corpus generated from alfworld's layouts.
    cfg = resolve_corpus(cfg, say)
    train_games = list_games(cfg.corpus.train_split, cfg.corpus.data_root)
    say(f"{len(train_games)} training games")

    # 2. The D1 reference policy (also GRPO's starting point).
    if not cfg.init_checkpoint:
        say(d1_cost_line(cfg))
    reference = (
        Path(cfg.init_checkpoint) if cfg.init_checkpoint else run_d1(cfg, train_games, d1_dir(run_dir, cfg), say)
    )

    # 3. Actors: learner, policy replicas, Phi/View pools, rollout workers.
    actors = start_training_actors(cfg, reference, resume_from, resources, say)

    # 4. GRPO iterations.
    run_grpo_iterations(cfg, actors, train_games, logger, run_dir, ck_extra)

    # 5. Final evaluation: every condition of cfg.eval.conditions on the same episodes, one
    # table against the trained Router (greedy), and training success per iteration.
    final = stop_training_actors(cfg, actors)
    replicas = actors.replicas
    eval_dir = final_eval_dir(run_dir, cfg, say)
    if cfg.eval.enabled and eval_dir is not None:
        latest = checkpoint_dir(run_dir, cfg.grpo.iterations)
        # The replicas stay up for the evaluation: one engine start (60-75 s on an H100) saved.
        summary = evaluate_distributed(
            cfg, cfg.eval.conditions, final, str(latest), eval_dir, log=say, pool=replicas or None
        )
        for rep in summary["conditions"]:
            logger.log("eval", cfg.grpo.iterations, {"condition": rep["condition"], "sr": rep["sr"]})
        table = eval_dir / "final_table.md"
        print((table if table.exists() else eval_dir / "summary.md").read_text())
        if summary.get("failed_episodes"):
            say(f"warning: {summary['failed_episodes']} evaluation episode(s) failed; see {eval_dir}")
    stop_policy_replicas(replicas)
    logger.close()
    say(f"done: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
