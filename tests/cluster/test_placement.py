"""Placement from the config: GPU actors ask for GPUs (and the clusters' ``vllm`` resource)
whatever has joined, so the autoscaler sees the demand; CPU runs say so; bad combinations
are refused with one line."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from memprism_ray.benchmark import get_benchmark
from memprism_ray.config import load_config
from memprism_ray.policy.config import HFConfig, PolicyConfig, VLLMConfig


def test_policy_config_refuses_inconsistent_placements() -> None:
    with pytest.raises(ValueError, match="vLLM has no CPU build"):
        PolicyConfig(backend="vllm", gpus_per_replica=0)
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        PolicyConfig(backend="vllm", gpus_per_replica=1, num_replicas=0)
    with pytest.raises(ValueError, match="scripted uses no GPU"):
        PolicyConfig(backend="scripted", gpus_per_replica=1)
    with pytest.raises(ValueError, match=r"hf\.device=cuda needs policy\.gpus_per_replica"):
        PolicyConfig(backend="hf", hf=HFConfig(model_path="/m", device="cuda"))
    with pytest.raises(ValueError, match="resources values must be positive"):
        PolicyConfig(backend="vllm", gpus_per_replica=1, resources={"vllm": 0})


def test_a_job_joining_a_cluster_that_nobody_runs_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale RAY_ADDRESS (a stopped cluster): ray.init retried for over 5 minutes, the job hung."""
    import socket

    from memprism_ray.cluster.placement import check_cluster_address

    with socket.socket() as up:
        up.bind(("127.0.0.1", 0))
        up.listen()
        port = up.getsockname()[1]
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
        check_cluster_address("auto")  # something answers: Ray's own start goes on
    with pytest.raises(ValueError) as refused:  # closed now: nothing listens there
        check_cluster_address("auto")
    assert str(refused.value) == (
        f"no Ray cluster answers at RAY_ADDRESS=127.0.0.1:{port} (Connection refused): start it or correct "
        "the address, or unset RAY_ADDRESS to run on a local Ray"
    )
    check_cluster_address("local")  # a local Ray: no cluster to reach
    for other in ("auto", "ray://127.0.0.1:1"):  # Ray's own lookups
        monkeypatch.setenv("RAY_ADDRESS", other)
        check_cluster_address("auto")


