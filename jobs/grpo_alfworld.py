"""Grouped GRPO for the MemPrism Router on ALFWorld (paper "Adapter", outcome-guided
optimisation; Table A.4 "GRPO, ALFWorld"; DESIGN.md "Distributed rollout").

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_alfworld.py --config configs/local.yaml
    python jobs/grpo_alfworld.py --config configs/local.yaml          # starts a local Ray
    python jobs/grpo_alfworld.py --config configs/local.yaml --resume auto

One iteration: sample ``grpo.groups_per_iteration`` task ids; each RolloutWorker plays one
group of ``grpo.group_size`` trajectories of its task step-synchronously with the current
Router weights (sent as one object ref per iteration); the Learner computes trajectory-
level group advantages and updates the planner and head; metrics go to the dashboard,
JSONL and TensorBoard; a checkpoint is written every ``run.checkpoint_every`` iterations.
Without ``init_checkpoint`` the job first builds the D1 reference policy (expert
trajectories -> counterfactual view labels -> supervised Router). It ends with an
evaluation of the trained Router against Frequency-Matched Random.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import ray
from tqdm import tqdm

from memprism_ray.actors import metrics
from memprism_ray.actors.d1 import run_d1
from memprism_ray.actors.evaluation import evaluate_distributed
from memprism_ray.actors.learner import Learner
from memprism_ray.actors.placement import gpu_request, init_ray
from memprism_ray.actors.rollout import GroupSpec, RolloutWorker, TrajectoryGroup
from memprism_ray.actors.workers import PhiWorker, PolicyReplica, ViewWorker
from memprism_ray.envs.alfworld import list_games
from memprism_ray.pipeline.jobs import parse_job_args, resolve_corpus
from memprism_ray.pipeline.run_dir import (
    RunLogger,
    checkpoint_dir,
    checkpoint_iteration,
    prepare_run_dir,
    write_files,
)


def say(msg: str) -> None:
    print(f"[grpo] {msg}", flush=True)


def sample_groups(games: list, cfg, iteration: int) -> list[GroupSpec]:
    """Explicit task ids for one iteration, a function of (seed, iteration) only, so a resumed
    run samples exactly what an uninterrupted one would."""
    rng = random.Random(f"{cfg.run.seed}:{iteration}")
    chosen = rng.sample(games, k=min(cfg.grpo.groups_per_iteration, len(games)))
    return [
        GroupSpec(
            group_id=f"it{iteration:04d}-g{k}",
            game=g.to_dict(),
            episode_ids=tuple(f"it{iteration:04d}-g{k}-t{i:02d}" for i in range(cfg.grpo.group_size)),
            seed=rng.randrange(2**31),
            iteration=iteration,
        )
        for k, g in enumerate(chosen)
    ]


def run_groups(workers: list, specs: list[GroupSpec], weights_ref, version: int, cfg) -> tuple[list, int]:
    """Dispatch groups to idle rollout workers. A group with failed trajectories (an actor
    died, a call timed out) is re-run once when ``rollout.rerun_failed``; otherwise its
    failed trajectories stay marked and the learner leaves them out. Returns the groups and
    the number of trajectories that failed along the way (re-run or not)."""
    failed_seen = 0
    pending = list(specs)
    done: list[TrajectoryGroup] = []
    attempts = {s.group_id: 0 for s in specs}
    in_flight: dict = {}
    idle = list(range(len(workers)))
    while pending or in_flight:
        while pending and idle:
            w = idle.pop(0)
            spec = pending.pop(0)
            attempts[spec.group_id] += 1
            ref = workers[w].run_group.remote(spec, weights_ref, version)
            in_flight[ref] = (w, spec, time.monotonic())
        ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=5.0)
        for ref in ready:
            w, spec, _ = in_flight.pop(ref)
            idle.append(w)
            try:
                group = ray.get(ref, timeout=cfg.run.call_timeout_s)
            except Exception as exc:  # the rollout worker itself died
                group = _failed_group(spec, version, f"{type(exc).__name__}: {exc}")
            failed_seen += group.failed
            if group.failed and cfg.rollout.rerun_failed and attempts[spec.group_id] < 2:
                say(f"group {spec.group_id}: {group.failed} trajectories failed; re-running it once")
                pending.append(spec)
                continue
            done.append(group)
        now = time.monotonic()
        for ref, (w, spec, started) in list(in_flight.items()):
            if now - started > cfg.rollout.group_timeout_s:
                ray.cancel(ref, force=True)
                in_flight.pop(ref)
                idle.append(w)
                done.append(_failed_group(spec, version, f"timeout after {cfg.rollout.group_timeout_s:.0f}s"))
                failed_seen += len(spec.episode_ids)
    order = {s.group_id: i for i, s in enumerate(specs)}
    return sorted(done, key=lambda g: order[g.group_id]), failed_seen


def _failed_group(spec: GroupSpec, version: int, error: str) -> TrajectoryGroup:
    import pyarrow as pa

    episodes = [
        {
            "episode_id": e,
            "group_id": spec.group_id,
            "won": False,
            "reward": 0.0,
            "steps": 0,
            "status": "failed",
            "error": error,
            "game_id": spec.game["game_id"],
            "task_type": spec.game["task_type"],
        }
        for e in spec.episode_ids
    ]
    return TrajectoryGroup(spec.group_id, spec.game["game_id"], version, pa.table({}), episodes)


def iteration_stats(groups: list[TrajectoryGroup], failed_seen: int) -> dict:
    eps = [e for g in groups for e in g.episodes]
    live = [e for e in eps if e["status"] != "failed"]
    return {
        "trajectories": len(eps),
        "failed_trajectories": failed_seen,
        "failed_excluded": len(eps) - len(live),
        "success_rate": sum(e["won"] for e in live) / len(live) if live else 0.0,
        "mean_episode_length": sum(e["steps"] for e in live) / len(live) if live else 0.0,
        "rollout_seconds_max": max((g.seconds for g in groups), default=0.0),
    }


def main(argv: list[str] | None = None) -> int:
    _, cfg = parse_job_args(__doc__.split("\n\n")[0], argv)
    run_dir = cfg.run.dir
    resume_from = prepare_run_dir(run_dir, cfg.run.resume, cfg)
    resources = init_ray(cfg.run.ray_address, cfg.run.num_cpus)
    say(f"run directory {run_dir}; cluster {dict(resources)}")
    logger = RunLogger(run_dir, cfg.run.tensorboard)

    # 1. Games: an ALFWorld tree, or the embedded corpus generated from alfworld's layouts.
    cfg = resolve_corpus(cfg, say)
    train_games = list_games(cfg.corpus.train_split, cfg.corpus.data_root)
    say(f"{len(train_games)} training games")

    # 2. The D1 reference policy (also GRPO's starting point).
    reference = Path(cfg.init_checkpoint) if cfg.init_checkpoint else run_d1(cfg, train_games, run_dir / "d1", say)

    # 3. Actors: learner, stage pools, policy replicas, rollout workers.
    learner_gpus = gpu_request(1.0 if cfg.grpo.device in ("auto", "cuda") else 0.0)
    learner = Learner.options(num_gpus=learner_gpus, num_cpus=0 if learner_gpus else cfg.rollout.rollout_cpus).remote(
        cfg.grpo, str(reference), str(resume_from) if resume_from else ""
    )
    start = ray.get(learner.iteration.remote(), timeout=cfg.run.call_timeout_s)
    if resume_from is not None:
        say(f"resumed from {resume_from} (iteration {checkpoint_iteration(resume_from)})")
    ro = cfg.rollout
    phi_pool = [
        PhiWorker.options(num_cpus=ro.helper_cpus, max_restarts=ro.max_restarts).remote() for _ in range(ro.phi_workers)
    ]
    view_pool = [
        ViewWorker.options(num_cpus=ro.helper_cpus, max_restarts=ro.max_restarts).remote(cfg.render, ro.view_cache_size)
        for _ in range(ro.view_workers)
    ]
    policy_gpus = gpu_request(cfg.policy.gpus_per_replica)
    replicas = [
        PolicyReplica.options(
            num_gpus=policy_gpus, num_cpus=ro.policy_cpus if not policy_gpus else 1, max_restarts=ro.max_restarts
        ).remote(cfg.policy)
        for _ in range(cfg.policy.num_replicas)
    ]
    needs_text = ray.get(replicas[0].needs_view_text.remote(), timeout=cfg.run.call_timeout_s * 4)
    full_state = ray.get(learner.full_weights.remote(), timeout=cfg.run.call_timeout_s)
    full_ref = ray.put(full_state)
    rollout_workers = [
        RolloutWorker.options(num_cpus=ro.rollout_cpus, max_restarts=ro.max_restarts).remote(
            cfg, i, full_ref, phi_pool, view_pool, replicas, needs_text, cfg.run.name
        )
        for i in range(ro.num_workers)
    ]
    ray.get([w.ping.remote() for w in rollout_workers], timeout=cfg.run.call_timeout_s * 4)
    say(f"{len(rollout_workers)} rollout workers, {len(replicas)} policy replicas ({cfg.policy.backend})")

    # 4. GRPO iterations.
    bar = tqdm(
        range(start, cfg.grpo.iterations), initial=start, total=cfg.grpo.iterations, desc="GRPO", file=sys.stdout
    )
    for it in bar:
        t0 = time.perf_counter()
        version = it + 1
        weights_ref = ray.put(ray.get(learner.planner_weights.remote(), timeout=cfg.run.call_timeout_s))
        groups, failed_seen = run_groups(
            rollout_workers, sample_groups(train_games, cfg, it), weights_ref, version, cfg
        )
        stats = ray.get(learner.update.remote(groups), timeout=cfg.run.call_timeout_s * 4)
        stats.update(iteration_stats(groups, failed_seen))
        stats.update({"iteration": it + 1, "weights_version": version, "iteration_seconds": time.perf_counter() - t0})
        metrics.record_iteration(cfg.run.name, stats)
        logger.log("grpo", it + 1, stats)
        bar.set_postfix(sr=f"{stats['success_rate']:.2f}", kl=f"{stats['kl']:.4f}", failed=stats["failed_trajectories"])
        if (it + 1) % cfg.run.checkpoint_every == 0 or it + 1 == cfg.grpo.iterations:
            ck = ray.get(learner.checkpoint.remote(metrics=stats), timeout=cfg.run.call_timeout_s)
            write_files(ck["files"], checkpoint_dir(run_dir, it + 1))
            logger.log("checkpoint", it + 1, {"sha256": ck["sha256"]})

    # 5. Final evaluation: the trained Router (greedy) vs Frequency-Matched Random.
    final = ray.get(learner.full_weights.remote(), timeout=cfg.run.call_timeout_s)
    for actor in rollout_workers + phi_pool + view_pool + replicas + [learner]:
        ray.kill(actor)  # free their CPUs for the evaluation actors
    if cfg.eval.enabled:
        latest = checkpoint_dir(run_dir, cfg.grpo.iterations)
        summary = evaluate_distributed(cfg, cfg.eval.conditions, final, str(latest), run_dir / "eval", log=say)
        for rep in summary["conditions"]:
            logger.log("eval", cfg.grpo.iterations, {"condition": rep["condition"], "sr": rep["sr"]})
        print((run_dir / "eval" / "summary.md").read_text())
    logger.close()
    say(f"done: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
