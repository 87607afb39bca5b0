"""The workers that decide through the policy pool (memprism_ray/actors/evaluation.py's
EvalWorker, memprism_ray/actors/rollout.py's RolloutWorker) with a model-backed task policy (a
fake engine with vLLM's AsyncLLM contract): they count prompt tokens with the configured task
model's tokenizer, as the driver that labels the reports does (services.task_token_counter)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from memprism_ray.benchmark import get_benchmark

pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module")
def pool(ray_session, memprism_tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory):
    """``agent.token_counter: task`` with a vllm policy of a dummy Qwen2.5-VL (a tokenizer
    available offline) and one fake-engine replica."""
    from memprism_ray.actors.workers import PolicyReplica
    from memprism_ray.config import load_config
    from memprism_ray.testing.dummy_qwen import build_dummy_qwen25vl
    from memprism_ray.testing.fake_vllm import fake_engine_factory

    tmp = tmp_path_factory.mktemp("pool-tokens")
    model = build_dummy_qwen25vl(tmp / "qwen", size="tiny")
    cfg = load_config(
        "configs/local.yaml",
        ["--corpus.data_root", str(memprism_tiny_corpus), "--eval.episodes", "1", "--eval.artifacts", "0",
         "--agent.max_steps", "2", "--grpo.group_size", "2",
         "--agent.token_counter", "task",
         "--policy.backend", "vllm", "--policy.num_replicas", "1", "--policy.gpus_per_replica", "1",
         "--policy.vllm.chat_template", "qwen2_vl", "--policy.vllm.model", str(model),
         "--run.out_dir", str(tmp), "--run.name", "pool-tokens"],
    )  # fmt: skip
    replica = PolicyReplica.options(num_cpus=0.01).remote(
        cfg.policy, functools.partial(fake_engine_factory, step_s=0.001, tokens=2)
    )
    yield cfg, replica, f"{model} tokenizer (task model)"
    ray_session.kill(replica)


def test_an_eval_worker_counts_tokens_with_the_drivers_counter(ray_session, pool) -> None:
    """The EvalWorker holds a PoolPolicy, which names no model, yet counts with the configured
    task model's tokenizer (it used to build its counter from the PoolPolicy: the MiniLM
    fallback under ``auto``, and every episode crashed with "'task' needs a task model")."""
    from memprism_ray.actors.evaluation import EvalWorker
    from memprism_ray.actors.services import task_token_counter
    from memprism_ray.benchmark import get_benchmark

    cfg, replica, name = pool
    plan = get_benchmark("alfworld").eval_plan(cfg)
    spec = {"episode_id": plan.specs[0].episode_id, "game": plan.specs[0].game.to_dict()}
    worker = EvalWorker.options(num_cpus=0.1).remote(
        cfg, 1, None, [replica], "t0", benchmark=get_benchmark(cfg.corpus.benchmark)
    )
    try:
        ray_session.get(worker.start.remote(), timeout=120)
        results = ray_session.get(worker.play.remote("no_memory", [spec], None), timeout=120)
        counter = ray_session.get(worker.__ray_call__.remote(lambda self: self.tokens.name), timeout=60)
    finally:
        ray_session.kill(worker)
    [result] = results
    assert result.status != "failed", result.error
    assert counter == task_token_counter(cfg).name == name


def test_a_rollout_worker_counts_tokens_with_the_task_models_tokenizer(ray_session, pool) -> None:
    """The RolloutWorker decides through a PolicyPool, which names no model either: the same
    counter, so a group plays under ``task`` (it crashed every trajectory before)."""
    from memprism_ray.actors.learner import state_to_numpy
    from memprism_ray.actors.rollout import RolloutWorker
    from memprism_ray.benchmark.alfworld import list_games
    from memprism_ray.router.model import ViewPolicyModel
    from memprism_ray.trainer.rollouts import sample_groups

    cfg, replica, name = pool
    full = ray_session.put(state_to_numpy(ViewPolicyModel(cfg.router).state_dict()))
    spec = sample_groups(list_games("train", cfg.corpus.data_root), cfg, 0)[0]
    worker = RolloutWorker.options(num_cpus=0.1).remote(
        cfg, 0, full, [], [], [replica], False, "t0", benchmark=get_benchmark(cfg.corpus.benchmark)
    )
    try:
        summary = ray_session.get(worker.run_group.remote(spec, None, 0)[0], timeout=300)
        counter = ray_session.get(worker.__ray_call__.remote(lambda self: self.tokens.name), timeout=60)
    finally:
        ray_session.kill(worker)
    assert [e["status"] for e in summary.episodes] == ["ok"] * len(spec.episode_ids), summary.episodes
    assert summary.num_steps > 0
    assert counter == name
