"""GRPO's rollout dispatch (paper "Adapter", grouped GRPO; appendix A.3): explicit task ids
per iteration, group dispatch to rollout workers with fault handling, iteration statistics.

Faults: a rollout worker whose group does not finish within ``rollout.group_timeout_s``
(hung), or whose process died, is killed (``ray.kill``: Ray 2.60 rejects
``ray.cancel(force=True)`` on actor tasks) and replaced; its group is played again (at most
:data:`GROUP_ATTEMPTS` times in all). A worker
that returns groups with failed trajectories twice in a row is replaced too; a seat replaced
more than ``rollout.max_restarts`` times is retired. All of it is counted in the statistics.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from memprism_ray.actors.rollout import GroupSpec, GroupSummary
from memprism_ray.cluster import waits
from memprism_ray.cluster.fleet import RolloutFleet, one_line, say
from memprism_ray.cluster.node_data import node_label

if TYPE_CHECKING:
    from memprism_ray.config import ExperimentConfig

#: Seconds between progress ticks while an iteration's groups play.
TICK_S = 15.0

#: Consecutive groups with failed trajectories after which a worker is replaced.
STRIKES_TO_REPLACE = 2

#: Times a group with failed trajectories is played at most (``rollout.rerun_failed``): one more
#: than the strikes that replace a worker, so a group that failed twice on a bad worker is played
#: by its replacement; and two faults can hit one group (bench_chaos: its worker lost with a node,
#: then the re-run's EnvWorker killed), after which it was left out and the weights differed.
GROUP_ATTEMPTS = 3


def _draw_games(games: list, cfg: ExperimentConfig, iteration: int) -> tuple[list, random.Random]:
    rng = random.Random(f"{cfg.run.seed}:{iteration}")
    return rng.sample(games, k=min(cfg.grpo.groups_per_iteration, len(games))), rng


def sample_groups(games: list, cfg: ExperimentConfig, iteration: int) -> list[GroupSpec]:
    """Explicit task ids for one iteration (0-based), a function of (seed, iteration) only (a
    resumed run samples what an uninterrupted one would). With ``grpo.replay_first`` N, iteration
    ``iterations - N + k`` replays the tasks of iteration ``k`` with its own trajectory seeds: the
    drawn tasks explain most of an iteration's success (correlation 0.87-0.93 on the embedded
    default, docs/embedded-default-results.md)."""
    chosen, rng = _draw_games(games, cfg, iteration)
    replay = cfg.grpo.replayed_iterations
    first_replayed = cfg.grpo.iterations - replay
    if replay and iteration >= first_replayed:
        chosen, _ = _draw_games(games, cfg, iteration - first_replayed)
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


@dataclass
class GroupOutcome:
    """One finished group: the summary the driver read and its step table's ref, unread."""

    summary: GroupSummary
    steps: Any = None


@dataclass
class RolloutResult:
    """An iteration's groups (in spec order) and what went wrong on the way."""

    COUNTERS = ("failed_trajectories", "groups_rerun", "workers_replaced", "workers_retired", "workers_lost")
    """What went wrong, counted: an iteration abandoned on the way (its Learner lost) hands them
    to the next row rather than dropping them (:meth:`carry`)."""

    groups: list[GroupOutcome] = field(default_factory=list)
    failed_trajectories: int = 0  # every failed trajectory seen, whether its group was re-run or not
    groups_rerun: int = 0
    workers_replaced: int = 0
    workers_retired: int = 0
    workers_lost: int = 0
    """workers lost with their node"""
    fleet_size: int = 0
    """workers ready when the iteration's groups were dispatched"""
    fleet_size_end: int = 0
    first_failure: str = ""
    """the first failed trajectory's cause and node, as the [grpo] lines show it"""

    @property
    def steps_refs(self) -> list[Any]:
        return [g.steps for g in self.groups if g.steps is not None]

    def carry(self, into: dict[str, int]) -> None:
        """Add this (abandoned) iteration's counters to ``into``."""
        for k in self.COUNTERS:
            into[k] = into.get(k, 0) + getattr(self, k)


class IterationFailed(RuntimeError):
    """An iteration in which no group produced a decision (one line with the first cause)."""


