"""D2, grouped GRPO (paper "Adapter", outcome-guided optimisation; Table A.4 "GRPO";
docs/architecture.md "Distributed rollout"): start the actors, run the iterations, stop what
the evaluation does not need.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import ObjectLostError, RayActorError

from memprism_ray.actors import metrics
from memprism_ray.actors.learner import Learner, state_to_numpy
from memprism_ray.actors.rollout import RolloutWorker
from memprism_ray.actors.workers import PhiWorker, ViewWorker, start_policy_replicas
from memprism_ray.benchmark import Benchmark, DataTree
from memprism_ray.cluster import waits
from memprism_ray.cluster.fleet import RolloutFleet
from memprism_ray.cluster.fleet import say as say_grpo
from memprism_ray.cluster.node_data import NodeData
from memprism_ray.cluster.placement import (
    actor_name,
    learner_options,
    placement_summary,
    policy_replica_options,
    wait_placed,
)
from memprism_ray.cluster.placement_record import PlacementRecord, node_alive
from memprism_ray.config import joins_cluster
from memprism_ray.io_atomic import write_files
from memprism_ray.policy.factory import needs_view_text
from memprism_ray.progress import progress_bar
from memprism_ray.recorder.phi.llm import fallbacks_said
from memprism_ray.trainer.rollouts import IterationFailed, RolloutResult, iteration_stats, run_groups, sample_groups
from memprism_ray.trainer.run_dir import RunLogger, checkpoint_dir, checkpoint_iteration, find_valid_checkpoint

if TYPE_CHECKING:
    from memprism_ray.config import ExperimentConfig


class LearnerLost(RuntimeError):
    """The Learner's actor or its node died; the Ray error is ``__cause__``."""


class StepsLost(RuntimeError):
    """A played group's step table was lost with its node before the Learner read it: the
    update did not run, so the iteration is played again (same tasks and seeds: same result)."""


#: Times one iteration is played again for step tables lost with their node, before it fails.
STEPS_LOST_REPLAYS = 3


