"""The Ray system on an in-process cluster: rollout groups, the learner, fault handling.

One session-scoped Ray (2 CPUs) and a tiny generated corpus; every actor is created with
the job's own options so the placement logic is exercised too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memprism_ray.benchmark import get_benchmark

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
    phi = [PhiWorker.options(num_cpus=0.05).remote(get_benchmark(cfg.corpus.benchmark))]
    views = [ViewWorker.options(num_cpus=0.05).remote(cfg.render, 64)]
    replicas = [PolicyReplica.options(num_cpus=0.05).remote(cfg.policy)]
    full_ref = learner.full_weights.remote()  # the learner's ref, resolved by the worker (as the job does)
    worker = RolloutWorker.options(num_cpus=0.1).remote(
        cfg, 0, full_ref, phi, views, replicas, True, "testrun", benchmark=get_benchmark(cfg.corpus.benchmark)
    )
    ray.get(worker.ping.remote(), timeout=300)
    yield {"cfg": cfg, "learner": learner, "worker": worker, "views": views, "full_ref": full_ref,
           "every": [learner, worker, *phi, *views, *replicas]}  # fmt: skip
    for a in [learner, worker, *phi, *views, *replicas]:
        ray.kill(a)


def _specs(cfg, iteration: int):
    from memprism_ray.benchmark.alfworld import list_games
    from memprism_ray.trainer.rollouts import sample_groups

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
    summary_ref, steps_ref = worker.run_group.remote(spec, None, 7)  # two results, two refs
    group = ray.get(summary_ref, timeout=600)
    t = ray.get(steps_ref, timeout=60)
    assert not hasattr(group, "steps"), "the summary the driver reads must not carry the step table"
    assert group.group_id == spec.group_id and group.weights_version == 7
    assert [e["episode_id"] for e in group.episodes] == list(spec.episode_ids)
    assert all(e["status"] == "ok" for e in group.episodes)
    assert t.num_rows == group.num_steps == sum(e["steps"] for e in group.episodes)
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
    again = ray.get(worker.run_group.remote(spec, None, 7)[1], timeout=600)
    assert again.column("view_index").to_pylist() == t.column("view_index").to_pylist()
    assert again.column("action").to_pylist() == t.column("action").to_pylist()
    # The groups' views came from stream deltas: one replica per trajectory on the ViewWorker,
    # and no resend was needed.
    stats = ray.get(system["views"][0].stats.remote(), timeout=60)
    assert stats["replicas"] >= len(spec.episode_ids) and stats["resyncs"] == 0


def test_view_worker_draws_from_deltas_and_resyncs_after_a_restart(system) -> None:
    import time

    import ray

    from memprism_ray.actors.services import RemoteViews
    from memprism_ray.recorder import EventStream, RawEvent
    from memprism_ray.view_space import ViewAction
    from memprism_ray.views import ViewRequest, ViewService

    goal = "put a mug in cabinet"
    s = EventStream({"goal": goal})

    def step(t: int) -> None:
        s.record(
            RawEvent("o", f"go to cabinet {t}", f"You arrive at cabinet {t}."),
            entity=f"cabinet {t}",
            act="go",
            delta=[("agent.location", f"cabinet {t}")],
        )

    a = ViewAction("EntityState", "all", "all", "fine")
    handle = system["views"][0]
    remote = RemoteViews([handle], timeout_s=60)
    local = ViewService(encode_png=True)
    step(1)
    first, second = remote.render_each([ViewRequest(s, a, goal)] * 2)
    assert not first.cached and second.cached  # an identical view is drawn once
    assert first.png.startswith(b"\x89PNG") and first.width % 28 == 0 and first.height % 28 == 0
    before = ray.get(handle.stats.remote(), timeout=60)
    step(2)
    (grown,) = remote.render_each([ViewRequest(s, a, goal)])
    assert grown.png == local.render_one(ViewRequest(s, a, goal)).png  # the replica equals the stream
    # The worker restarts (its replicas are gone): the stream is resent whole, once.
    ray.kill(handle, no_restart=False)
    deadline = time.monotonic() + 120
    while True:  # ray.kill is asynchronous: wait for the restarted instance (no replicas)
        try:
            if ray.get(handle.stats.remote(), timeout=30)["replicas"] == 0:
                break
        except ray.exceptions.RayError:
            pass
        assert time.monotonic() < deadline, "the ViewWorker did not restart"
        time.sleep(0.5)
    step(3)
    (after_restart,) = remote.render_each([ViewRequest(s, a, goal)])
    assert not isinstance(after_restart, BaseException), after_restart
    assert after_restart.png == local.render_one(ViewRequest(s, a, goal)).png
    stats = ray.get(handle.stats.remote(), timeout=60)
    assert before["replicas"] >= 1 and stats["replicas"] == 1 and stats["resyncs"] == 1


def test_learner_updates_planner_only(system) -> None:
    import ray

    cfg, worker, learner = system["cfg"], system["worker"], system["learner"]
    before = ray.get(learner.full_weights.remote(), timeout=60)
    refs = [worker.run_group.remote(s, None, 1) for s in _specs(cfg, 1)]
    ray.get([summary for summary, _ in refs], timeout=900)
    stats = ray.get(learner.update.remote(*[steps for _, steps in refs]), timeout=300)  # refs, resolved by Ray
    for key in ("loss", "kl", "entropy", "clip_frac", "zero_std_group_frac", "num_failed_excluded"):
        assert key in stats
    after = ray.get(learner.full_weights.remote(), timeout=60)
    planner = set(ray.get(learner.planner_weights.remote(), timeout=60))
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    assert stats["num_steps"] > 0 and cfg.grpo.beta_entropy > 0
    assert changed, "the entropy bonus alone moves the planner, so some planner weight must change"
    assert changed <= planner, f"non-planner weights changed: {sorted(changed - planner)[:3]}"
    assert stats["iteration"] == 1.0


def test_weights_reach_the_workers_as_the_learners_object_ref(system) -> None:
    """The driver passes the learner's ref on (never fetches it); the worker resolves it and
    after the group holds exactly the learner's weights (updated by the previous test)."""
    import ray

    from memprism_ray.cluster.fleet import RolloutFleet
    from memprism_ray.trainer.rollouts import run_groups

    cfg, worker, learner = system["cfg"], system["worker"], system["learner"]
    weights_ref = learner.planner_weights.remote()
    result = run_groups(RolloutFleet([worker]), _specs(cfg, 6)[:1], weights_ref, 2, cfg)
    assert result.failed_trajectories == 0 and result.groups[0].summary.weights_version == 2
    held = ray.get(
        worker.__ray_call__.remote(lambda self: {k: v.numpy() for k, v in self.model.state_dict().items()}), timeout=60
    )
    full = ray.get(learner.full_weights.remote(), timeout=60)
    assert held.keys() == full.keys() and all(np.array_equal(held[k], full[k]) for k in full)


