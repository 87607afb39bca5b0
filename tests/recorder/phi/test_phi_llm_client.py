"""The Phi completion backends against a local OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import base64
import io

import pytest
from phi_stub_server import COMPLETION_TOKENS, PROMPT_TOKENS, PhiStubServer

from memprism_ray.llm_client import LLMError, LLMReplyError, LLMUnavailable
from memprism_ray.recorder.phi.config import PhiConfig
from memprism_ray.recorder.phi.llm_client import PhiEndpoint, PoolComplete


def png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


def cfg(url: str, **kw) -> PhiConfig:
    base = {"kind": "llm", "model": "stub-model", "base_url": url, "backoff_s": 0.0, "timeout_s": 5.0}
    return PhiConfig(**{**base, **kw})


def test_batch_answers_in_order_with_failures_as_values_and_token_counts() -> None:
    with PhiStubServer() as srv:
        client = PhiEndpoint(cfg(srv.base_url, max_retries=1))
        out = client([("MODE=valid a", []), ("MODE=down b", []), ("MODE=prose c", []), ("MODE=valid d", [])])
    assert isinstance(out[1], LLMUnavailable) and "failed 2 time(s); last error: HTTP 503" in str(out[1])
    assert '"entity": "drawer 1"' in out[0] and out[0] == out[3]
    assert out[2].startswith("Sure, here is the event:")
    c = client.counters
    # 3 answered; the 503 prompt was tried twice (1 retry) and given up
    assert c["requests"] == 5 and c["retries"] == 1 and c["failures"] == 1
    assert c["prompt_tokens"] == 3 * PROMPT_TOKENS and c["completion_tokens"] == 3 * COMPLETION_TOKENS
    assert srv.bodies[0]["model"] == "stub-model" and srv.bodies[0]["temperature"] == 0.0
    assert sorted(b["messages"][0]["content"] for b in srv.bodies if "down" not in b["messages"][0]["content"]) == [
        "MODE=prose c",
        "MODE=valid a",
        "MODE=valid d",
    ]


def test_a_500_is_retried_then_answered() -> None:
    with PhiStubServer() as srv:
        client = PhiEndpoint(cfg(srv.base_url, max_retries=2))
        (out,) = client([("MODE=flaky once", [])])
    assert '"act_type": "go"' in out
    assert client.counters["requests"] == 2 and client.counters["retries"] == 1 and client.counters["failures"] == 0


def test_no_retries_means_one_attempt() -> None:
    with PhiStubServer() as srv:
        client = PhiEndpoint(cfg(srv.base_url, max_retries=0))
        (out,) = client([("MODE=flaky once", [])])
    assert isinstance(out, LLMUnavailable) and "HTTP 500" in str(out)
    assert client.counters["requests"] == 1


def test_timeout_is_bounded_and_reported() -> None:
    with PhiStubServer(slow_s=2.0) as srv:
        client = PhiEndpoint(cfg(srv.base_url, max_retries=1, timeout_s=0.3))
        (out,) = client([("MODE=slow x", [])])
    assert isinstance(out, LLMUnavailable) and "timeout after 0.3s" in str(out)
    assert client.counters["requests"] == 2 and client.counters["failures"] == 1


def test_unreachable_endpoint_is_a_request_error() -> None:
    client = PhiEndpoint(cfg("http://127.0.0.1:9/v1", max_retries=1, timeout_s=1.0))
    (out,) = client([("hello", [])])
    assert isinstance(out, LLMUnavailable) and "transport error" in str(out)


def test_requests_run_concurrently_up_to_the_bound() -> None:
    with PhiStubServer(delay_s=0.2) as srv:
        client = PhiEndpoint(cfg(srv.base_url, concurrency=3))
        out = client([(f"MODE=valid {i}", []) for i in range(7)])
    assert all(isinstance(x, str) for x in out)
    assert srv.max_active == 3


def test_images_travel_as_base64_png_parts_and_non_png_fails_that_request() -> None:
    image = png()
    with PhiStubServer() as srv:
        client = PhiEndpoint(cfg(srv.base_url))
        out = client([("MODE=valid look", [image]), ("MODE=valid bad", [b"GIF89a..."])])
    assert isinstance(out[0], str)
    assert isinstance(out[1], ValueError) and "not PNG bytes" in str(out[1])
    assert len(srv.bodies) == 1  # the bad one never left this process
    parts = srv.bodies[0]["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "MODE=valid look"}
    url = parts[1]["image_url"]["url"]
    assert parts[1]["type"] == "image_url" and url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == image


def test_api_key_is_sent_as_bearer(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers.get("authorization")
        return httpx.Response(200, json={"choices": [{"message": {"content": "{}"}}]})

    monkeypatch.setenv("PHI_TEST_KEY", "sekret")
    client = PhiEndpoint(cfg("http://stub/v1", api_key_env="PHI_TEST_KEY"), transport=httpx.MockTransport(handler))
    assert client([("p", [])]) == ["{}"]
    assert seen["auth"] == "Bearer sekret"
    assert client.counters["no_usage"] == 1 and client.counters["prompt_tokens"] == 0


def test_retry_after_is_honoured_and_tokens_counted_like_every_endpoint_user() -> None:
    """The Phi shares the one client (memprism_ray/llm_client.py): a 503's Retry-After is waited
    for even with no backoff of its own (the old Phi client retried at once)."""
    import time

    import httpx

    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(time.monotonic())
        if len(seen) == 1:
            return httpx.Response(503, headers={"Retry-After": "0.3"}, text="busy")
        return httpx.Response(200, json={"choices": [{"message": {"content": "{}"}}], "usage": USAGE})

    USAGE = {"prompt_tokens": 7, "completion_tokens": 2}
    client = PhiEndpoint(cfg("http://stub/v1", max_retries=1), transport=httpx.MockTransport(handler))
    assert client([("p", [])]) == ["{}"]
    assert seen[1] - seen[0] >= 0.3
    assert dict(client.counters) == {
        "requests": 2,
        "retries": 1,
        "failures": 0,
        "prompt_tokens": 7,
        "completion_tokens": 2,
        "no_usage": 0,
    }


def test_a_reply_that_is_not_a_chat_completion_fails_that_request() -> None:
    import httpx

    client = PhiEndpoint(
        cfg("http://stub/v1"), transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"text": "hi"}))
    )
    (out,) = client([("p", [])])
    assert isinstance(out, LLMReplyError) and "not an OpenAI chat completion" in str(out)


def test_pool_complete_is_text_only_and_keeps_order() -> None:
    calls = []

    def texts(prompts: list[str]) -> list[object]:
        calls.append(list(prompts))
        return [RuntimeError("engine died") if p == "boom" else p.upper() for p in prompts]

    complete = PoolComplete(texts)
    out = complete([("a", []), ("img", [png()]), ("boom", []), ("b", [])])
    assert out[0] == "A" and out[3] == "B"
    assert isinstance(out[1], ValueError) and "text only" in str(out[1])
    assert isinstance(out[2], RuntimeError)
    assert calls == [["a", "boom", "b"]]  # one batched call, images never sent
    # the image request is a failure too, counted like every endpoint user counts (memprism_ray/llm_client.py)
    assert (complete.counters["requests"], complete.counters["failures"]) == (3, 2)


def test_pool_complete_turns_a_short_answer_or_a_raise_into_errors() -> None:
    short = PoolComplete(lambda ps: ["x"])
    out = short([("a", []), ("b", [])])
    assert all(isinstance(x, LLMError) and "1 completion(s) for 2" in str(x) for x in out)

    def boom(ps: list[str]) -> list[str]:
        raise ConnectionError("replica gone")

    out = PoolComplete(boom)([("a", [])])
    assert isinstance(out[0], LLMError) and "replica gone" in str(out[0])


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"kind": "neural"}, "phi.kind must be one of rules, llm"),
        ({"llm_source": "cloud"}, "phi.llm_source must be one of endpoint, pool"),
        ({"base_url": "127.0.0.1:8000"}, "phi.base_url must start with http"),
        ({"max_tokens": 0}, "phi.max_tokens must be >= 1"),
        ({"concurrency": 0}, "phi.concurrency must be >= 1"),
        ({"timeout_s": 0.0}, "phi.timeout_s must be"),
        ({"max_retries": -1}, "phi.max_retries must be >= 0"),
        ({"backoff_s": 30.0}, "phi: need 0 <= backoff_s <= max_backoff_s"),
        ({"temperature": -0.5}, "phi.temperature"),
        ({"kind": "llm", "model": ""}, "phi.kind=llm needs phi.model"),
    ],
)
def test_config_rejects_bad_values(kw: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
        PhiConfig(**kw)


def test_config_defaults_to_rules_and_loads_through_the_experiment_config() -> None:
    from memprism_ray.config import load_config

    assert PhiConfig().kind == "rules"
    c = load_config(None, ["--phi.kind", "llm", "--phi.model", "qwen", "--phi.concurrency", "4"])
    assert (c.phi.kind, c.phi.model, c.phi.concurrency) == ("llm", "qwen", 4)
    # the pool serves the model: no model name needed, but the pool must run vLLM
    assert PhiConfig(kind="llm", llm_source="pool").model == ""
    with pytest.raises(ValueError, match=r"phi\.llm_source=pool .*policy\.backend"):
        load_config(None, ["--phi.kind", "llm", "--phi.llm_source", "pool"])
