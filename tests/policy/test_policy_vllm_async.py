"""The task policy on vLLM's async engine (memprism_ray/policy/vllm_async.py), on a fake
engine with ``AsyncLLM.generate``'s contract (memprism_ray/policy/fake_vllm.py): one request
per decision, requests of several callers in the same engine steps, failures per request."""

from __future__ import annotations

import asyncio

from memprism_ray.policy.base import PolicyBackendError, PolicyInput
from memprism_ray.policy.config import VLLMConfig
from memprism_ray.policy.fake_vllm import FakeAsyncEngine
from memprism_ray.policy.vllm_async import AsyncVLLMPolicy


def alf(episode: str, goal: str = "put a mug in desk") -> PolicyInput:
    return PolicyInput(
        "alfworld", goal, "You see a desk 1.", admissible=("look", "go to desk 1"), meta={"episode_id": episode}
    )


def test_async_policy_requests_from_several_callers_share_engine_steps() -> None:
    engine = FakeAsyncEngine(step_s=0.005, tokens=6)
    policy = AsyncVLLMPolicy(VLLMConfig(), engine=engine, sampling_factory=dict)

    async def run() -> list[list]:
        return await asyncio.gather(
            *(policy.act([alf(f"c{c}-e{i}") for i in range(4)], tag=f"c{c}") for c in range(3))
        )

    results = asyncio.run(run())
    assert all(o.valid and o.action == "look" for batch in results for o in batch)
    # 12 requests of 3 callers were running in the same engine step: nothing waited its turn.
    assert engine.max_running == 12 and engine.overlapping_tags() == 3
    assert policy.in_flight == 0 and policy.counters["requests"] == 12


def test_async_policy_failures_stay_per_request() -> None:
    engine = FakeAsyncEngine(step_s=0.001, tokens=4)
    policy = AsyncVLLMPolicy(VLLMConfig(chat_template="qwen2_vl"), engine=engine, sampling_factory=dict)
    batch = [alf("ok-0"), alf("bad", goal="FAKE_REJECT"), alf("dead", goal="FAKE_CRASH"), alf("ok-1")]
    out = asyncio.run(policy.act(batch))
    assert out[0].valid and out[3].valid
    assert not out[1].valid and "vLLM rejected the request" in out[1].error
    assert isinstance(out[2], PolicyBackendError) and "fake engine step failed" in str(out[2])
    assert policy.counters == {"requests": 4, "rejected": 1, "engine_errors": 1}


def test_async_policy_complete_formats_one_user_message() -> None:
    seen: list[dict] = []

    def reply(prompt: dict) -> str:
        seen.append(prompt)
        return '{"teacher_distribution": []}'

    policy = AsyncVLLMPolicy(VLLMConfig(), engine=FakeAsyncEngine(reply=reply), sampling_factory=dict)
    text = asyncio.run(policy.complete("label this state", max_tokens=64))
    assert text == '{"teacher_distribution": []}'
    assert "<|im_start|>user\nlabel this state<|im_end|>" in seen[0]["prompt"]
    assert "multi_modal_data" not in seen[0]
