"""PhiWorker serves both Phi kinds (docs/phi.md): the rule Phi by default, and with
``phi.kind: llm`` an LLM Phi over it, here against a local OpenAI-compatible server."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from memprism_ray.benchmark import get_benchmark

pytestmark = [pytest.mark.ray, pytest.mark.slow]

_spec = importlib.util.spec_from_file_location(
    "phi_stub_server", Path(__file__).resolve().parents[1] / "recorder" / "phi" / "phi_stub_server.py"
)
stub = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stub)


def test_phi_worker_rules_by_default_and_llm_when_configured(ray_session) -> None:
    ray = ray_session
    from memprism_ray.actors.workers import PhiWorker
    from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
    from memprism_ray.recorder import RawEvent, StateDelta
    from memprism_ray.recorder.phi.base import Extraction
    from memprism_ray.recorder.phi.config import PhiConfig

    raws = [
        RawEvent("MODE=valid room", "go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."),
        RawEvent("MODE=malformed room", "go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."),
        RawEvent("MODE=valid room", "open drawer 1", "Nothing happens."),
    ]
    states = [{}, {}, {}]
    with stub.PhiStubServer() as srv:
        cfg = PhiConfig(kind="llm", model="stub", base_url=srv.base_url, max_retries=0, timeout_s=10.0)
        rules = PhiWorker.options(num_cpus=0.05).remote(get_benchmark("alfworld"))
        llm = PhiWorker.options(num_cpus=0.05).remote(get_benchmark("alfworld"), cfg)
        try:
            got_rules = ray.get(rules.extract.remote(raws, states), timeout=120)
            got_llm = ray.get(llm.extract.remote(raws, states), timeout=120)
            rule_stats = ray.get(rules.stats.remote(), timeout=60)
            llm_stats = ray.get(llm.stats.remote(), timeout=60)
        finally:
            ray.kill(rules)
            ray.kill(llm)
    assert got_rules == [AlfworldPhi().extract(r, s) for r, s in zip(raws, states, strict=True)]
    assert rule_stats == {"phi": "alfworld-rule"}
    assert all(isinstance(x, Extraction) for x in got_llm)
    assert got_llm[0].delta == (StateDelta("location", "drawer 1"), StateDelta("drawer 1", "closed"))
    assert got_llm[0].evidence["phi"] == "llm"
    fields = ("entity", "act", "delta", "failed", "outcome")
    assert [getattr(got_llm[1], f) for f in fields] == [getattr(got_rules[1], f) for f in fields]
    assert got_llm[1].evidence["phi_fallback"].startswith("invalid answer: malformed JSON")
    assert got_llm[2].failed and got_llm[2].delta == ()
    assert llm_stats["phi"] == "alfworld-llm"
    assert (llm_stats["events"], llm_stats["llm"], llm_stats["fallback_invalid"]) == (3, 2, 1)
    assert llm_stats["backend_prompt_tokens"] == 3 * stub.PROMPT_TOKENS
    assert len(srv.bodies) == 3


def test_phi_worker_on_the_policy_pool(ray_session) -> None:
    """phi.llm_source: pool: the Phi prompts go to a policy replica (a fake engine with vLLM's
    AsyncLLM contract) as one group; the hard evidence still comes from the rules."""
    import functools
    import json

    ray = ray_session
    from memprism_ray.actors.workers import PhiWorker, PolicyReplica
    from memprism_ray.config import load_config
    from memprism_ray.recorder import RawEvent, StateDelta
    from memprism_ray.testing.fake_vllm import fake_engine_factory, fixed_reply

    cfg = load_config(
        "configs/local.yaml",
        [
            "--phi.kind", "llm", "--phi.llm_source", "pool", "--policy.backend", "vllm",
            "--policy.num_replicas", "1", "--policy.gpus_per_replica", "1", "--policy.vllm.chat_template", "qwen2_vl",
        ],
    )  # fmt: skip
    answer = {"entity": "drawer 1", "act_type": "go", "delta_s": [{"key": "location", "new_value": "drawer 1"}]}
    reply = functools.partial(fixed_reply, json.dumps(answer))
    replica = PolicyReplica.options(num_cpus=0.01).remote(
        cfg.policy, functools.partial(fake_engine_factory, step_s=0.001, tokens=2, reply=reply)
    )
    raws = [
        RawEvent("room", "go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."),
        RawEvent("room", "open drawer 1", "Nothing happens."),
    ]
    worker = PhiWorker.options(num_cpus=0.05).remote(get_benchmark("alfworld"), cfg.phi, [replica], "phi-0", 60.0)
    try:
        got = ray.get(worker.extract.remote(raws, [{}, {}]), timeout=120)
        stats = ray.get(replica.stats.remote(), timeout=60)
        phi_stats = ray.get(worker.stats.remote(), timeout=60)
    finally:
        ray.kill(worker)
        ray.kill(replica)
    assert got[0].evidence["phi"] == "llm" and got[0].delta == (StateDelta("location", "drawer 1"),)
    assert got[1].failed and got[1].delta == ()  # the engine's failure language, kept by the rules
    assert stats["requests"] == 2
    assert phi_stats["llm"] == 2 and phi_stats["fallback"] == 0


def test_phi_on_the_pool_needs_the_vllm_backend_and_replicas() -> None:
    from memprism_ray.actors.services import build_actor_phi
    from memprism_ray.config import load_config
    from memprism_ray.recorder.phi.config import PhiConfig

    with pytest.raises(ValueError, match=r"phi\.llm_source=pool .* policy\.backend is 'scripted'"):
        load_config("configs/local.yaml", ["--phi.kind", "llm", "--phi.llm_source", "pool"])
    with pytest.raises(ValueError, match="started without policy replicas"):
        build_actor_phi(get_benchmark("alfworld"), PhiConfig(kind="llm", llm_source="pool"), [], key="phi-3")