def run_groups(
    fleet: RolloutFleet,
    specs: list[GroupSpec],
    weights_ref: Any,
    version: int,
    cfg: ExperimentConfig,
    tick: Callable[[int, int], None] | None = None,
    watch: Callable[[], None] | None = None,
    out: RolloutResult | None = None,
) -> RolloutResult:
    """Dispatch groups to idle rollout workers (faults: the module docstring). A group with
    failed trajectories is played again (at most :data:`GROUP_ATTEMPTS` times in all) when
    ``rollout.rerun_failed``, else the learner leaves
    them out. ``weights_ref`` (``None``: keep the workers' weights) is waited for unfetched.
    ``tick(groups done, groups)`` is called as groups finish and at least every ``TICK_S``;
    ``watch()`` while the fleet waits for a worker (it raises to end the wait). ``out``: the
    result to fill, which keeps what was counted when the wait is ended by a raise."""
    from memprism_ray.cluster.placement_record import node_alive, node_lost

    if weights_ref is not None:
        waits.ready([weights_ref], cfg.run.call_timeout_s, f"Router weights version {version} from the learner")
    out = RolloutResult() if out is None else out
    retired_before = len(fleet.retired)
    fleet.settle(log=say)
    out.fleet_size = fleet.size()
    timeout_s = cfg.rollout.group_timeout_s
    pending = list(specs)
    done: list[GroupOutcome] = []
    attempts = {s.group_id: 0 for s in specs}
    in_flight: dict[Any, tuple[int, GroupSpec, Any, float]] = {}
    idle = fleet.ready()
    last_tick = time.monotonic()

    def note_failure(summary: GroupSummary) -> str:
        first = next((e for e in summary.episodes if e["status"] == "failed"), None)
        cause = f"{(first or {}).get('error') or 'unknown'} [{summary.node or 'node unknown'}]"
        out.first_failure = out.first_failure or cause
        return cause

    def finish_or_rerun(spec: GroupSpec, outcome: GroupOutcome) -> None:
        n = outcome.summary.failed
        cause = f" (first: {note_failure(outcome.summary)})" if n else ""
        if n and cfg.rollout.rerun_failed and attempts[spec.group_id] < GROUP_ATTEMPTS:
            again = f"playing it again ({attempts[spec.group_id] + 1} of {GROUP_ATTEMPTS})"
            say(f"group {spec.group_id}: {n} of {len(spec.episode_ids)} trajectories failed{cause}; {again}")
            out.groups_rerun += 1
            pending.append(spec)
        else:
            if n:
                say(f"group {spec.group_id}: {n} of {len(spec.episode_ids)} trajectories failed{cause}; left out")
            done.append(outcome)

    deaths: list[str] = []  # node ids of workers that died in this iteration

    def worker_failed(w: int, spec: GroupSpec, reason: str, died: bool = False) -> None:
        place = fleet.seats[w].place or {}
        where = node_label(place) if place.get("node_id") else "node unknown"
        if died and place.get("node_id"):
            deaths.append(place["node_id"])
            if not node_alive(place["node_id"]):
                reason = f"{reason}; {where} is gone"
        out.failed_trajectories += len(spec.episode_ids)
        if fleet.replace(w, f"group {spec.group_id}: {reason}", died=died):
            out.workers_replaced += 1
        finish_or_rerun(spec, GroupOutcome(_failed_summary(spec, version, reason, where)))

    try:
        while pending or in_flight:
            if pending and not idle and not in_flight:
                fleet.wait_for_one(f"{len(pending)} group(s) of iteration version {version}", watch)
            if pending:  # a replacement (or a seat placed on a new node) that started meanwhile joins now
                fleet.poll(log=say)
                busy = {w for w, *_ in in_flight.values()}
                idle.extend(i for i in fleet.ready() if i not in idle and i not in busy)
            while pending and idle:
                w = idle.pop(0)
                spec = pending.pop(0)
                attempts[spec.group_id] += 1
                summary_ref, steps_ref = fleet.workers[w].run_group.remote(spec, weights_ref, version)
                in_flight[summary_ref] = (w, spec, steps_ref, time.monotonic())
            if not in_flight:
                continue
            now = time.monotonic()
            next_deadline = min(started + timeout_s for _, _, _, started in in_flight.values())
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=max(0.0, min(5.0, next_deadline - now)))
            if tick is not None and (ready or now - last_tick >= TICK_S):
                tick(len(done) + len(ready), len(specs))
                last_tick = now
            for ref in ready:
                w, spec, steps_ref, _ = in_flight.pop(ref)
                try:
                    summary = waits.get(ref, cfg.run.call_timeout_s, f"summary of group {spec.group_id}")
                except RayActorError as exc:
                    if not isinstance(exc, RayTaskError) and _about(exc, fleet.workers[w]):
                        worker_failed(w, spec, f"rollout worker died ({type(exc).__name__})", died=True)
                        continue
                    # run_group failed on something else that died (the Learner holding the weights,
                    # whose error an argument carries in): that is the cause to act on, when watched.
                    if watch is not None:
                        watch()
                    cause = getattr(exc, "cause", None) or exc
                    summary = _failed_summary(spec, version, f"run_group: {one_line(cause)}")
                    steps_ref = None
                except Exception as exc:  # run_group raised: every trajectory of the group failed
                    cause = getattr(exc, "cause", None) or exc  # RayTaskError: the worker's own exception
                    where = node_label(fleet.seats[w].place) if (fleet.seats[w].place or {}).get("node_id") else ""
                    summary = _failed_summary(spec, version, f"run_group: {one_line(cause)}", where)
                    steps_ref = None
                out.failed_trajectories += summary.failed
                seat = fleet.seats[w]
                if summary.failed:
                    seat.strikes += 1
                    if seat.strikes >= STRIKES_TO_REPLACE:
                        if fleet.replace(w, f"{seat.strikes} groups in a row with failed trajectories"):
                            out.workers_replaced += 1
                    else:
                        idle.append(w)
                else:
                    seat.strikes = 0
                    idle.append(w)
                finish_or_rerun(spec, GroupOutcome(summary, steps_ref if summary.num_steps else None))
            now = time.monotonic()
            for ref, (w, spec, _, started) in list(in_flight.items()):
                if now - started > timeout_s:
                    in_flight.pop(ref)
                    worker_failed(w, spec, f"hung: no result within rollout.group_timeout_s={timeout_s:g}s")
    finally:  # also when watch() ended the wait: a dead node's workers stay counted
        out.workers_retired = len(fleet.retired) - retired_before
        # Lost with their node: the deaths whose node is gone (node_lost asks the node itself).
        lost = {n for n in set(deaths) if node_lost(n)}
        out.workers_lost = sum(n in lost for n in deaths)
        if fleet.record is not None:
            for n in sorted(lost):
                fleet.record.event(
                    "node_lost", iteration=specs[0].iteration + 1 if specs else None, node_id=n, workers=deaths.count(n)
                )
        out.fleet_size_end = fleet.size()
    order = {s.group_id: i for i, s in enumerate(specs)}
    out.groups = sorted(done, key=lambda g: order[g.summary.group_id])
    return out