@dataclass
class LearnerSeat:
    """The run's Learner and how to start it again (``run.learner_restarts``; issue 40): a lost
    Learner is started on any node from the last checkpoint that verifies, and the iterations
    since are replayed, which reaches the weights of an undisturbed run (task draws and
    trajectory seeds are functions of the iteration; the update is resumed with its state)."""

    cfg: ExperimentConfig
    reference: Path
    say: Any = print
    record: PlacementRecord | None = None
    actor: Any = None
    name: str = ""
    node_id: str = ""
    restarts: int = 0
    replayed: int = 0
    """iterations played again after restarts, in all"""

    def launch(self, resume_from: Path | None) -> None:
        """Create the Learner's actor (from ``resume_from``, else from the reference) without
        waiting for it: :meth:`start_first` waits. Its checkpoints are shipped, so a Learner on
        a node without the run directory finds them."""
        from memprism_ray.adapter.checkpoint import CONFIG_FILE, WEIGHTS_FILE
        from memprism_ray.cluster.node_data import ship

        cfg = self.cfg
        # The reference is only read for its weights (load_model): its optimizer state stays behind.
        trees = [DataTree(str(self.reference), "the D1 checkpoint", owned=True, files=(CONFIG_FILE, WEIGHTS_FILE))]
        if resume_from is not None:
            trees.append(DataTree(str(resume_from), "the checkpoint GRPO resumes from", owned=True))
        self.name = actor_name(cfg.run.name, "learner")
        self.actor = Learner.options(name=self.name, **learner_options(cfg)).remote(
            cfg.grpo,
            str(self.reference),
            str(resume_from) if resume_from else "",
            cfg.rollout.learner_threads,
            ship(trees),
        )

    def start(self, resume_from: Path | None) -> int:
        """Start the Learner (:meth:`launch`, unless it was launched already) and wait until it
        is up; the iterations it has done."""
        cfg = self.cfg
        if self.actor is None:
            self.launch(resume_from)
        done = wait_placed([self.actor.iteration.remote()], "learner", learner_options(cfg), cfg.run.call_timeout_s * 4)
        place = waits.get(self.actor.placed.remote(), cfg.run.call_timeout_s, "the learner's node")
        self.node_id = place["node_id"]
        if self.record is not None:
            self.record.actor("learner", place)
        return int(done[0])

    def start_first(self, resume_from: Path | None) -> int:
        """:meth:`start`, again (within ``run.learner_restarts``) when the Learner or its node is
        lost while it starts (the first start, or a restart's: a node may die while the next one
        loads, as when two nodes go at once): nothing trained since, nothing to replay."""
        while True:
            try:
                return self.start(resume_from)
            except RayActorError as exc:
                if exc.actor_init_failed or self.restarts >= self.cfg.run.learner_restarts:
                    raise
                self.restarts += 1
                self.actor = None  # the next try launches a new one
                say_grpo(
                    f"the Learner was lost while it started ({type(exc).__name__}); restart {self.restarts} of "
                    f"{self.cfg.run.learner_restarts}"
                )
                if self.record is not None:
                    self.record.gone(self.name, f"lost while it started: {type(exc).__name__}")
                    self.record.event("learner_restarted", iteration=0, restarts=self.restarts, replayed=0)

    def call(self, ref: Any, timeout_s: float, what: str) -> Any:
        """``waits.get`` of a Learner call; its death raised as :class:`LearnerLost`. The wait
        looks at the Learner's node every few seconds: a result made just before the node was
        lost (a checkpoint's files) went with it, and fetching it waited out the whole timeout
        (bench_chaos: "checkpoint 1: no result within 120s")."""
        deadline = time.monotonic() + timeout_s
        while not ray.wait([ref], timeout=min(5.0, max(0.0, deadline - time.monotonic())))[0]:
            if not node_alive(self.node_id):
                raise LearnerLost(f"{what}: the Learner's node is gone")
            if time.monotonic() >= deadline:
                break
        try:
            return waits.get(ref, max(1.0, deadline - time.monotonic()), what)
        except RayActorError as exc:
            raise LearnerLost(f"{what}: {type(exc).__name__}") from exc
        except ObjectLostError as exc:
            if not node_alive(self.node_id):  # the result went with the Learner's node
                raise LearnerLost(f"{what}: {type(exc).__name__}") from exc
            raise

    def check(self) -> None:
        """Raise :class:`LearnerLost` when the Learner no longer answers (a cheap call: it runs
        after every call sent before it, so it also says those finished)."""
        self.call(self.actor.iteration.remote(), self.cfg.run.call_timeout_s, "the Learner")

    def restart(self, lost: LearnerLost, done: int, run_dir: Path, logger: RunLogger) -> int:
        """A new Learner from the last checkpoint that verifies (or from the reference when there
        is none yet) after ``done`` iterations were logged; the iteration to continue from.
        Past ``run.learner_restarts`` the Ray error is raised again (the job's --resume line)."""
        cause = lost.__cause__ or lost
        if getattr(cause, "actor_init_failed", False) or self.restarts >= self.cfg.run.learner_restarts:
            raise cause
        self.restarts += 1
        with contextlib.suppress(Exception):  # an unavailable but live Learner must not update again
            ray.kill(self.actor)
        if self.record is not None:
            self.record.gone(self.name, f"lost: {lost}")
        checkpoint, corrupt = find_valid_checkpoint(run_dir)
        for path, error in corrupt:
            self.say(f"checkpoint {path.name} does not verify ({error}); not used")
        self.actor = None
        start = self.start_first(checkpoint)
        replayed = max(0, done - start)
        self.replayed += replayed
        logger.rewind(start)
        # A row of its own, so a restart after the last iteration's row is in the log too.
        logger.log("learner_restart", start, {"restarts": self.restarts, "replayed": replayed})
        source = checkpoint.name if checkpoint is not None else "the D1 reference (no checkpoint yet)"
        span = f"iterations {start + 1}-{done} replayed" if replayed else "no iteration replayed"
        say_grpo(
            f"the Learner was lost ({lost}); restart {self.restarts} of {self.cfg.run.learner_restarts} from "
            f"{source}: {span}"
        )
        if self.record is not None:
            self.record.event(
                "learner_restarted",
                iteration=done + 1,
                restarts=self.restarts,
                checkpoint=checkpoint.name if checkpoint is not None else None,
                replayed=replayed,
                why=str(lost),
            )
        return start


@dataclass
class TrainingActors:
    """What :func:`start_training_actors` started."""

    learner: LearnerSeat
    fleet: RolloutFleet
    phi_pool: list[Any]
    view_pool: list[Any]
    replicas: list[Any]
    start_iteration: int


