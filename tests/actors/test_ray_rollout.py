"""The Ray system on an in-process cluster: rollout groups, the learner, fault handling.

One session-scoped Ray (2 CPUs) and a tiny generated corpus; every actor is created with
the job's own options so the placement logic is exercised too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def system(ray_session, actors_tiny_cfg, actors_reference_ckpt: Path):
    """Learner, stage pools, one policy replica and one rollout worker, as the job builds them."""
    ray = ray_session
    from memprism_ray.actors.learner import Learner
    from memprism_ray.actors.rollout import RolloutWorker
    from memprism_ray.actors.workers import PhiWorker, PolicyReplica, ViewWorker

    cfg = actors_tiny_cfg
    learner = Learner.options(num_cpus=0.1).remote(cfg.grpo, str(actors_reference_ckpt), "")
    phi = [PhiWorker.options(num_cpus=0.05).remote()]
    views = [ViewWorker.options(num_cpus=0.05).remote(cfg.render, 64)]
    replicas = [PolicyReplica.options(num_cpus=0.05).remote(cfg.policy)]
    full = ray.get(learner.full_weights.remote(), timeout=120)
    full_ref = ray.put(full)
    worker = RolloutWorker.options(num_cpus=0.1, max_restarts=1).remote(
        cfg, 0, full_ref, phi, views, replicas, True, "testrun"
    )
    ray.get(worker.ping.remote(), timeout=300)
    yield {"cfg": cfg, "learner": learner, "worker": worker, "views": views, "full_ref": full_ref}
    for a in [learner, worker, *phi, *views, *replicas]:
        ray.kill(a)


def _specs(cfg, iteration: int):
    from memprism_ray.actors.grpo_driver import sample_groups
    from memprism_ray.envs.alfworld import list_games

    games = list_games("train", cfg.corpus.data_root)
    return sample_groups(games, cfg, iteration)


def test_sample_groups_is_a_function_of_seed_and_iteration(actors_tiny_cfg) -> None:
    a, b, c = _specs(actors_tiny_cfg, 3), _specs(actors_tiny_cfg, 3), _specs(actors_tiny_cfg, 4)
    assert a == b
    assert [s.game for s in a] != [s.game for s in c] or [s.seed for s in a] != [s.seed for s in c]
    assert len({s.game["game_id"] for s in a}) == len(a) == actors_tiny_cfg.grpo.groups_per_iteration
    assert all(len(s.episode_ids) == actors_tiny_cfg.grpo.group_size for s in a)


def test_rollout_group_is_an_arrow_trajectory_group(system) -> None:
    import ray

    cfg, worker = system["cfg"], system["worker"]
    spec = _specs(cfg, 0)[0]
    group = ray.get(worker.run_group.remote(spec, None, 7), timeout=600)
    t = group.steps
    assert group.group_id == spec.group_id and group.weights_version == 7
    assert [e["episode_id"] for e in group.episodes] == list(spec.episode_ids)
    assert all(e["status"] == "ok" for e in group.episodes)
    assert t.num_rows == sum(e["steps"] for e in group.episodes)
    assert set(t.column("weights_version").to_pylist()) == {7}
    assert set(t.column("group_id").to_pylist()) == {spec.group_id}
    idx = np.array(t.column("view_index").to_pylist())
    lp = np.array(t.column("view_logprob").to_pylist())
    assert ((idx >= 0) & (idx < 144)).all() and (lp <= 0).all()
    assert t.schema.field("feat_obs").type.list_size == 384
    assert t.schema.field("feat_window").type.list_size == 128
    # Every step of a trajectory carries that trajectory's return (binary success).
    won = {e["episode_id"]: float(e["won"]) for e in group.episodes}
    for eid, ret in zip(t.column("episode_id").to_pylist(), t.column("traj_return").to_pylist(), strict=False):
        assert ret == won[eid]
    # Same seed, same weights -> the same group (rollouts are reproducible).
    again = ray.get(worker.run_group.remote(spec, None, 7), timeout=600)
    assert again.steps.column("view_index").to_pylist() == t.column("view_index").to_pylist()
    assert again.steps.column("action").to_pylist() == t.column("action").to_pylist()


def test_view_worker_draws_an_identical_view_once(system) -> None:
    import ray

    from memprism_ray.recorder import EventStream, RawEvent
    from memprism_ray.view_space import ViewAction
    from memprism_ray.views import ViewRequest

    s = EventStream({"goal": "put a mug in cabinet"})
    s.record(
        RawEvent("o", "go to cabinet 1", "You arrive at cabinet 1."),
        entity="cabinet 1",
        act="go",
        delta=[("agent.location", "cabinet 1")],
    )
    a = ViewAction("EntityState", "all", "all", "fine")
    view = system["views"][0]
    first, second = ray.get(view.render.remote([ViewRequest(s, a, "put a mug in cabinet")] * 2), timeout=60)
    assert not first.cached and second.cached
    assert first.png == second.png and first.png.startswith(b"\x89PNG")
    assert first.width % 28 == 0 and first.height % 28 == 0


def test_learner_updates_planner_only(system) -> None:
    import ray

    cfg, worker, learner = system["cfg"], system["worker"], system["learner"]
    before = ray.get(learner.full_weights.remote(), timeout=60)
    groups = ray.get([worker.run_group.remote(s, None, 1) for s in _specs(cfg, 1)], timeout=900)
    stats = ray.get(learner.update.remote(groups), timeout=300)
    for key in ("loss", "kl", "entropy", "clip_frac", "zero_std_group_frac", "num_failed_excluded"):
        assert key in stats
    after = ray.get(learner.full_weights.remote(), timeout=60)
    planner = set(ray.get(learner.planner_weights.remote(), timeout=60))
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    assert stats["num_steps"] > 0 and cfg.grpo.beta_entropy > 0
    assert changed, "the entropy bonus alone moves the planner, so some planner weight must change"
    assert changed <= planner, f"non-planner weights changed: {sorted(changed - planner)[:3]}"
    assert stats["iteration"] == 1.0


def test_killing_an_env_worker_mid_iteration_fails_only_its_trajectories(system) -> None:
    """The iteration completes, the failure is counted, the group is re-run once, and the
    other group is untouched."""
    import dataclasses

    import ray

    from memprism_ray.actors.grpo_driver import run_groups

    cfg, worker = system["cfg"], system["worker"]
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, rerun_failed=True))
    specs = _specs(cfg, 2)
    env_name = ray.get(worker.env_worker_names.remote(), timeout=60)[0]
    env = ray.get_actor(env_name)
    pid_before = ray.get(env.pid.remote(), timeout=60)
    ray.get(env.inject_crash.remote(3), timeout=60)  # dies at its 3rd step call: mid-group
    groups, failed_seen = run_groups([worker], specs, None, 3, cfg)
    assert failed_seen == cfg.grpo.group_size, "the killed EnvWorker's trajectories must be counted as failed"
    assert [g.group_id for g in groups] == [s.group_id for s in specs]
    # After the re-run every trajectory of this iteration finished normally.
    assert all(e["status"] == "ok" for g in groups for e in g.episodes)
    assert ray.get(ray.get_actor(env_name).pid.remote(), timeout=120) != pid_before  # it was restarted


def test_failed_trajectories_are_excluded_without_rerun(system) -> None:
    import dataclasses

    import ray

    from memprism_ray.actors.grpo_driver import iteration_stats, run_groups
    from memprism_ray.actors.learner import groups_to_batch

    cfg, worker = system["cfg"], system["worker"]
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, rerun_failed=False))
    specs = _specs(cfg, 5)[:1]
    env_name = ray.get(worker.env_worker_names.remote(), timeout=60)[0]
    ray.get(ray.get_actor(env_name).inject_crash.remote(2), timeout=60)
    groups, failed_seen = run_groups([worker], specs, None, 4, cfg)
    stats = iteration_stats(groups, failed_seen)
    failed_eps = [e for e in groups[0].episodes if e["status"] == "failed"]
    assert failed_eps and stats["failed_excluded"] == len(failed_eps) == failed_seen
    assert all((e["error"] or "").startswith("env:") for e in failed_eps)
    assert groups[0].steps.num_rows > 0  # the steps before the crash are kept, marked failed
    if groups[0].steps.num_rows:
        batch = groups_to_batch(groups)
        failed_ids = {e["episode_id"] for e in failed_eps}
        rows_failed = [
            f
            for eid, f in zip(groups[0].steps.column("episode_id").to_pylist(), batch.failed.tolist(), strict=False)
            if eid in failed_ids
        ]
        assert all(rows_failed)
