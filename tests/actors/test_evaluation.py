"""The evaluation actor (memprism_ray/actors/evaluation.py) with a model-backed task policy: it
decides through the policy pool (a fake engine with vLLM's AsyncLLM contract) and counts prompt
tokens with the task model's tokenizer, as the driver that labels the reports does."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray]


def test_a_pool_worker_counts_tokens_with_the_drivers_counter(
    ray_session, memprism_tiny_corpus: Path, tmp_path: Path
) -> None:
    """``agent.token_counter: task`` with a vllm policy: the worker holds a PoolPolicy, which
    names no model, yet counts with the configured task model's tokenizer (it used to build its
    counter from the PoolPolicy: the MiniLM fallback under ``auto``, and every episode crashed
    with "'task' needs a task model")."""
    from memprism_ray.actors.evaluation import EvalWorker, eval_token_counter
    from memprism_ray.actors.workers import PolicyReplica
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.config import load_config
    from memprism_ray.testing.dummy_qwen import build_dummy_qwen25vl
    from memprism_ray.testing.fake_vllm import fake_engine_factory

    model = build_dummy_qwen25vl(tmp_path / "qwen", size="tiny")  # a tokenizer available offline
    cfg = load_config(
        "configs/local.yaml",
        ["--corpus.data_root", str(memprism_tiny_corpus), "--eval.episodes", "1", "--eval.artifacts", "0",
         "--agent.max_steps", "2", "--grpo.max_steps", "2", "--agent.token_counter", "task",
         "--policy.backend", "vllm", "--policy.num_replicas", "1", "--policy.gpus_per_replica", "1",
         "--policy.vllm.chat_template", "qwen2_vl", "--policy.vllm.model", str(model),
         "--run.out_dir", str(tmp_path), "--run.name", "pool-tokens"],
    )  # fmt: skip
    plan = get_benchmark("alfworld").eval_plan(cfg)
    spec = {"episode_id": plan.specs[0].episode_id, "game": plan.specs[0].game.to_dict()}
    replica = PolicyReplica.options(num_cpus=0.01).remote(
        cfg.policy, functools.partial(fake_engine_factory, step_s=0.001, tokens=2)
    )
    worker = EvalWorker.options(num_cpus=0.1).remote(cfg, 1, None, [replica], "t0")
    try:
        ray_session.get(worker.start.remote(), timeout=120)
        results = ray_session.get(worker.play.remote("no_memory", [spec], None), timeout=120)
        counter = ray_session.get(worker.__ray_call__.remote(lambda self: self.tokens.name), timeout=60)
    finally:
        ray_session.kill(worker)
        ray_session.kill(replica)
    [result] = results
    assert result.status != "failed", result.error
    assert counter == eval_token_counter(cfg).name == f"{model} tokenizer (task model)"
