"""The GRPO driver's building blocks (docs/architecture.md "Distributed rollout"): explicit task ids
per iteration, group dispatch to rollout workers with fault handling, iteration statistics.
``jobs/grpo_alfworld.py`` reads top to bottom on top of these."""

from __future__ import annotations

import random
import time
from typing import Any

import ray

from memprism_ray.actors.rollout import GroupSpec, TrajectoryGroup


def say(msg: str) -> None:
    print(f"[grpo] {msg}", flush=True)


def sample_groups(games: list, cfg: Any, iteration: int) -> list[GroupSpec]:
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


def run_groups(
    workers: list, specs: list[GroupSpec], weights_ref: Any, version: int, cfg: Any
) -> tuple[list[TrajectoryGroup], int]:
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


def iteration_stats(groups: list[TrajectoryGroup], failed_seen: int) -> dict[str, float]:
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