def _about(exc: RayActorError, actor: Any) -> bool:
    """Whether ``exc`` is ``actor``'s own death (an error passed in as an argument names the
    actor it came from: a task given a dead Learner's weights fails with the Learner's error)."""
    ours = getattr(getattr(actor, "_actor_id", None), "hex", lambda: None)()
    return exc.actor_id is None or ours is None or exc.actor_id == ours


def _failed_summary(spec: GroupSpec, version: int, error: str, node: str = "") -> GroupSummary:
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
    return GroupSummary(spec.group_id, spec.game["game_id"], version, episodes, node=node)


def iteration_stats(result: RolloutResult) -> dict[str, float]:
    groups = [g.summary for g in result.groups]
    eps = [e for g in groups for e in g.episodes]
    live = [e for e in eps if e["status"] != "failed"]
    return {
        "trajectories": len(eps),
        "failed_trajectories": result.failed_trajectories,
        "failed_excluded": len(eps) - len(live),
        "groups_rerun": result.groups_rerun,
        "workers_replaced": result.workers_replaced,
        "workers_retired": result.workers_retired,
        "workers_lost": result.workers_lost,
        "fleet_size": result.fleet_size,
        "fleet_size_end": result.fleet_size_end,
        "success_rate": sum(e["won"] for e in live) / len(live) if live else 0.0,
        "mean_episode_length": sum(e["steps"] for e in live) / len(live) if live else 0.0,
        "rollout_seconds_max": max((g.seconds for g in groups), default=0.0),
        "phi_fallbacks": sum(g.phi_fallbacks for g in groups),
    }