def test_killing_an_env_worker_mid_iteration_fails_only_its_trajectories(system) -> None:
    """The iteration completes, the failure is counted, the group is re-run once, and the
    other group is untouched."""
    import dataclasses

    import ray

    from memprism_ray.cluster.fleet import RolloutFleet
    from memprism_ray.trainer.rollouts import iteration_stats, run_groups

    cfg, worker = system["cfg"], system["worker"]
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, rerun_failed=True))
    specs = _specs(cfg, 2)
    env_name = ray.get(worker.env_worker_names.remote(), timeout=60)[0]
    env = ray.get_actor(env_name)
    pid_before = ray.get(env.pid.remote(), timeout=60)
    ray.get(env.inject_crash.remote(3), timeout=60)  # dies at its 3rd step call: mid-group
    result = run_groups(RolloutFleet([worker]), specs, None, 3, cfg)
    assert result.failed_trajectories == cfg.grpo.group_size, "the killed EnvWorker's trajectories must be counted"
    assert result.groups_rerun == 1 and result.workers_replaced == 0
    assert [g.summary.group_id for g in result.groups] == [s.group_id for s in specs]
    # After the re-run every trajectory of this iteration finished normally.
    assert all(e["status"] == "ok" for g in result.groups for e in g.summary.episodes)
    assert iteration_stats(result)["groups_rerun"] == 1
    assert ray.get(ray.get_actor(env_name).pid.remote(), timeout=120) != pid_before  # it was restarted


def test_failed_trajectories_are_excluded_without_rerun(system) -> None:
    import dataclasses

    import ray

    from memprism_ray.adapter.grpo_update import GRPOBatch
    from memprism_ray.cluster.fleet import RolloutFleet
    from memprism_ray.trainer.rollouts import iteration_stats, run_groups

    cfg, worker = system["cfg"], system["worker"]
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, rerun_failed=False))
    specs = _specs(cfg, 5)[:1]
    env_name = ray.get(worker.env_worker_names.remote(), timeout=60)[0]
    ray.get(ray.get_actor(env_name).inject_crash.remote(2), timeout=60)
    result = run_groups(RolloutFleet([worker]), specs, None, 4, cfg)
    stats = iteration_stats(result)
    summary = result.groups[0].summary
    failed_eps = [e for e in summary.episodes if e["status"] == "failed"]
    assert failed_eps and stats["failed_excluded"] == len(failed_eps) == stats["failed_trajectories"]
    assert stats["groups_rerun"] == 0
    assert all((e["error"] or "").startswith("env:") for e in failed_eps)
    steps = ray.get(result.groups[0].steps, timeout=60)
    assert steps.num_rows > 0  # the steps before the crash are kept, marked failed
    batch = GRPOBatch.from_step_tables([steps])
    failed_ids = {e["episode_id"] for e in failed_eps}
    ids = steps.column("episode_id").to_pylist()
    rows_failed = [f for eid, f in zip(ids, batch.failed.tolist(), strict=True) if eid in failed_ids]
    assert rows_failed and all(rows_failed)


def test_every_actor_says_where_it_runs(system) -> None:
    """cluster.json's source (issue 34): each kind of actor the job starts answers ``placed()``
    with its node and its dashboard name, the async policy replica included."""
    import ray

    places = ray.get([a.placed.remote() for a in system["every"]], timeout=120)
    node = ray.get_runtime_context().get_node_id()
    assert all(p["node_id"] == node and p["pid"] > 0 for p in places)
    assert len({p["pid"] for p in places}) == len(places)  # one process each