def start_training_actors(
    cfg: ExperimentConfig,
    benchmark: Benchmark,
    reference: Path,
    resume_from: Path | None,
    resources: dict[str, Any],
    say: Any = print,
    data: NodeData | None = None,
    record: PlacementRecord | None = None,
) -> TrainingActors:
    """Learner, policy replicas, Phi and View pools and the rollout fleet (``rollout.num_workers``,
    or with ``auto`` one seat per group of an iteration)."""
    requests = {
        "learner": learner_options(cfg),
        "replicas": {**policy_replica_options(cfg), "count": cfg.policy.num_replicas},
    }
    for line in placement_summary(requests, resources):
        say(line)
    data = data or NodeData()
    learner = LearnerSeat(cfg, reference, say, record)
    ro = cfg.rollout
    replicas = start_policy_replicas(cfg, benchmark=benchmark, data=data)
    # The Learner is launched here and waited for last, so it starts while the rollout seats do
    # (an autoscaler sees its demand with theirs): waiting for it before launching them added its
    # whole start to the job's. Not before the replicas are up: a vLLM engine sizes its KV cache
    # from the GPU's free memory, read device-wide while it starts: memory another process takes
    # meanwhile shrinks that cache, and memory freed meanwhile fails the start ("Error in memory
    # profiling").
    learner.launch(resume_from)
    # With phi.llm_source: pool the Phi prompts go to the same replicas as the decisions.
    phi_pool = [
        PhiWorker.options(
            name=actor_name(cfg.run.name, f"phi-worker-{i}"), num_cpus=ro.helper_cpus, max_restarts=ro.max_restarts
        ).remote(benchmark, cfg.phi, replicas, f"phi-{i}", cfg.run.call_timeout_s)
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
    needs_text = needs_view_text(cfg.policy, benchmark.task_contract())
    # A rollout worker starts from the reference's weights, put here once (the driver holds
    # them: a worker started after the Learner was lost does not depend on it); the planner's
    # current weights come with its first group. The reference's frozen parts are the trained
    # Router's too (D2 trains the planner and head only).
    from memprism_ray.adapter.checkpoint import load_model

    start_weights = ray.put(state_to_numpy(load_model(str(reference)).state_dict()))

    def make_rollout_worker(i: int, generation: int) -> object:
        # SPREAD: seats go to different nodes while they have room, so the environments' CPU
        # load is shared and a lost node takes as few groups with it as possible. Each seat
        # reserves its EnvWorkers' CPUs too (they run on its node: RolloutWorker._setup).
        return RolloutWorker.options(
            name=actor_name(cfg.run.name, f"rollout-worker-{i}"),
            num_cpus=ro.seat_cpus(),
            scheduling_strategy="SPREAD",
        ).remote(
            cfg,
            i,
            start_weights,
            phi_pool,
            view_pool,
            replicas,
            needs_text,
            cfg.run.name,
            generation,
            data,
            benchmark=benchmark,
        )

    seats = cfg.grpo.groups_per_iteration if ro.elastic else ro.num_workers
    fleet = RolloutFleet.start(
        seats,
        make_rollout_worker,
        log=say,
        max_replacements=ro.max_restarts,
        ping_timeout_s=cfg.run.call_timeout_s * 4,
        elastic=ro.elastic,
        record=record,
        seat_request={"CPU": ro.seat_cpus()},
        nodes_may_join=joins_cluster(cfg.run.ray_address),
    )
    start = learner.start_first(resume_from)
    if resume_from is not None:
        say(f"resumed from {resume_from} (iteration {checkpoint_iteration(resume_from)})")
    where = f"{len(replicas)} policy replicas" if replicas else "the policy inside each rollout worker"
    nodes = len({(fleet.seats[i].place or {}).get("node_id") for i in fleet.ready()})
    size = f"{fleet.size()} of {seats} (rollout.num_workers auto)" if ro.elastic else str(fleet.size())
    say(f"{size} rollout workers on {nodes} node(s), {where} ({cfg.policy.backend})")
    return TrainingActors(learner, fleet, phi_pool, view_pool, replicas, start)


def run_grpo_iterations(
    cfg: ExperimentConfig,
    actors: TrainingActors,
    games: list[Any],
    logger: RunLogger,
    run_dir: Path,
    ck_extra: dict[str, Any],
) -> dict[str, Any]:
    """Iterations ``actors.start_iteration`` .. ``grpo.iterations``: sample groups of ``games``,
    play them with the learner's current weights, update the learner from the groups' step
    tables (never through this driver), record metrics and checkpoint every
    ``run.checkpoint_every`` iterations and at the end; the trained Router's full weights.
    A lost Learner is started again from the last checkpoint (:class:`LearnerSeat`)."""
    learner = actors.learner
    replay = cfg.grpo.replayed_iterations
    if replay:
        say_grpo(
            f"iterations {cfg.grpo.iterations - replay + 1}-{cfg.grpo.iterations} replay the games of iterations "
            f"1-{replay} with fresh seeds (grpo.replay_first {cfg.grpo.replay_first})"
        )
    bar = progress_bar(
        initial=actors.start_iteration,
        total=cfg.grpo.iterations,
        desc="GRPO",
        file=sys.stdout,
    )
    with bar:  # closed, its last state drawn, before a stop or a failure is said
        seen_size = actors.fleet.size()
        it = logged = actors.start_iteration  # the next iteration to play, the last one logged
        restarts_seen = replayed_seen = 0
        steps_lost: dict[int, int] = {}  # iteration -> times played again for lost step tables
        carried: dict[str, int] = {}  # failures counted in iterations played again: in the next row
        while True:
            rollout: RolloutResult | None = None
            try:
                if it == cfg.grpo.iterations:
                    final = learner.call(
                        learner.actor.full_weights.remote(), cfg.run.call_timeout_s, "final Router weights"
                    )
                    return final
                rollout = RolloutResult()
                stats = _iteration(cfg, actors, games, it, bar, seen_size, rollout)
                rollout = None  # counted in this row, with what abandoned iterations counted
                for k, n in carried.items():
                    stats[k] += n
                carried.clear()
                seen_size = stats["fleet_size_end"]
                stats.update(
                    learner_restarts=learner.restarts - restarts_seen,
                    iterations_replayed=learner.replayed - replayed_seen,
                )
                restarts_seen, replayed_seen = learner.restarts, learner.replayed
                metrics.record_iteration(cfg.run.name, stats)
                logger.log("grpo", it + 1, stats)
                logged = it + 1
                bar.set_postfix(
                    refresh=False,  # drawn with this iteration's count, by the update below
                    sr=f"{stats['success_rate']:.2f}",
                    zero_std=f"{stats.get('zero_std_group_frac', float('nan')):.2f}",
                    kl=f"{stats['kl']:.4f}",
                    failed=stats["failed_trajectories"],
                    replaced=stats["workers_replaced"],
                    workers=stats["fleet_size"],
                )
                bar.update(1)
                if (it + 1) % cfg.run.checkpoint_every == 0 or it + 1 == cfg.grpo.iterations:
                    ck = learner.call(
                        learner.actor.checkpoint.remote(metrics=stats, extra=ck_extra),
                        cfg.run.call_timeout_s,
                        f"checkpoint {it + 1}",
                    )
                    write_files(ck["files"], checkpoint_dir(run_dir, it + 1))
                    logger.log("checkpoint", it + 1, {"sha256": ck["sha256"]})
                it += 1
            except LearnerLost as lost:
                if rollout is not None:  # the iteration was abandoned: what it counted goes to the next row
                    rollout.carry(carried)
                it = logged = learner.restart(lost, logged, run_dir, logger)
                bar.n = it
                bar.refresh()
            except StepsLost as lost:
                if rollout is not None:
                    rollout.carry(carried)
                steps_lost[it] = steps_lost.get(it, 0) + 1
                if steps_lost[it] > STEPS_LOST_REPLAYS:
                    raise IterationFailed(f"{lost}, {STEPS_LOST_REPLAYS + 1} times: nodes keep failing") from None
                learner.replayed += 1
                say_grpo(f"{lost}: the update did not run; playing the iteration again")


def _iteration(
    cfg: ExperimentConfig,
    actors: TrainingActors,
    games: list[Any],
    it: int,
    bar: Any,
    seen_size: int,
    rollout: RolloutResult,
) -> dict[str, Any]:
    """Iteration ``it`` (0-based): its groups played (into ``rollout``, which keeps what was
    counted when the iteration ends on the way) and the Learner updated; its statistics.
    :class:`LearnerLost` when the Learner died on the way (the iteration is then played again)."""
    learner = actors.learner
    t0 = time.perf_counter()
    version = it + 1
    weights_ref = learner.actor.planner_weights.remote()
    learner.check()  # the weights exist before any group waits for them
    run_groups(
        actors.fleet,
        sample_groups(games, cfg, it),
        weights_ref,
        version,
        cfg,
        tick=lambda done, n: bar.set_description(f"GRPO (groups {done}/{n})"),
        # While the fleet waits for a node, a lost Learner ends the wait at once.
        watch=learner.check,
        out=rollout,
    )
    t_rollout = time.perf_counter() - t0
    # Groups that failed because the weights went with the Learner's node are not the fleet's
    # fault: a lost Learner is the cause to act on, and the iteration is played again.
    learner.check()
    if not rollout.steps_refs:
        raise IterationFailed(
            f"iteration {it + 1}: no group produced a decision ({rollout.failed_trajectories} failed "
            f"trajectories); first cause: {rollout.first_failure or 'unknown'}"
        )
    fleet_changes(actors.fleet, rollout, it + 1, seen_size)
    update = learner.actor.update.remote(*rollout.steps_refs)
    try:
        stats = learner.call(update, cfg.run.call_timeout_s * 4, f"learner update of iteration {it + 1}")
    except ObjectLostError as exc:  # a group's step table lived only on a node lost since it played
        raise StepsLost(f"iteration {it + 1}: a group's step table was lost ({type(exc).__name__})") from None
    stats.update(iteration_stats(rollout))
    if stats["phi_fallbacks"]:  # the LLM Phi failing: the Router trains on the rules' events, said
        first = next(g.summary.phi_fallback_first for g in rollout.groups if g.summary.phi_fallbacks)
        of = f"of {int(stats.get('num_steps', 0))} Phi extraction(s)"
        say_grpo(f"iteration {it + 1}: {fallbacks_said(stats['phi_fallbacks'], first, of)}")
    t_end = time.perf_counter()
    stats.update(
        iteration=it + 1,
        weights_version=version,
        iteration_seconds=t_end - t0,
        rollout_phase_seconds=t_rollout,
        update_phase_seconds=t_end - t0 - t_rollout,
    )
    return stats


def fleet_changes(fleet: RolloutFleet, rollout: Any, iteration: int, before: int) -> None:
    """Say (and record in ``cluster.json``) how the fleet grew or shrank in an iteration."""
    start, end = rollout.fleet_size, rollout.fleet_size_end
    seats = len(fleet.seats)
    if start > before:
        say_grpo(f"iteration {iteration}: the fleet grew to {start} of {seats} rollout workers")
        if fleet.record is not None:
            fleet.record.event("grew", iteration=iteration, size=start, seats=seats)
    if end < start:
        lost = f", {rollout.workers_lost} lost with their node" if rollout.workers_lost else ""
        say_grpo(
            f"iteration {iteration}: the fleet shrank to {end} of {seats} rollout workers{lost}; every group was "
            "played (the lost ones re-run)"
        )
        if fleet.record is not None:
            fleet.record.event("shrank", iteration=iteration, size=end, seats=seats, lost=rollout.workers_lost)


def stop_training_actors(actors: TrainingActors) -> None:
    """Kill the training actors to free their CPUs for the evaluation; the policy replicas stay
    up (one engine start, 60-75 s on an H100, saved)."""
    actors.fleet.kill_all()
    for actor in [*actors.phi_pool, *actors.view_pool, actors.learner.actor]:
        ray.kill(actor)


def training_plot(run_dir: Path, say: Any = print, label: str = "success", replay_first: int = 0) -> Path | None:
    """``eval/training_success.png``: success rate (and zero-std group fraction) per GRPO
    iteration from ``metrics.jsonl``; prints the first-5 vs last-5 iteration means, or first-N
    vs last-N on the same tasks when the run replayed N (``grpo.replay_first``)."""
    from memprism_ray.eval.report import plot_training_success, replayed_span
    from memprism_ray.trainer.run_dir import read_metrics

    its = [r for r in read_metrics(run_dir, say) if r.get("kind") == "grpo"]  # a torn last row said, not fatal
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
    when a finished run already holds its evaluation (reports are never replaced). An evaluation
    that a stop or a failure interrupted is continued (``evaluate(resume=True)``): the conditions
    it finished are kept, the others played."""
    from memprism_ray.eval.report import InterruptedEvaluation, check_fresh_output, written_conditions

    eval_dir = run_dir / "eval"
    try:
        check_fresh_output(eval_dir)
    except InterruptedEvaluation:
        if any(eval_dir.glob("summary.*")):
            say("the final evaluation ended with failed episodes (its summary): playing them again")
        else:
            done = ", ".join(written_conditions(eval_dir))
            say(f"the final evaluation was interrupted after {done} (no summary): continuing it")
    except FileExistsError as exc:
        say(f"{exc}: the final evaluation of this run exists and is not repeated")
        return None
    if not (eval_dir / "training_success.png").exists():
        plot = training_plot(run_dir, say, label, cfg.grpo.replayed_iterations)
        if plot is not None:
            say(f"training success per iteration: {plot}")
    return eval_dir
