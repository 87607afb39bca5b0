"""The one OpenAI-compatible client (memprism_ray/llm_client.py) against a scripted stub server
on 127.0.0.1: Retry-After honoured and capped, bounded retries, a 4xx final at once, and
every attempt, retry, failure and token counted in one place."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from json_endpoint import Reply, Request, json_endpoint

from memprism_ray.llm_client import (
    ChatClient,
    EndpointConfig,
    LLMRefused,
    LLMReplyError,
    LLMUnavailable,
    map_concurrent,
    user_content,
)

OK = {
    "choices": [{"message": {"role": "assistant", "content": "hello"}}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 3},
}


class Stub:
    """Answers the i-th request with ``script[i]`` (status, headers, body); the last entry
    repeats. Every request body and header set is kept; at most ``limit`` are served."""

    def __init__(self, script: list[tuple[int, dict[str, str], Any]], limit: int = 50) -> None:
        self.script = script
        self.limit = limit
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, request: Request) -> Reply:
        with self.lock:
            n = len(self.bodies)
            self.bodies.append(request.json())
            self.headers.append(request.headers)
        if n >= self.limit:  # a runaway client: refuse rather than loop forever
            return 418, {"error": "request limit reached"}
        status, headers, reply = self.script[min(n, len(self.script) - 1)]
        return status, reply, headers


@pytest.fixture
def serve() -> Iterator[Any]:
    with contextlib.ExitStack() as servers:

        def start(*script: tuple[int, dict[str, str], Any]) -> tuple[Stub, str]:
            stub = Stub(list(script))
            return stub, servers.enter_context(json_endpoint(stub))

        yield start


def client(url: str, delays: list[float], **kw: Any) -> ChatClient:
    cfg = EndpointConfig(**{"base_url": url, "model": "m", "timeout_s": 5.0, **kw})
    return ChatClient(cfg, sleep=delays.append)


def test_retry_after_in_seconds_is_honoured_over_the_backoff(serve) -> None:
    stub, url = serve((503, {"Retry-After": "2"}, {"error": "busy"}), (429, {}, {"error": "slow down"}), (200, {}, OK))
    delays: list[float] = []
    with client(url, delays, backoff_s=0.25, max_backoff_s=10.0, max_retries=3) as c:
        reply = c.chat([{"role": "user", "content": "hi"}])
    assert reply.text == "hello" and reply.usage == (11, 3) and len(stub.bodies) == 3
    # 2 s asked for (longer than the 0.25 s backoff), then the backoff doubled with no header
    assert delays == [2.0, 0.5]
    assert dict(c.counters) == {
        "requests": 3,
        "retries": 2,
        "failures": 0,
        "prompt_tokens": 11,
        "completion_tokens": 3,
        "no_usage": 0,
    }


def test_retry_after_and_backoff_are_capped(serve) -> None:
    _, url = serve((503, {"Retry-After": "3600"}, {}), (503, {}, {}), (503, {}, {}), (200, {}, OK))
    delays: list[float] = []
    c = client(url, delays, backoff_s=2.0, max_backoff_s=3.0, max_retries=3)
    assert c.chat([{"role": "user", "content": "hi"}]).text == "hello"
    assert delays == [3.0, 3.0, 3.0]  # an hour asked, 2 -> 4 -> 8 s of backoff: all capped at 3 s


def test_retries_are_bounded_then_the_call_fails_and_is_counted(serve) -> None:
    stub, url = serve((503, {}, {"error": "overloaded"}))
    delays: list[float] = []
    c = client(url, delays, backoff_s=0.1, max_backoff_s=1.0, max_retries=2)
    with pytest.raises(LLMUnavailable, match=r"failed 3 time\(s\); last error: HTTP 503: .*overloaded"):
        c.chat([{"role": "user", "content": "hi"}])
    assert len(stub.bodies) == 3 and delays == [0.1, 0.2]
    assert (c.counters["requests"], c.counters["retries"], c.counters["failures"]) == (3, 2, 1)


def test_a_client_error_is_not_retried(serve) -> None:
    stub, url = serve((400, {"Retry-After": "1"}, {"error": {"message": "prompt is too long"}}), (200, {}, OK))
    delays: list[float] = []
    c = client(url, delays, max_retries=5)
    with pytest.raises(LLMRefused, match=r"HTTP 400: .*prompt is too long") as err:
        c.chat([{"role": "user", "content": "hi"}])
    assert err.value.status == 400
    assert len(stub.bodies) == 1 and delays == []
    assert (c.counters["requests"], c.counters["retries"], c.counters["failures"]) == (1, 0, 1)


def test_unreachable_and_slow_endpoints_fail_after_the_retries() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    delays: list[float] = []
    c = client(f"http://127.0.0.1:{port}/v1", delays, max_retries=1, backoff_s=0.0, max_backoff_s=0.0)
    with pytest.raises(LLMUnavailable, match=r"failed 2 time\(s\); last error: transport error ConnectError"):
        c.chat([{"role": "user", "content": "hi"}])
    assert (c.counters["requests"], c.counters["failures"]) == (2, 1)


def test_a_timeout_is_retried_then_reported() -> None:
    gate = threading.Event()
    # never answers within the client's timeout
    with json_endpoint(lambda _: gate.wait(2.0) and None) as url:
        try:
            delays: list[float] = []
            c = client(url, delays, timeout_s=0.2, max_retries=1)
            with pytest.raises(
                LLMUnavailable, match=r"failed 2 time\(s\); last error: timeout after 0.2s \(ReadTimeout\)"
            ):
                c.chat([{"role": "user", "content": "hi"}])
            assert c.counters["retries"] == 1
        finally:
            gate.set()


def test_tools_and_images_travel_in_the_request_and_tool_calls_come_back(serve, monkeypatch) -> None:
    from PIL import Image

    call = {"id": "c1", "type": "function", "function": {"name": "probe", "arguments": "{}"}}
    stub, url = serve((200, {}, {"choices": [{"message": {"content": None, "tool_calls": [call]}}]}))
    buf = io.BytesIO()
    Image.new("RGB", (2, 2), (1, 2, 3)).save(buf, format="PNG")
    tool = {"type": "function", "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}}}
    monkeypatch.setenv("MEMPRISM_LLM_TEST_KEY", "sekrit")
    c = client(url, [], api_key_env="MEMPRISM_LLM_TEST_KEY")
    reply = c.chat(
        [{"role": "user", "content": user_content("look", [buf.getvalue()])}],
        tools=[tool],
        tool_choice="auto",
        max_tokens=8,
    )
    assert reply.text == "" and reply.tool_calls == (call,) and reply.usage is None
    body = stub.bodies[0]
    assert body["model"] == "m" and body["tools"] == [tool] and body["tool_choice"] == "auto"
    parts = body["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "look"}
    assert parts[1]["type"] == "image_url" and parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert stub.headers[0]["Authorization"] == "Bearer sekrit"
    assert c.counters["no_usage"] == 1 and c.counters["failures"] == 0
    with pytest.raises(ValueError, match="not PNG bytes"):
        user_content("x", [b"GIF89a"])


def test_a_reply_that_is_not_a_chat_completion_is_retried_then_a_counted_failure(serve) -> None:
    """A 200 whose body is no chat completion (a proxy's error page) is retried as a 5xx is: it
    was one failed request at once, which the task policy took for the model's invalid answer."""
    _, url = serve((200, {}, {"text": "hi"}), (200, {}, b"<html>proxy error</html>"))
    delays: list[float] = []
    c = client(url, delays, max_retries=2)
    with pytest.raises(LLMReplyError, match=r"not an OpenAI chat completion 3 time\(s\) .*'<html>proxy error"):
        c.chat([{"role": "user", "content": "hi"}])
    assert (c.counters["requests"], c.counters["retries"], c.counters["failures"]) == (3, 2, 1) and len(delays) == 2
    stub, url = serve((200, {}, b"not json"), (200, {}, OK))
    assert client(url, []).chat([{"role": "user", "content": "hi"}]).text == "hello" and len(stub.bodies) == 2
    # A completion whose message has no text is the model's empty answer, not the endpoint's fault.
    _, url = serve((200, {}, {"choices": [{"message": {"role": "assistant", "content": None}}]}))
    assert client(url, []).chat([{"role": "user", "content": "hi"}]).text == ""


def test_config_errors_name_the_section_key() -> None:
    class PhiLike(EndpointConfig):
        SECTION = "phi"

    for kw, msg in [
        ({"base_url": "127.0.0.1:8000"}, "phi.base_url must start with http"),
        ({"timeout_s": 0.0}, "phi.timeout_s must be a finite number"),
        ({"max_retries": -1}, "phi.max_retries must be >= 0"),
        ({"backoff_s": 5.0, "max_backoff_s": 1.0}, "phi: need 0 <= backoff_s <= max_backoff_s"),
    ]:
        with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
            PhiLike(**kw)
    assert EndpointConfig(max_retries=2, timeout_s=10.0, max_backoff_s=5.0).budget_s() == 3 * 10.0 + 2 * 5.0


def test_map_concurrent_keeps_order_and_the_bound() -> None:
    active = {"now": 0, "peak": 0}
    lock = threading.Lock()
    gate = threading.Barrier(3, timeout=5)

    def work(i: int) -> int:
        with lock:
            active["now"] += 1
            active["peak"] = max(active["peak"], active["now"])
        if i < 3:
            gate.wait()  # the first three are in flight together
        with lock:
            active["now"] -= 1
        return i * i

    assert map_concurrent(work, list(range(7)), 3) == [i * i for i in range(7)]
    assert active["peak"] == 3
