"""The task policy on vLLM's async engine (memprism_ray/policy/vllm_async.py), on a fake
engine with ``AsyncLLM.generate``'s contract (memprism_ray/testing/fake_vllm.py): one request
per decision, requests of several callers in the same engine steps, failures per request."""

from __future__ import annotations

import asyncio

import pytest

from memprism_ray.benchmark.alfworld.contract import ALFWORLD
from memprism_ray.policy.base import PolicyBackendError, PolicyInput
from memprism_ray.policy.config import VLLMConfig
from memprism_ray.policy.vllm_async import AsyncVLLMPolicy
from memprism_ray.testing.fake_vllm import FakeAsyncEngine


def alf(episode: str, goal: str = "put a mug in desk") -> PolicyInput:
    return PolicyInput(
        "alfworld", goal, "You see a desk 1.", admissible=("look", "go to desk 1"), meta={"episode_id": episode}
    )


def test_async_policy_requests_from_several_callers_share_engine_steps() -> None:
    engine = FakeAsyncEngine(step_s=0.005, tokens=6)
    policy = AsyncVLLMPolicy(VLLMConfig(), ALFWORLD, engine=engine, sampling_factory=dict)

    async def run() -> list[list]:
        return await asyncio.gather(*(policy.act([alf(f"c{c}-e{i}") for i in range(4)], tag=f"c{c}") for c in range(3)))

    results = asyncio.run(run())
    assert all(o.valid and o.action == "look" for batch in results for o in batch)
    # 12 requests of 3 callers were running in the same engine step: nothing waited its turn.
    assert engine.max_running == 12 and engine.overlapping_tags() == 3
    assert policy.in_flight == 0 and policy.counters["requests"] == 12


def test_async_policy_failures_stay_per_request() -> None:
    engine = FakeAsyncEngine(step_s=0.001, tokens=4)
    policy = AsyncVLLMPolicy(VLLMConfig(chat_template="qwen2_vl"), ALFWORLD, engine=engine, sampling_factory=dict)
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

    policy = AsyncVLLMPolicy(VLLMConfig(), ALFWORLD, engine=FakeAsyncEngine(reply=reply), sampling_factory=dict)
    text = asyncio.run(policy.complete("label this state", max_tokens=64))
    assert text == '{"teacher_distribution": []}'
    assert "<|im_start|>user\nlabel this state<|im_end|>" in seen[0]["prompt"]
    assert "multi_modal_data" not in seen[0]


def _front_end_run(threads: int, layout: str = "paper") -> tuple[AsyncVLLMPolicy, list, list[str], set[str]]:
    from PIL import Image

    prompts: list[str] = []
    engine = FakeAsyncEngine(
        step_s=0.001,
        tokens=3,
        preprocess_s=0.002,
        reply=lambda p: prompts.append(p["prompt"]) or "<action>look</action>",
    )
    policy = AsyncVLLMPolicy(
        VLLMConfig(chat_template="qwen2_vl", frontend_threads=threads),
        ALFWORLD,
        engine=engine,
        sampling_factory=dict,
        prompt_layout=layout,
    )
    threads_seen: set[str] = set()
    inner = policy._format

    def format_chat(messages):
        import threading

        threads_seen.add(threading.current_thread().name)
        return inner(messages)

    policy._format = format_chat
    batch = [
        PolicyInput(
            "alfworld",
            "put a mug in desk",
            f"You see a desk {i}.",
            admissible=("look",),
            view_image=Image.new("RGB", (56, 56)),
        )
        for i in range(6)
    ]
    out = asyncio.run(policy.act(batch))
    return policy, out, prompts, threads_seen


def test_threaded_front_end_builds_the_same_prompts_off_the_event_loop() -> None:
    """vllm.frontend_threads > 0: chat templating runs in the policy's thread pool; prompts and
    answers are those of the inline path, and every front-end stage is timed."""
    inline, out0, prompts0, seen0 = _front_end_run(0)
    threaded, out2, prompts2, seen2 = _front_end_run(2)
    assert sorted(prompts0) == sorted(prompts2) and len(prompts0) == 6
    assert [o.action for o in out0] == [o.action for o in out2] == ["look"] * 6
    assert seen0 == {"MainThread"} and seen2 and all(n.startswith("memprism-frontend") for n in seen2)
    for policy in (inline, threaded):
        f = policy.frontend
        assert f["template_n"] == 6 and f["mm_preprocess_n"] == 6  # the engine's input processing, timed
        assert f["mm_preprocess_s"] >= 6 * 0.002 and f["template_s"] > 0
    threaded.shutdown()


def test_configure_switches_layout_and_threads_on_a_running_policy() -> None:
    policy, _, prompts, _ = _front_end_run(0, layout="instructions_first")
    assert all(p.index("You are an expert agent") < p.index("<|vision_start|>") for p in prompts)
    assert policy.configure(prompt_layout="paper", frontend_threads=3) == {
        "prompt_layout": "paper",
        "frontend_threads": 3,
    }
    with pytest.raises(ValueError, match="prompt_layout must be one of"):
        policy.configure(prompt_layout="sideways")
    policy.shutdown()


def test_a_call_can_ask_for_fewer_completion_tokens() -> None:
    """The bench's decode probe: ``act(..., max_tokens=n)`` overrides the config for one call."""
    engine = FakeAsyncEngine(step_s=0.001, tokens=6)
    policy = AsyncVLLMPolicy(
        VLLMConfig(chat_template="qwen2_vl", max_tokens=6), ALFWORLD, engine=engine, sampling_factory=dict
    )
    assert [o.completion_tokens for o in asyncio.run(policy.act([alf("a"), alf("b")], max_tokens=2))] == [2, 2]
    assert [o.completion_tokens for o in asyncio.run(policy.act([alf("c")]))] == [6]
