"""The task-policy pool on CPU: async replicas around a fake continuous-batching engine with
vLLM's ``AsyncLLM.generate`` contract (memprism_ray/testing/fake_vllm.py), routing by group
and load, per-request failures. The same code runs on a real engine in tests/gpu/."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from memprism_ray.benchmark import get_benchmark
from memprism_ray.policy.base import PolicyBackendError, PolicyInput
from memprism_ray.policy.config import PolicyConfig, VLLMConfig
from memprism_ray.policy.pool import GroupLoads, pick_least_loaded
from memprism_ray.testing.fake_vllm import fake_engine_factory


def alf(episode: str, goal: str = "put a mug in desk") -> PolicyInput:
    return PolicyInput(
        "alfworld", goal, "You see a desk 1.", admissible=("look", "go to desk 1"), meta={"episode_id": episode}
    )


# --- bookkeeping (no Ray) -------------------------------------------------------------------
def test_group_loads_claim_refuse_touch_release_and_expire() -> None:
    now = [0.0]
    loads = GroupLoads(ttl_s=10.0, clock=lambda: now[0])
    assert loads.claim("a", 16, seen_load=0) == (True, 16)
    # Another caller read load 0 before "a" was claimed: refused, told the current load.
    assert loads.claim("b", 8, seen_load=0) == (False, 16)
    assert loads.claim("b", 8, seen_load=16) == (True, 24)
    assert loads.claim("a", 16, seen_load=0) == (True, 24)  # a retry of a granted claim is idempotent
    assert loads.release("b") and not loads.release("b")
    assert loads.load() == 16
    now[0] = 11.0  # "a" sent nothing for longer than the TTL: its caller is gone
    assert loads.load() == 0
    loads.touch("a", 4)  # a request of a forgotten group (replica restarted) re-registers it
    assert loads.groups() == {"a": 4}
    with pytest.raises(ValueError, match="at least one request"):
        loads.claim("c", 0)


def test_pick_least_loaded_breaks_ties_from_the_offset() -> None:
    assert pick_least_loaded([16, 4, 8]) == 1
    assert pick_least_loaded([0, 0, 0], offset=2) == 2
    assert pick_least_loaded([5, 0, 0], offset=0) == 1
    assert pick_least_loaded([float("inf"), 3.0], offset=0) == 1
    with pytest.raises(RuntimeError, match="unreachable"):
        pick_least_loaded([float("inf")] * 2)


# --- replicas and routing on Ray -------------------------------------------------------------
VLLM_POLICY = PolicyConfig(backend="vllm", gpus_per_replica=1.0, vllm=VLLMConfig(chat_template="qwen2_vl"))


@pytest.fixture(scope="module")
def replicas(ray_session):
    from memprism_ray.actors.workers import PolicyReplica

    factory = functools.partial(fake_engine_factory, step_s=0.01, tokens=5)
    # The config asks for a GPU; these CPU replicas override only the resource request.
    handles = [PolicyReplica.options(num_cpus=0.01, max_concurrency=256).remote(VLLM_POLICY, factory) for _ in range(3)]
    ray_session.get([h.load.remote() for h in handles], timeout=120)
    yield handles
    for h in handles:
        ray_session.kill(h)


def _reset(ray, handles) -> None:
    for h in handles:
        for g in ray.get(h.stats.remote(), timeout=30)["groups"]:
            ray.get(h.release.remote(g), timeout=30)


@pytest.mark.ray
def test_callers_overlap_in_one_replica_engine(ray_session) -> None:
    from memprism_ray.actors.services import PolicyPool
    from memprism_ray.actors.workers import PolicyReplica

    ray = ray_session
    # Its own replica, whose engine takes its first step once 9 requests are queued (more than
    # one caller's 8): a replica serving callers one at a time never gets there and, after the
    # gate's 30 s, steps with one caller only; the callers' timing no longer decides.
    factory = functools.partial(fake_engine_factory, step_s=0.01, tokens=5, gate=9)
    one = [PolicyReplica.options(num_cpus=0.01, max_concurrency=256).remote(VLLM_POLICY, factory)]
    results: dict[int, list] = {}

    def caller(c: int) -> None:
        pool = PolicyPool(one, timeout_s=60, caller=f"worker{c}")
        results[c] = pool.act([alf(f"w{c}-e{i}") for i in range(8)], group=f"w{c}")

    try:
        threads = [threading.Thread(target=caller, args=(c,)) for c in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(o.valid for c in range(4) for o in results[c])
        record = ray.get(one[0].engine_record.remote(), timeout=30)
    finally:
        ray.kill(one[0])
    # Several rollout-worker-like callers ran in the same engine step of one replica.
    assert max(len(s) for s in record["steps"]) >= 2
    assert record["max_running"] > 8


@pytest.mark.ray
def test_a_group_sticks_to_one_replica_and_groups_balance_by_load(ray_session, replicas) -> None:
    from memprism_ray.actors.services import PolicyPool

    ray = ray_session
    _reset(ray, replicas)
    # Pre-existing load: 16, 4 and 8 requests per step.
    for h, n in zip(replicas, (16, 4, 8), strict=True):
        assert ray.get(h.claim.remote(f"pre{n}", n, 10**6), timeout=30)[0]
    pool = PolicyPool(replicas, timeout_s=60, caller="roll0")
    calls_before = [ray.get(h.stats.remote(), timeout=30)["calls"] for h in replicas]
    for _step in range(3):  # three decision steps of one group of 6 trajectories
        out = pool.act([alf(f"it0-g0-t{i}") for i in range(6)])
        assert all(o.valid for o in out)
    calls = [ray.get(h.stats.remote(), timeout=30)["calls"] - b for h, b in zip(replicas, calls_before, strict=True)]
    assert calls == [0, 3, 0]  # least loaded (4) took the group; every step went there
    assert ray.get(replicas[1].load.remote(), timeout=30) == 4 + 6
    # The next group of this caller releases the finished one and is claimed once.
    pool.act([alf(f"it1-g0-t{i}") for i in range(2)])
    groups = [ray.get(h.stats.remote(), timeout=30)["groups"] for h in replicas]
    assert not any("roll0:g0" in g for g in groups)
    assert [g.get("roll0:g1") for g in groups].count(2) == 1


@pytest.mark.ray
def test_simultaneous_new_groups_spread_evenly(ray_session, replicas) -> None:
    from memprism_ray.actors.services import PolicyPool

    ray = ray_session
    _reset(ray, replicas)
    chosen: dict[int, int] = {}
    barrier = threading.Barrier(6)

    def caller(c: int) -> None:
        pool = PolicyPool(replicas, timeout_s=60, caller=f"sim{c}")
        barrier.wait()
        chosen[c] = pool.assign(f"sim{c}-group", 8)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Six groups started at once on three idle replicas: two each, not a pile on one.
    assert sorted(ray.get([h.load.remote() for h in replicas], timeout=30)) == [16, 16, 16]
    assert sorted(chosen.values()) == [0, 0, 1, 1, 2, 2]


@pytest.mark.ray
def test_replica_failures_stay_per_request_and_ray_services_routes_through_the_pool(ray_session, replicas) -> None:
    from memprism_ray.actors.services import PolicyPool, RayServices

    services = RayServices([], 1, phi=None, views=None, policy=PolicyPool(replicas, 60), timeout_s=60)
    batch = [alf("f-0"), alf("f-1", goal="FAKE_REJECT"), alf("f-2", goal="FAKE_CRASH"), alf("f-3")]
    out = services.act(batch)
    assert out[0].valid and out[3].valid
    assert not out[1].valid and "rejected" in out[1].error
    assert isinstance(out[2], PolicyBackendError)


def _wait_dead(ray, handle, within_s: float = 30.0) -> None:
    """Fails unless the replica stops answering within ``within_s``: ``ray.kill`` is
    asynchronous, so a call sent right after it may still be answered (CI saw one)."""
    deadline = time.monotonic() + within_s
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            ray.get(handle.engine_record.remote(), timeout=within_s)
            time.sleep(0.2)


@pytest.mark.ray
def test_a_dead_replica_fails_only_its_groups(ray_session) -> None:
    from memprism_ray.actors.services import PolicyPool
    from memprism_ray.actors.workers import PolicyReplica

    ray = ray_session
    factory = functools.partial(fake_engine_factory, step_s=0.001, tokens=2)
    a, b = (PolicyReplica.options(num_cpus=0.01, max_restarts=0).remote(VLLM_POLICY, factory) for _ in range(2))
    pool = PolicyPool([a, b], timeout_s=30, caller="dead")
    assert all(o.valid for o in pool.act([alf("x")], group="ga"))
    assert all(o.valid for o in pool.act([alf("y")], group="gb"))
    dead = pool._group_replica["ga"]
    ray.kill([a, b][dead])
    _wait_dead(ray, [a, b][dead])
    out_a = pool.act([alf("x")], group="ga")
    out_b = pool.act([alf("y")], group="gb")
    assert isinstance(out_a[0], BaseException) and out_b[0].valid
    # The group's next step, and any new group, go to the live replica.
    assert pool.act([alf("x")], group="ga")[0].valid
    assert pool._group_replica["ga"] == 1 - dead
    assert pool.assign("gc", 1) == 1 - dead
    ray.kill([a, b][1 - dead])


@pytest.mark.ray
def test_stop_policy_replicas_stops_each_engine_before_the_kill(ray_session) -> None:
    from memprism_ray.actors.workers import PolicyReplica, stop_policy_replicas

    ray = ray_session
    factory = functools.partial(fake_engine_factory, step_s=0.001, tokens=2)
    live, dead = (PolicyReplica.options(num_cpus=0.01, max_restarts=0).remote(VLLM_POLICY, factory) for _ in range(2))
    ray.get([live.load.remote(), dead.load.remote()], timeout=60)
    assert ray.get(live.engine_record.remote(), timeout=60)["stopped"] is False
    assert ray.get(live.shutdown.remote(), timeout=60) is True
    assert ray.get(live.engine_record.remote(), timeout=60)["stopped"] is True
    ray.kill(dead)
    _wait_dead(ray, dead)  # else its shutdown call may still be answered, and counted
    # The dead replica cannot stop an engine and is not counted; both end up killed.
    assert stop_policy_replicas([live, dead], timeout_s=30) == 1
    _wait_dead(ray, live)


@pytest.mark.ray
@pytest.mark.slow
def test_d1_llm_teacher_labels_expert_decisions_on_the_pool(
    ray_session, memprism_tiny_corpus, memprism_tiny_overrides, tmp_path
) -> None:
    """The D1 stage of the paper preset: expert trajectories -> one LLM-teacher call per
    decision on the policy pool (a fake engine answering a fixed teacher JSON) -> labels."""
    import json as _json

    import pyarrow.parquet as pq

    from memprism_ray.actors.workers import PolicyReplica
    from memprism_ray.adapter.reference_table import load_expert_stream
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.benchmark.alfworld import list_games
    from memprism_ray.config import load_config
    from memprism_ray.testing.fake_vllm import marked_reply
    from memprism_ray.trainer.d1 import collect_reference, d1_cost_line, label_reference
    from memprism_ray.view_space import ViewAction

    overrides = memprism_tiny_overrides(memprism_tiny_corpus, tmp_path, "d1llm")
    cfg = load_config(
        "configs/local.yaml",
        [
            *overrides, "--label.teacher", "llm", "--label.llm.source", "pool", "--label.workers", "1",
            "--label.games", "1", "--policy.backend", "vllm", "--policy.num_replicas", "1",
            "--policy.gpus_per_replica", "1", "--policy.vllm.chat_template", "qwen2_vl",
            "--phi.kind", "llm", "--phi.llm_source", "pool",
        ],
    )  # fmt: skip
    item = {"a_view": {"tau": "EntityState", "window": "all", "filter": "all", "gamma": "medium"}, "score": 1.0}
    phi_answer = _json.dumps({"entity": "pool entity", "act_type": "other", "delta_s": []})
    # One engine serves the LLM Phi (expert streams re-extracted) and the view teacher.
    reply = functools.partial(
        marked_reply, (("You are phi", phi_answer),), _json.dumps({"teacher_distribution": [item]})
    )
    replica = PolicyReplica.options(num_cpus=0.01).remote(
        cfg.policy, functools.partial(fake_engine_factory, step_s=0.001, tokens=2, reply=reply)
    )
    lines: list[str] = []
    try:
        assert "1 policy call(s) per reference decision" in d1_cost_line(cfg, get_benchmark("alfworld"))
        games = list_games("train", cfg.corpus.data_root)[:1]
        (tmp_path / "d1").mkdir()
        expert = collect_reference(cfg, get_benchmark("alfworld"), games, [], tmp_path / "d1", lines.append, [replica])
        decisions = pq.read_table(expert).num_rows
        assert {e.entity for e in load_expert_stream(pq.read_table(expert), 0).events} == {"pool entity"}
        labels = label_reference(cfg, get_benchmark("alfworld"), expert, tmp_path / "d1", lines.append, pool=[replica])
        stats = ray_session.get(replica.stats.remote(), timeout=60)
    finally:
        ray_session.kill(replica)
    assert f"llm view labels for {decisions} decisions: {decisions} policy calls" in "\n".join(lines)
    assert stats["requests"] == 2 * decisions  # per decision one Phi and one teacher call, all on the pool
    q = pq.read_table(labels).column("q").to_pylist()
    assert len(q) == decisions
    best = ViewAction("EntityState", "all", "all", "medium").index
    assert all(row[best] == pytest.approx(1.0) for row in q)


@pytest.mark.ray
def test_pool_policy_is_a_task_policy_whose_caller_is_one_group(ray_session, replicas) -> None:
    """What EvalWorker and the counterfactual D1 task use instead of building an engine."""
    from memprism_ray.actors.services import PolicyPool, PoolPolicy
    from memprism_ray.policy.base import TaskPolicy

    _reset(ray_session, replicas)
    policy = PoolPolicy(PolicyPool(replicas, timeout_s=60, caller="eval-0"), "eval-0")
    assert isinstance(policy, TaskPolicy)
    for step in range(2):
        out = policy.act([alf(f"ep{i}-s{step}") for i in range(3)])  # new episode ids: still one group
        assert [o.action for o in out] == ["look"] * 3
    groups = [ray_session.get(h.stats.remote(), timeout=30)["groups"] for h in replicas]
    assert [g for g in groups if g] == [{"eval-0": 3}]


# --- issue 31: scheduler parity, the start-up line, the front end off the event loop ---------------
@pytest.mark.ray
def test_replica_engine_gets_the_explicit_scheduler_and_the_job_logs_it(ray_session, monkeypatch) -> None:
    """The engine kwargs the replica passes (the fake factory keeps what a vLLM engine would
    get) carry the LLM-class scheduler, and start_policy_replicas says so in one line."""
    import memprism_ray.cluster.placement as placement
    from memprism_ray.actors.workers import start_policy_replicas, stop_policy_replicas
    from memprism_ray.config import load_config

    cfg = load_config(
        "configs/local.yaml",
        ["--policy.backend", "vllm", "--policy.gpus_per_replica", "1", "--policy.num_replicas", "1",
         "--policy.vllm.frontend_threads", "2", "--policy.vllm.chat_template", "qwen2_vl"],
    )  # fmt: skip
    # A CPU test cluster has no GPU: place the replica on CPU, nothing else changes.
    monkeypatch.setattr(placement, "policy_replica_options", lambda cfg: {"num_cpus": 0.01, "max_concurrency": 64})
    lines: list[str] = []
    handles = start_policy_replicas(
        cfg,
        benchmark=get_benchmark(cfg.corpus.benchmark),
        engine_factory=functools.partial(fake_engine_factory, step_s=0.002, tokens=3),
        log=lines.append,
    )
    try:
        settings = ray_session.get(handles[0].engine_settings.remote(), timeout=30)
        assert settings["max_num_batched_tokens"] == 16384 and settings["max_num_seqs"] == 1024
        assert settings["source"] == "requested" and settings["frontend_threads"] == 2
        assert len(lines) == 1 and "max_num_batched_tokens 16384, max_num_seqs 1024" in lines[0]
        assert "prompt_layout paper" in lines[0] and "frontend_threads 2" in lines[0]
    finally:
        stop_policy_replicas(handles)


@pytest.mark.ray
def test_replica_decodes_view_pngs_in_its_front_end_threads(ray_session) -> None:
    from PIL import Image

    from memprism_ray.actors.services import PolicyPool
    from memprism_ray.actors.workers import PolicyReplica

    cfg = PolicyConfig(
        backend="vllm", gpus_per_replica=1.0, vllm=VLLMConfig(chat_template="qwen2_vl", frontend_threads=2)
    )
    factory = functools.partial(fake_engine_factory, step_s=0.002, tokens=3, preprocess_s=0.001)
    replica = PolicyReplica.options(num_cpus=0.01, max_concurrency=64).remote(cfg, factory)
    try:
        pool = PolicyPool([replica], timeout_s=60, caller="png")
        views = [Image.new("RGB", (64, 48), (i * 40, 0, 0)) for i in range(5)]
        batch = [
            PolicyInput("alfworld", "put a mug in desk", "You see a desk 1.", admissible=("look",), view_image=v)
            for v in views
        ]
        out = pool.act(batch, group="png")
        assert all(o.valid and o.visual_tokens > 0 for o in out)
        front = ray_session.get(replica.stats.remote(), timeout=30)["frontend"]
        assert front["decode_n"] == 5 and front["template_n"] == 5 and front["mm_preprocess_n"] == 5
        assert front["decode_s"] > 0 and front["mm_preprocess_s"] >= 5 * 0.001
        # The bench switches layout and threads on the running engine.
        got = ray_session.get(replica.configure_frontend.remote("instructions_first", 0), timeout=30)
        assert got == {"prompt_layout": "instructions_first", "frontend_threads": 0}
        assert all(o.valid for o in pool.act(batch, group="png"))
        assert ray_session.get(replica.stats.remote(), timeout=30)["frontend"]["decode_n"] == 10
    finally:
        ray_session.kill(replica)
