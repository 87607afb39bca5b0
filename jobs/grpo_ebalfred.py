"""Grouped GRPO for the MemPrism Router on EB-ALFRED (paper "Adapter"; Table A.4 "D1,
ALFRED path" and "GRPO, ALFRED path": 30 steps, reward success + 0.2 x goal-condition
progress, no entropy bonus):

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_ebalfred.py --config configs/ebalfred_paper.yaml
    python jobs/grpo_ebalfred.py --config configs/ebalfred_smoke.yaml --init_checkpoint CKPT   # CPU

The same actors as jobs/grpo_alfworld.py (Learner, RolloutWorker fleet with EnvWorkers
built from corpus.benchmark: ebalfred, Phi/View pools, policy replicas); what differs is
read top to bottom here: the EB-ALFRED world (fixture or AI2-THOR through EmbodiedBench)
is prepared first, GRPO groups are EB-ALFRED training episodes (``ebalfred.train_subsets``
of ``ebalfred.train_splits``), each trajectory's return is the env's summed reward
(success + grpo.progress_reward_coef x progress), and the final evaluation reports SR per
subset and the average.
Without ``init_checkpoint`` D1 runs first on the ALFRED path: the expert plans of the
training episodes (their ALFRED annotations, ``$MEMPRISM_ALFRED_DATA``; or the fixture's
recorded plans) are played through the env, labelled by the LLM view teacher
(``label.teacher: llm``, on the policy pool or an endpoint) and the Router is trained on them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ray

from memprism_ray.actors import waits
from memprism_ray.actors.d1 import label_expert, train_d1
from memprism_ray.actors.ebalfred import evaluate_ebalfred, prepare_ebalfred, train_games
from memprism_ray.actors.placement import init_ray
from memprism_ray.actors.training import (
    final_eval_dir,
    run_grpo_iterations,
    start_training_actors,
    stop_training_actors,
)
from memprism_ray.actors.workers import stop_policy_replicas
from memprism_ray.pipeline.jobs import parse_job_args
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
    print(f"[grpo-ebalfred] {msg}", flush=True)


@ray.remote(num_cpus=1, max_retries=1)
def expert_task(cfg, games: list[dict[str, str]]) -> bytes:
    """Play the expert plans of ``games`` through one EB-ALFRED env; the Parquet bytes."""
    import tempfile

    from memprism_ray.envs.base import GameRef
    from memprism_ray.envs.ebalfred.expert import annotation_plans, fixture_plans, play_expert, write_expert_table
    from memprism_ray.envs.registry import env_options, make_env

    refs = [GameRef.from_dict(g) for g in games]
    env = make_env("ebalfred", 1, env_options(cfg))
    try:
        if cfg.ebalfred.controller == "fake":
            plans = fixture_plans(env.config.fixture)
        else:
            plans = annotation_plans(refs[0].path, refs)
        episodes = play_expert(env, refs, plans, max_steps=cfg.agent.max_steps)
    finally:
        env.close()
    with tempfile.TemporaryDirectory() as tmp:
        return write_expert_table(episodes, Path(tmp) / "expert.parquet").read_bytes()


def run_d1_alfred_path(cfg, games: list, d1: Path) -> Path:
    """D1 on the ALFRED path (Table A.4 "D1, ALFRED path"): expert plans -> LLM view labels -> Router."""
    d1.mkdir(parents=True, exist_ok=True)
    ckpt = d1 / "checkpoint"
    if (ckpt / "config.json").exists():
        say(f"D1: reusing {ckpt}")
        return ckpt
    expert = d1 / "expert_trajectories.parquet"
    if not expert.exists():
        chosen = games[: cfg.label.games]
        say(f"D1: expert plans of {len(chosen)} training episodes")
        blob = waits.get(
            expert_task.remote(cfg, [g.to_dict() for g in chosen]), cfg.run.call_timeout_s * 4, "D1 expert"
        )
        expert.write_bytes(blob)
    labels = label_expert(cfg, expert, d1, say)
    return train_d1(cfg, labels, ckpt, say)


def main(argv: list[str] | None = None) -> int:
    _, cfg = parse_job_args(__doc__.split("\n\n")[0], argv, job="grpo_ebalfred")
    run_dir = cfg.run.dir
    try:
        resume_from = prepare_run_dir(run_dir, cfg.run.resume, cfg)
    except RunDirError as exc:
        print(f"[grpo-ebalfred] error: {exc}", file=sys.stderr, flush=True)
        return 2
    ck_extra = checkpoint_extra(cfg)

    # 1. The EB-ALFRED world: the fixture (built on first use) or the simulator. The env
    # settings reach the actors with their constructors (envs/registry.py env_options).
    env = prepare_ebalfred(cfg, say)
    if env:
        say("the fixture stand-in reads: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    resources = init_ray(cfg.run.ray_address, cfg.run.num_cpus)
    say(f"run directory {run_dir}; cluster {dict(resources)}")
    resumed_at = checkpoint_iteration(resume_from) if resume_from is not None else 0
    logger = RunLogger(run_dir, cfg.run.tensorboard, resume_step=resumed_at if cfg.run.resume else None)
    games = train_games(cfg)
    say(f"{len(games)} training episodes ({', '.join(cfg.ebalfred.train_subsets)})")

    # 2. The D1 reference policy (also GRPO's starting point).
    reference = (
        Path(cfg.init_checkpoint) if cfg.init_checkpoint else run_d1_alfred_path(cfg, games, d1_dir(run_dir, cfg))
    )

    # 3. Actors: learner, policy replicas, Phi/View pools, rollout workers.
    actors = start_training_actors(cfg, reference, resume_from, resources, say)

    # 4. GRPO iterations: trajectory return = success + coef x progress (the env's summed reward).
    run_grpo_iterations(cfg, actors, games, logger, run_dir, ck_extra)

    # 5. Final evaluation: SR per subset and the average, every condition on the same episodes.
    final = stop_training_actors(cfg, actors)
    replicas = actors.replicas
    eval_dir = final_eval_dir(run_dir, cfg, say)
    if cfg.eval.enabled and eval_dir is not None:
        latest = checkpoint_dir(run_dir, cfg.grpo.iterations)
        summary = evaluate_ebalfred(
            cfg, cfg.eval.conditions, final, str(latest), eval_dir, log=say, pool=replicas or None
        )
        for condition, table in summary["conditions"].items():
            logger.log("eval", cfg.grpo.iterations, {"condition": condition, "sr": table["average_sr"]})
        print((eval_dir / "summary.md").read_text())
        if summary["failed_episodes"]:
            say(f"warning: {summary['failed_episodes']} evaluation episode(s) failed; see {eval_dir}")
    stop_policy_replicas(replicas)
    logger.close()
    say(f"done: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