def test_an_output_directory_inside_rays_copy_of_the_working_dir_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``ray job submit --working-dir .`` the driver starts in Ray's copy of the working
    dir; a relative ``run.out_dir`` put the run there (measured: ``runs/wd1`` under
    ``<session>/runtime_resources/working_dir_files/_ray_pkg_e08d.../``, none in the checkout)."""
    from memprism_ray.cluster.placement import check_outlives_job, ray_working_dir_copy

    copy = tmp_path / "session_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_ab12"
    (copy / "configs").mkdir(parents=True)
    monkeypatch.chdir(copy / "configs")
    assert ray_working_dir_copy(Path("../runs/x")) == copy
    assert ray_working_dir_copy(copy / "runs") == copy
    assert ray_working_dir_copy(copy.parent) is None  # the cache itself: no job's copy
    assert ray_working_dir_copy(tmp_path / "runs") is None
    with pytest.raises(ValueError) as refused:
        check_outlives_job(Path("../runs"), "run.out_dir")
    assert str(refused.value) == (
        f"run.out_dir '../runs' is inside Ray's temporary copy of this job's working_dir ({copy}), which Ray "
        f"deletes: give run.out_dir an absolute path on storage that outlives the job, e.g. {Path.home() / 'runs'}"
    )
    check_outlives_job(tmp_path / "runs", "run.out_dir")  # absolute, elsewhere: kept
    monkeypatch.chdir(tmp_path)
    check_outlives_job(Path("runs"), "run.out_dir")  # a checkout, not Ray's copy


def test_replica_options_always_ask_for_the_configured_gpus() -> None:
    cfg = PolicyConfig(
        backend="vllm", gpus_per_replica=2, resources={"vllm": 2}, vllm=VLLMConfig(tensor_parallel_size=2)
    )
    want = {"num_cpus": 1.0, "max_concurrency": 1024, "num_gpus": 2, "resources": {"vllm": 2}}
    assert cfg.replica_options(1.0) == want
    assert "num_gpus" not in PolicyConfig(backend="scripted").replica_options(0.25)


def test_experiment_config_ties_learner_device_to_its_gpus() -> None:
    with pytest.raises(ValueError, match=r"grpo.device=cuda needs rollout.learner_gpus > 0"):
        load_config("configs/local.yaml", ["--grpo.device", "cuda"])
    with pytest.raises(ValueError, match=r"grpo.device=cpu contradicts rollout.learner_gpus=0.1"):
        load_config("configs/local.yaml", ["--rollout.learner_gpus", "0.1"])
    with pytest.raises(ValueError, match=r"label\.llm\.source=pool serves the teacher"):
        load_config("configs/local.yaml", ["--label.teacher", "llm", "--label.llm.source", "pool"])


def test_paper_and_gpu_smoke_presets_ask_for_gpus_and_label_with_the_llm_teacher() -> None:
    from memprism_ray.cluster.placement import learner_options, policy_replica_options

    paper = load_config("configs/alfworld_paper.yaml")
    assert paper.label.teacher == "llm" and paper.label.llm.source == "pool"
    assert 0 < paper.rollout.learner_gpus < 1
    assert learner_options(paper)["num_gpus"] == paper.rollout.learner_gpus
    opts = policy_replica_options(paper)
    assert opts["num_gpus"] == 1.0 and opts["resources"] == {"vllm": 1.0}
    smoke = load_config("configs/gpu_smoke.yaml")
    assert smoke.policy.backend == "vllm" and smoke.policy.vllm.load_format == "dummy"
    assert smoke.policy.num_replicas == 1 and smoke.grpo.iterations <= 3
    # One GPU holds the replica (most of its memory) and the learner's fraction.
    assert smoke.policy.gpus_per_replica + smoke.rollout.learner_gpus <= 1.0
    # What scripts/gpu_proof.sh passes to the job.
    from memprism_ray.trainer.job_args import parse_job_args

    _, job = parse_job_args(
        "grpo", ["--config", "configs/gpu_smoke.yaml", "--init_checkpoint", "/tmp/ref", "--policy.vllm.model", "/m"]
    )
    assert job.init_checkpoint == "/tmp/ref" and job.policy.vllm.model == "/m" and job.grpo.device == "auto"


@pytest.mark.ray
def test_a_gpu_replica_on_a_cpu_cluster_is_pending_demand_never_a_cpu_fallback(
    ray_session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster with no GPU yet the replica's request stays pending (what tells the
    autoscaler to add a GPU node) and the job gets a clear timeout, not a CPU replica."""
    from memprism_ray.actors import workers
    from memprism_ray.actors.workers import PolicyReplica, start_policy_replicas
    from memprism_ray.cluster.placement import pending_demand, policy_replica_options, wait_placed
    from memprism_ray.testing.fake_vllm import fake_engine_factory

    # After the placement timeout start_policy_replicas asks each replica to stop its engine and
    # waits up to 10 s for the answer before ray.kill; a replica never placed cannot answer, so
    # that wait is always waited out in full here. The kill is what matters: a short wait.
    stop = workers.stop_policy_replicas
    monkeypatch.setattr(workers, "stop_policy_replicas", lambda handles, timeout_s=60.0: stop(handles, 0.5))

    ray = ray_session
    assert ray.cluster_resources().get("GPU", 0) == 0
    cfg = load_config(
        "configs/local.yaml",
        [
            "--policy.backend", "vllm", "--policy.gpus_per_replica", "1", "--policy.num_replicas", "1",
            "--policy.resources.vllm", "1", "--rollout.policy_cpus", "0.01",
        ],
    )  # fmt: skip
    opts = policy_replica_options(cfg)
    replica = PolicyReplica.options(**opts).remote(cfg.policy, functools.partial(fake_engine_factory))
    try:
        # The autoscaler's view: a bundle asking for one GPU and one `vllm` unit.
        deadline = time.monotonic() + 30
        while {"GPU": 1.0, "vllm": 1.0, "CPU": 0.01} not in pending_demand():
            assert time.monotonic() < deadline, pending_demand()
            time.sleep(0.5)
        with pytest.raises(TimeoutError, match=r"1 of 1 policy replicas not placed.*'num_gpus': 1\.0"):
            wait_placed([replica.load.remote()], "policy replicas", opts, 2)
    finally:
        ray.kill(replica)
    with pytest.raises(TimeoutError, match="not placed within 2s"):
        start_policy_replicas(
            cfg,
            benchmark=get_benchmark(cfg.corpus.benchmark),
            engine_factory=functools.partial(fake_engine_factory),
            timeout_s=2,
        )


