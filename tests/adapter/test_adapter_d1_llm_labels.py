"""D1 with the LLM view teacher (appendix D.2): one teacher call per decision, against a
local OpenAI-compatible stub server on 127.0.0.1 and against the Ray policy pool."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time

import numpy as np
import pytest
from json_endpoint import Reply, Request, chat_reply, json_endpoint

from memprism_ray.adapter.d1_labels import label_states_llm, llm_labels, policy_calls
from memprism_ray.recorder import EventStream, RawEvent, StateDelta
from memprism_ray.router.encoder import HashingEncoder
from memprism_ray.router.features import FeatureExtractor
from memprism_ray.router.teacher import LLMTeacherConfig, LLMViewTeacher, TeacherResponseError, decision_states
from memprism_ray.view_space import ViewAction

ENTITY = ViewAction("EntityState", "all", "all", "medium").index
TRACE = ViewAction("TemporalTrace", "recent_short", "all", "fine").index


def stream() -> EventStream:
    s = EventStream({"goal": "put a clean mug in cabinet", "task_id": "t1"})
    steps = [
        ("go to countertop 1", "countertop 1", [("agent.location", "countertop 1")]),
        ("take mug 1 from countertop 1", "mug 1", [("agent.holding", "mug 1")]),
        ("go to sinkbasin 1", "sinkbasin 1", [("agent.location", "sinkbasin 1")]),
        ("clean mug 1 with sinkbasin 1", "mug 1", [("mug 1.state", "clean")]),
        ("go to cabinet 1", "cabinet 1", [("agent.location", "cabinet 1")]),
        ("open cabinet 1", "cabinet 1", [("cabinet 1.state", "open")]),
    ]
    for i, (action, entity, delta) in enumerate(steps):
        s.record(
            RawEvent(f"Step {i}: near {entity}.", action, "OK"),
            entity=entity,
            act=action.split()[0],
            delta=[StateDelta(k, v) for k, v in delta],
        )
    return s


def teacher_json(view: str, score: float = 1.0) -> str:
    tau, window, flt, gamma = view.split("|")
    item = {"a_view": {"tau": tau, "window": window, "filter": flt, "gamma": gamma}, "score": score}
    return json.dumps({"teacher_distribution": [item]})


class StubServer:
    """OpenAI-compatible /v1/chat/completions on 127.0.0.1: the label depends on the
    reference action in the prompt; 'clean' decisions get a reply with no JSON."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.prompts: list[str] = []
        self.active = 0
        self.max_active = 0
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self._served = contextlib.ExitStack()
        self.url = self._served.enter_context(json_endpoint(self))

    def __call__(self, request: Request) -> Reply:
        prompt = request.json()["messages"][0]["content"]
        with self.lock:
            self.prompts.append(prompt)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(self.delay_s)
        ref = prompt[prompt.index("reference_next_action") :]
        if '"clean mug 1 with sinkbasin 1"' in ref[:400]:
            content = "I cannot decide."
        elif '"go to' in ref[:400]:
            content = teacher_json("TemporalTrace|recent_short|all|fine")
        else:
            content = "```json\n" + teacher_json("EntityState|all|all|medium", 3.0) + "\n```"
        with self.lock:
            self.active -= 1
        return 200, chat_reply(content)

    def close(self) -> None:
        self._served.close()


def test_policy_call_counts() -> None:
    assert policy_calls("llm", 1200) == 1200
    assert policy_calls("counterfactual", 1200, samples_per_view=2) == 1200 * 144 * 2
    with pytest.raises(ValueError, match="unknown view teacher"):
        policy_calls("oracle", 1)


def test_llm_teacher_labels_every_decision_with_one_concurrent_call_against_a_stub_server() -> None:
    states = decision_states(stream())
    server = StubServer()
    try:
        cfg = LLMTeacherConfig(base_url=server.url, model="stub", top_k=5, timeout_s=10, concurrency=4)
        with LLMViewTeacher(cfg) as teacher:
            data, counts = llm_labels(states, FeatureExtractor(HashingEncoder()), teacher)
    finally:
        server.close()
    assert counts["teacher_calls"] == len(states) == len(server.prompts) == 6  # one call per decision
    assert server.max_active >= 2  # requests went out concurrently
    assert all(p.startswith("You are a view teacher for MemPrism.") for p in server.prompts)
    # The unparseable reply is counted and its decision skipped, never guessed.
    assert counts["response_error"] == 1 and counts["teacher_error"] == 1 and counts["labelled"] == 5
    assert len(data) == 5
    refs = [s.reference_action for s in states if s.reference_action != "clean mug 1 with sinkbasin 1"]
    for q, ref in zip(data.q, refs, strict=True):
        want = TRACE if ref.startswith("go to") else ENTITY
        assert int(np.argmax(q)) == want and q[want] == pytest.approx(1.0)


def test_request_failures_are_counted_per_decision() -> None:
    states = decision_states(stream())[:3]
    cfg = LLMTeacherConfig(base_url="http://127.0.0.1:9/v1", model="stub", concurrency=16)
    with LLMViewTeacher(cfg) as teacher:
        replies = [RuntimeError("replica died"), teacher_json("EntityState|all|all|medium"), "no json"]
        labels, counts = label_states_llm(states, teacher, complete_many=lambda prompts, **_: replies[: len(prompts)])
    assert counts == {"teacher_calls": 3, "request_error": 1, "response_error": 1}
    assert "replica died" in str(labels[states[0].sample_id])
    assert isinstance(labels[states[2].sample_id], TeacherResponseError)
    assert int(np.argmax(labels[states[1].sample_id].distribution)) == ENTITY


@pytest.mark.ray
def test_llm_teacher_served_by_the_policy_pool(ray_session) -> None:
    """label.llm.source: pool — the teacher prompt runs on a replica's (fake) async engine, with the
    teacher's decoding settings."""
    from memprism_ray.actors.services import PolicyPool
    from memprism_ray.actors.workers import PolicyReplica
    from memprism_ray.policy.config import PolicyConfig, VLLMConfig
    from memprism_ray.testing.fake_vllm import fake_engine_factory, fixed_reply

    factory = functools.partial(
        fake_engine_factory, reply=functools.partial(fixed_reply, teacher_json("EntityState|all|all|medium"))
    )
    policy = PolicyConfig(backend="vllm", gpus_per_replica=1.0, vllm=VLLMConfig(chat_template="qwen2_vl"))
    replica = PolicyReplica.options(num_cpus=0.01).remote(policy, factory)
    try:
        pool = PolicyPool([replica], timeout_s=60, caller="d1-0")
        states = decision_states(stream())
        with LLMViewTeacher(LLMTeacherConfig(model="policy-pool", max_tokens=256, concurrency=8)) as teacher:
            data, counts = llm_labels(
                states,
                FeatureExtractor(HashingEncoder()),
                teacher,
                complete_many=functools.partial(pool.complete, group="d1-0"),
            )
        stats = ray_session.get(replica.stats.remote(), timeout=30)
    finally:
        ray_session.kill(replica)
    assert counts["teacher_calls"] == 6 and counts["labelled"] == 6
    assert stats["requests"] == 6 and stats["max_in_flight"] == 6  # the 6 teacher requests ran at once
    assert all(int(np.argmax(q)) == ENTITY for q in data.q)
