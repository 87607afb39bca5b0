"""GRPO's rollout dispatch (paper "Adapter", grouped GRPO; appendix A.3): explicit task ids
per iteration, group dispatch to rollout workers with fault handling, iteration statistics.

Data flow: the driver reads only each group's small :class:`GroupSummary`; the group's step
table stays an object ref (``GroupOutcome.steps``) that goes to the learner unread, and the
Router weights reach the rollout workers as the learner's own object ref.

Faults: a rollout worker whose group does not finish within ``rollout.group_timeout_s``
(hung), or whose process died, is killed (``ray.kill``: Ray 2.60 rejects
``ray.cancel(force=True)`` on actor tasks) and replaced by a new one with fresh EnvWorkers;
its group is re-run once. A worker that returns groups with failed trajectories twice in a
row is replaced too. An index replaced more than ``rollout.max_restarts`` times is retired
(given no more groups). Every failed trajectory, re-run and replacement is counted in the
iteration's statistics.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError
from tqdm import tqdm

from memprism_ray.actors import waits
from memprism_ray.actors.rollout import GroupSpec, GroupSummary

#: Seconds between progress ticks while an iteration's groups play.
TICK_S = 15.0

#: Consecutive groups with failed trajectories after which a worker is replaced.
STRIKES_TO_REPLACE = 2


def say(msg: str) -> None:
    """A fault or progress line, printed through the progress bar (``tqdm.write``) so it is
    neither overwritten by the bar's ``\\r`` nor lost from a captured log."""
    tqdm.write(f"[grpo] {msg}", file=sys.stdout)
    sys.stdout.flush()


def _draw_games(games: list, cfg: Any, iteration: int) -> tuple[list, random.Random]:
    rng = random.Random(f"{cfg.run.seed}:{iteration}")
    return rng.sample(games, k=min(cfg.grpo.groups_per_iteration, len(games))), rng


def sample_groups(games: list, cfg: Any, iteration: int) -> list[GroupSpec]:
    """Explicit task ids for one iteration (0-based), a function of (seed, iteration) only, so
    a resumed run samples exactly what an uninterrupted one would. With ``grpo.replay_first``
    N, iteration ``iterations - N + k`` plays the tasks of iteration ``k`` with its own
    trajectory seeds: the drawn tasks explain most of an iteration's success (on the embedded
    default a correlation of 0.87-0.93 between an iteration's success and the D1 Router's
    success on its tasks, docs/embedded-default-results.md), so only a comparison on the same
    tasks shows what training changed."""
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


class RolloutFleet:
    """The job's rollout workers, by index. ``make_worker(index, generation)`` starts one
    (``generation`` counts replacements of that index); without it a failed worker can only
    be retired. ``max_replacements``: replacements of one index before it is retired."""

    def __init__(
        self,
        workers: list[Any],
        make_worker: Callable[[int, int], Any] | None = None,
        *,
        max_replacements: int = 3,
        ping_timeout_s: float = 300.0,
    ) -> None:
        if not workers:
            raise ValueError("a rollout fleet needs at least one worker")
        self.workers: list[Any] = list(workers)
        self.make_worker = make_worker
        self.max_replacements = max_replacements
        self.ping_timeout_s = ping_timeout_s
        self.generation = [0] * len(workers)
        self.retired: set[int] = set()
        self.strikes = [0] * len(workers)

    @classmethod
    def start(
        cls, n: int, make_worker: Callable[[int, int], Any], *, max_replacements: int, ping_timeout_s: float
    ) -> RolloutFleet:
        """Start ``n`` workers and wait (bounded) until each answers."""
        fleet = cls(
            [make_worker(i, 0) for i in range(n)],
            make_worker,
            max_replacements=max_replacements,
            ping_timeout_s=ping_timeout_s,
        )
        waits.get([w.ping.remote() for w in fleet.workers], ping_timeout_s, f"start of {n} rollout workers")
        return fleet

    def active(self) -> list[int]:
        return [i for i in range(len(self.workers)) if i not in self.retired]

    def replace(self, index: int, reason: str) -> bool:
        """Kill worker ``index`` (hung or dead) and start a fresh one in its place. Returns
        False when the index is retired instead (no factory, or replaced too often)."""
        ray.kill(self.workers[index])  # also ends its EnvWorkers (owned by its process)
        self.strikes[index] = 0
        if self.make_worker is None or self.generation[index] >= self.max_replacements:
            self.retired.add(index)
            say(f"rollout worker {index} retired after {self.generation[index]} replacement(s): {reason}")
            return False
        self.generation[index] += 1
        say(f"rollout worker {index} replaced (generation {self.generation[index]}): {reason}")
        self.workers[index] = self.make_worker(index, self.generation[index])
        try:
            waits.get(self.workers[index].ping.remote(), self.ping_timeout_s, f"start of rollout worker {index}")
        except Exception as exc:  # the replacement itself cannot start: stop using the index
            ray.kill(self.workers[index])
            self.retired.add(index)
            say(f"rollout worker {index} retired: its replacement did not start ({type(exc).__name__}: {exc})")
            return False
        return True

    def kill_all(self) -> None:
        for i in self.active():
            ray.kill(self.workers[i])