@pytest.mark.ray
def test_seats_that_cannot_be_placed_are_named_with_what_they_lack(ray_session, actors_tiny_cfg, monkeypatch) -> None:
    """Issue 40 item 2: a fixed fleet whose seats ask for what no node has ends within
    PLACEMENT_NOTICE_S on a Ray no node can join, naming the resource (it used to wait
    4 x call_timeout_s, 480 s, and end in "no result within 480s")."""
    from memprism_ray.actors.rollout import RolloutWorker
    from memprism_ray.cluster import fleet

    monkeypatch.setattr(fleet, "PLACEMENT_NOTICE_S", 1.0)
    started = []

    def make(index: int, generation: int):
        w = RolloutWorker.options(num_cpus=0, resources={"memprism_test_seat": 1}).remote(
            actors_tiny_cfg,
            index,
            {},
            [],
            [],
            [],
            False,
            "unplaceable",
            generation,
            benchmark=get_benchmark(actors_tiny_cfg.corpus.benchmark),
        )
        started.append(w)
        return w

    t0 = time.monotonic()
    with pytest.raises(fleet.FleetError) as caught:
        fleet.RolloutFleet.start(
            2, make, ping_timeout_s=300, seat_request={"memprism_test_seat": 1}, nodes_may_join=False
        )
    assert time.monotonic() - t0 < 30
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith("2 rollout seats cannot be placed: each needs 1 memprism_test_seat (")
    assert "the cluster has 0 memprism_test_seat free on 0 of 1 node(s) with room for one" in line
    for w in started:
        ray_session.kill(w)


@pytest.mark.ray
def test_a_transient_data_failure_starts_the_seat_again_and_a_permanent_one_retires_it(
    ray_session, actors_tiny_cfg, tmp_path
) -> None:
    """Issue 40 item 2: a seat whose data could not be fetched (transient: its source node is
    unreachable) is started again up to rollout.max_restarts; one whose user data is missing
    on its node (permanent) is retired at once. Every NodeDataError used to retire the seat."""
    import dataclasses

    from memprism_ray.actors.rollout import RolloutWorker
    from memprism_ray.benchmark import DataTree
    from memprism_ray.cluster import fleet
    from memprism_ray.cluster.node_data import NodeData, ShippedTree

    gone = tmp_path / "gone"
    cfg = dataclasses.replace(
        actors_tiny_cfg, corpus=dataclasses.replace(actors_tiny_cfg.corpus, data_root=str(gone / "corpus"))
    )
    unreachable = NodeData(shipped=(ShippedTree(str(gone), "the corpus", "ab" * 32, 1, (), "ff" * 28),))
    missing = NodeData(checked=(DataTree(str(gone), "corpus.data_root", owned=False),))
    started = []

    def fleet_on(data: NodeData) -> fleet.RolloutFleet:
        def make(index: int, generation: int):
            w = RolloutWorker.options(num_cpus=0).remote(
                cfg,
                index,
                {},
                [],
                [],
                [],
                False,
                "seat",
                generation,
                data,
                benchmark=get_benchmark(cfg.corpus.benchmark),
            )
            started.append(w)
            return w

        f = fleet.RolloutFleet(None, make, max_replacements=2, ping_timeout_s=120, elastic=True)
        f.seats = [fleet.Seat(0)]
        f._launch(f.seats[0])
        with pytest.raises(Exception, match="corpus"):
            f.wait_for_one("the test", log=None)
        return f

    transient = fleet_on(unreachable)
    assert transient.seats[0].retired and transient.seats[0].replacements == 2  # started again twice
    permanent = fleet_on(missing)
    assert permanent.seats[0].retired and permanent.seats[0].replacements == 0
    for w in started:
        ray_session.kill(w)
