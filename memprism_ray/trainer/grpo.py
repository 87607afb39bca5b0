"""D2, grouped GRPO (paper "Adapter", outcome-guided optimisation; Table A.4 "GRPO";
docs/architecture.md "Distributed rollout"): start the actors, run the iterations, stop what
the evaluation does not need.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from tqdm import tqdm

from memprism_ray.actors import metrics, waits
from memprism_ray.actors.learner import Learner
from memprism_ray.actors.node_data import NodeData
from memprism_ray.actors.placement import (
    actor_name,
    learner_options,
    placement_summary,
    policy_replica_options,
    wait_placed,
)
from memprism_ray.actors.rollout import RolloutWorker
from memprism_ray.actors.workers import PhiWorker, ViewWorker, start_policy_replicas
from memprism_ray.benchmark import DataTree, get_benchmark
from memprism_ray.io_atomic import write_files
from memprism_ray.policy.factory import needs_view_text
from memprism_ray.trainer.placement_record import PlacementRecord
from memprism_ray.trainer.rollouts import IterationFailed, RolloutFleet, iteration_stats, run_groups, sample_groups
from memprism_ray.trainer.rollouts import say as grpo_say
from memprism_ray.trainer.run_dir import RunLogger, checkpoint_dir, checkpoint_iteration

if TYPE_CHECKING:
    from memprism_ray.config import ExperimentConfig


@dataclass
class TrainingActors:
    """What :func:`start_training_actors` started."""

    learner: Any
    fleet: RolloutFleet
    phi_pool: list[Any]
    view_pool: list[Any]
    replicas: list[Any]
    start_iteration: int


def start_training_actors(
    cfg: ExperimentConfig,
    reference: Path,
    resume_from: Path | None,
    resources: dict[str, Any],
    say: Any = print,
    data: NodeData | None = None,
    record: PlacementRecord | None = None,
) -> TrainingActors:
    """Learner, policy replicas, Phi and View pools and the rollout fleet (``rollout.num_workers``,
    or with ``auto`` one seat per group of an iteration); the Learner's checkpoints are shipped
    here, so a Learner on a node without the run directory finds them."""
    from memprism_ray.actors.node_data import ship

    requests = {
        "learner": learner_options(cfg),
        "replicas": {**policy_replica_options(cfg), "count": cfg.policy.num_replicas},
    }
    for line in placement_summary(requests, resources):
        say(line)
    data = data or NodeData()
    # The reference is only read for its weights (load_model): its optimizer state stays behind.
    from memprism_ray.adapter.checkpoint import CONFIG_FILE, WEIGHTS_FILE

    checkpoints = [DataTree(str(reference), "the D1 checkpoint", owned=True, files=(CONFIG_FILE, WEIGHTS_FILE))]
    if resume_from is not None:
        checkpoints.append(DataTree(str(resume_from), "the checkpoint GRPO resumes from", owned=True))
    learner_data = ship(checkpoints)
    learner_name = actor_name(cfg.run.name, "learner")
    learner = Learner.options(name=learner_name, **learner_options(cfg)).remote(
        cfg.grpo, str(reference), str(resume_from) if resume_from else "", cfg.rollout.learner_threads, learner_data
    )
    start = wait_placed([learner.iteration.remote()], "learner", learner_options(cfg), cfg.run.call_timeout_s * 4)[0]
    if record is not None:
        record.actor("learner", waits.get(learner.placed.remote(), cfg.run.call_timeout_s, "the learner's node"))
    if resume_from is not None:
        say(f"resumed from {resume_from} (iteration {checkpoint_iteration(resume_from)})")
    ro = cfg.rollout
    replicas = start_policy_replicas(cfg, data=data)
    # With phi.llm_source: pool the Phi prompts go to the same replicas as the decisions.
    phi_pool = [
        PhiWorker.options(
            name=actor_name(cfg.run.name, f"phi-worker-{i}"), num_cpus=ro.helper_cpus, max_restarts=ro.max_restarts
        ).remote(cfg.corpus.benchmark, cfg.phi, replicas, f"phi-{i}", cfg.run.call_timeout_s)
        for i in range(ro.phi_workers)
    ]
    view_pool = [
        ViewWorker.options(
            name=actor_name(cfg.run.name, f"view-worker-{i}"), num_cpus=ro.helper_cpus, max_restarts=ro.max_restarts
        ).remote(cfg.render, ro.view_cache_size)
        for i in range(ro.view_workers)
    ]
    if record is not None:
        for role, pool in (("policy-replica", replicas), ("phi-worker", phi_pool), ("view-worker", view_pool)):
            refs = [a.placed.remote() for a in pool]
            for place in waits.get(refs, cfg.run.call_timeout_s * 4, f"start of the {role}s"):
                record.actor(role, place)
    needs_text = needs_view_text(cfg.policy, get_benchmark(cfg.corpus.benchmark).task_contract())
    full_ref = learner.full_weights.remote()  # resolved by each rollout worker, not fetched here

    def make_rollout_worker(i: int, generation: int) -> object:
        # SPREAD: seats go to different nodes while they have room, so the environments' CPU
        # load is shared and a lost node takes as few groups with it as possible. Each seat
        # reserves its EnvWorkers' CPUs too (they run on its node: RolloutWorker._setup).
        return RolloutWorker.options(
            name=actor_name(cfg.run.name, f"rollout-worker-{i}"),
            num_cpus=ro.seat_cpus(),
            scheduling_strategy="SPREAD",
        ).remote(cfg, i, full_ref, phi_pool, view_pool, replicas, needs_text, cfg.run.name, generation, data)

    seats = cfg.grpo.groups_per_iteration if ro.elastic else ro.num_workers
    fleet = RolloutFleet.start(
        seats,
        make_rollout_worker,
        log=say,
        max_replacements=ro.max_restarts,
        ping_timeout_s=cfg.run.call_timeout_s * 4,
        elastic=ro.elastic,
        record=record,
    )
    where = f"{len(replicas)} policy replicas" if replicas else "the policy inside each rollout worker"
    nodes = len({(fleet.seats[i].place or {}).get("node_id") for i in fleet.ready()})
    size = f"{fleet.size()} of {seats} (rollout.num_workers auto)" if ro.elastic else str(fleet.size())
    say(f"{size} rollout workers on {nodes} node(s), {where} ({cfg.policy.backend})")
    return TrainingActors(learner, fleet, phi_pool, view_pool, replicas, int(start))


def run_grpo_iterations(
    cfg: ExperimentConfig,
    actors: TrainingActors,
    games: list[Any],
    logger: RunLogger,
    run_dir: Path,
    ck_extra: dict[str, Any],
) -> None:
    """Iterations ``actors.start_iteration`` .. ``grpo.iterations``: sample groups of ``games``,
    play them with the learner's current weights, update the learner from the groups' step
    tables (never through this driver), record metrics and checkpoint every
    ``run.checkpoint_every`` iterations and at the end."""
    learner = actors.learner
    replay = cfg.grpo.replayed_iterations
    if replay:
        grpo_say(
            f"iterations {cfg.grpo.iterations - replay + 1}-{cfg.grpo.iterations} replay the games of iterations "
            f"1-{replay} with fresh seeds (grpo.replay_first {cfg.grpo.replay_first})"
        )
    bar = tqdm(
        range(actors.start_iteration, cfg.grpo.iterations),
        initial=actors.start_iteration,
        total=cfg.grpo.iterations,
        desc="GRPO",
        file=sys.stdout,
    )
    seen_size = actors.fleet.size()
    for it in bar:
        t0 = time.perf_counter()
        version = it + 1
        weights_ref = learner.planner_weights.remote()
        rollout = run_groups(
            actors.fleet,
            sample_groups(games, cfg, it),
            weights_ref,
            version,
            cfg,
            tick=lambda done, n: bar.set_description(f"GRPO (groups {done}/{n})"),
            # While the fleet waits for a node, a lost Learner ends the job at once (RayActorError).
            watch=lambda: ray.get(learner.iteration.remote(), timeout=cfg.run.call_timeout_s),
        )
        t_rollout = time.perf_counter() - t0
        if not rollout.steps_refs:
            # Nothing played: when the Learner is gone (its node lost, say) the weights never came,
            # and that is the cause to report (RayActorError: the job's --resume line).
            ray.get(learner.iteration.remote(), timeout=cfg.run.call_timeout_s)
            raise IterationFailed(
                f"iteration {it + 1}: no group produced a decision ({rollout.failed_trajectories} failed "
                f"trajectories); first cause: {rollout.first_failure or 'unknown'}"
            )
        fleet_changes(actors.fleet, rollout, it + 1, seen_size)
        seen_size = rollout.fleet_size_end
        update = learner.update.remote(*rollout.steps_refs)
        stats = waits.get(update, cfg.run.call_timeout_s * 4, f"learner update of iteration {it + 1}")
        stats.update(iteration_stats(rollout))
        t_end = time.perf_counter()
        stats.update(
            iteration=it + 1,
            weights_version=version,
            iteration_seconds=t_end - t0,
            rollout_phase_seconds=t_rollout,
            update_phase_seconds=t_end - t0 - t_rollout,
        )
        metrics.record_iteration(cfg.run.name, stats)
        logger.log("grpo", it + 1, stats)
        bar.set_postfix(
            sr=f"{stats['success_rate']:.2f}",
            zero_std=f"{stats.get('zero_std_group_frac', float('nan')):.2f}",
            kl=f"{stats['kl']:.4f}",
            failed=stats["failed_trajectories"],
            replaced=stats["workers_replaced"],
            workers=stats["fleet_size"],
        )
        if (it + 1) % cfg.run.checkpoint_every == 0 or it + 1 == cfg.grpo.iterations:
            ck = waits.get(
                learner.checkpoint.remote(metrics=stats, extra=ck_extra), cfg.run.call_timeout_s, f"checkpoint {it + 1}"
            )
            write_files(ck["files"], checkpoint_dir(run_dir, it + 1))
            logger.log("checkpoint", it + 1, {"sha256": ck["sha256"]})


def fleet_changes(fleet: RolloutFleet, rollout: Any, iteration: int, before: int) -> None:
    """Say (and record in ``cluster.json``) how the fleet grew or shrank in an iteration."""
    start, end = rollout.fleet_size, rollout.fleet_size_end
    seats = len(fleet.seats)
    if start > before:
        grpo_say(f"iteration {iteration}: the fleet grew to {start} of {seats} rollout workers")
        if fleet.record is not None:
            fleet.record.event("grew", iteration=iteration, size=start, seats=seats)
    if end < start:
        lost = f", {rollout.workers_lost} lost with their node" if rollout.workers_lost else ""
        grpo_say(
            f"iteration {iteration}: the fleet shrank to {end} of {seats} rollout workers{lost}; every group was "
            "played (the lost ones re-run)"
        )
        if fleet.record is not None:
            fleet.record.event("shrank", iteration=iteration, size=end, seats=seats, lost=rollout.workers_lost)


def stop_training_actors(cfg: ExperimentConfig, actors: TrainingActors) -> dict[str, Any]:
    """The trained Router's full weights; the other actors are killed to free their CPUs for the
    evaluation, but the policy replicas stay up (one engine start, 60-75 s on an H100, saved)."""
    final = waits.get(actors.learner.full_weights.remote(), cfg.run.call_timeout_s, "final Router weights")
    actors.fleet.kill_all()
    for actor in [*actors.phi_pool, *actors.view_pool, actors.learner]:
        ray.kill(actor)
    return final


def training_plot(run_dir: Path, say: Any = print, label: str = "success", replay_first: int = 0) -> Path | None:
    """``eval/training_success.png``: success rate (and zero-std group fraction) per GRPO
    iteration from ``metrics.jsonl``; prints the first-5 vs last-5 iteration means, or first-N
    vs last-N on the same tasks when the run replayed N (``grpo.replay_first``)."""
    import json

    from memprism_ray.eval.report import plot_training_success, replayed_span

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    its = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "grpo"]
    if not its:
        return None
    sr = [float(r["success_rate"]) for r in sorted(its, key=lambda r: int(r["step"]))]
    span = replayed_span(replay_first, len(sr))
    k = span or (min(5, len(sr) // 2) or 1)
    tasks = ", on the same tasks (grpo.replay_first)" if span else ""
    say(f"training {label}: first {k} iterations {sum(sr[:k]) / k:.3f}, last {k} {sum(sr[-k:]) / k:.3f}{tasks}")
    (run_dir / "eval").mkdir(parents=True, exist_ok=True)
    return plot_training_success(its, run_dir / "eval" / "training_success.png", replay_first)


def final_eval_dir(run_dir: Path, cfg: ExperimentConfig, say: Any = print, label: str = "success") -> Path | None:
    """``run_dir/eval`` for the final evaluation, with the training plot written first; ``None``
    when a finished run already holds its evaluation (reports are never replaced)."""
    from memprism_ray.eval.report import check_fresh_output

    eval_dir = run_dir / "eval"
    try:
        check_fresh_output(eval_dir)
    except FileExistsError as exc:
        say(f"{exc}: the final evaluation of this run exists and is not repeated")
        return None
    if not (eval_dir / "training_success.png").exists():
        plot = training_plot(run_dir, say, label, cfg.grpo.replayed_iterations)
        if plot is not None:
            say(f"training success per iteration: {plot}")
    return eval_dir