@dataclass
class GroupOutcome:
    """One finished group as the driver holds it: the summary it read, and the object ref
    of the step table (``None`` when the group failed before producing one), unread."""

    summary: GroupSummary
    steps: Any = None


@dataclass
class RolloutResult:
    """An iteration's groups (in spec order) and what went wrong on the way."""

    groups: list[GroupOutcome] = field(default_factory=list)
    failed_trajectories: int = 0  # every failed trajectory seen, whether its group was re-run or not
    groups_rerun: int = 0
    workers_replaced: int = 0
    workers_retired: int = 0

    @property
    def steps_refs(self) -> list[Any]:
        return [g.steps for g in self.groups if g.steps is not None]


def run_groups(
    fleet: RolloutFleet,
    specs: list[GroupSpec],
    weights_ref: Any,
    version: int,
    cfg: Any,
    tick: Callable[[int, int], None] | None = None,
) -> RolloutResult:
    """Dispatch groups to idle rollout workers (see the module docstring for faults). A group
    with failed trajectories is re-run once when ``rollout.rerun_failed``; otherwise its
    failed trajectories stay marked and the learner leaves them out. ``weights_ref`` (the
    learner's object ref, or ``None`` to keep the workers' weights) is waited for here
    without being fetched. ``tick(groups done, groups)`` is called as groups finish and at
    least every 15 s while they play, so a long iteration is never silent."""
    if weights_ref is not None:
        waits.ready([weights_ref], cfg.run.call_timeout_s, f"Router weights version {version} from the learner")
    out = RolloutResult()
    retired_before = len(fleet.retired)
    timeout_s = cfg.rollout.group_timeout_s
    pending = list(specs)
    done: list[GroupOutcome] = []
    attempts = {s.group_id: 0 for s in specs}
    in_flight: dict[Any, tuple[int, GroupSpec, Any, float]] = {}
    idle = fleet.active()
    last_tick = time.monotonic()

    def finish_or_rerun(spec: GroupSpec, outcome: GroupOutcome) -> None:
        if outcome.summary.failed and cfg.rollout.rerun_failed and attempts[spec.group_id] < 2:
            say(f"group {spec.group_id}: {outcome.summary.failed} trajectories failed; re-running it once")
            out.groups_rerun += 1
            pending.append(spec)
        else:
            done.append(outcome)

    def worker_failed(w: int, spec: GroupSpec, reason: str) -> None:
        out.failed_trajectories += len(spec.episode_ids)
        if fleet.replace(w, f"group {spec.group_id}: {reason}"):
            out.workers_replaced += 1
            idle.append(w)
        finish_or_rerun(spec, GroupOutcome(_failed_summary(spec, version, reason)))

    while pending or in_flight:
        while pending and idle:
            w = idle.pop(0)
            spec = pending.pop(0)
            attempts[spec.group_id] += 1
            summary_ref, steps_ref = fleet.workers[w].run_group.remote(spec, weights_ref, version)
            in_flight[summary_ref] = (w, spec, steps_ref, time.monotonic())
        if not in_flight:
            raise RuntimeError(
                f"no rollout worker left for {len(pending)} group(s) of iteration version {version}: all "
                f"{len(fleet.workers)} were retired after repeated failures (rollout.max_restarts="
                f"{fleet.max_replacements}); see the [grpo] lines above"
            )
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
            except RayActorError as exc:  # the rollout worker's process died
                worker_failed(w, spec, f"rollout worker died ({type(exc).__name__})")
                continue
            except Exception as exc:  # run_group raised: every trajectory of the group failed
                cause = getattr(exc, "cause", None) or exc  # RayTaskError: the worker's own exception
                summary = _failed_summary(spec, version, f"run_group: {type(cause).__name__}: {cause}"[:500])
                steps_ref = None
            out.failed_trajectories += summary.failed
            if summary.failed:
                fleet.strikes[w] += 1
                if fleet.strikes[w] >= STRIKES_TO_REPLACE:
                    if fleet.replace(w, f"{fleet.strikes[w]} groups in a row with failed trajectories"):
                        out.workers_replaced += 1
                        idle.append(w)
                else:
                    idle.append(w)
            else:
                fleet.strikes[w] = 0
                idle.append(w)
            finish_or_rerun(spec, GroupOutcome(summary, steps_ref if summary.num_steps else None))
        now = time.monotonic()
        for ref, (w, spec, _, started) in list(in_flight.items()):
            if now - started > timeout_s:
                in_flight.pop(ref)
                worker_failed(w, spec, f"hung: no result within rollout.group_timeout_s={timeout_s:g}s")
    out.workers_retired = len(fleet.retired) - retired_before
    order = {s.group_id: i for i, s in enumerate(specs)}
    out.groups = sorted(done, key=lambda g: order[g.summary.group_id])
    return out


def _failed_summary(spec: GroupSpec, version: int, error: str) -> GroupSummary:
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
    return GroupSummary(spec.group_id, spec.game["game_id"], version, episodes)


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
        "success_rate": sum(e["won"] for e in live) / len(live) if live else 0.0,
        "mean_episode_length": sum(e["steps"] for e in live) / len(live) if live else 0.0,
        "rollout_seconds_max": max((g.seconds for g in groups), default=0.0),
    }
