"""OpenAI-compatible backend against a local stub server (127.0.0.1, threading http.server)."""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Iterator

import pytest
from json_endpoint import Reply, Request, chat_reply, json_endpoint
from PIL import Image

from memprism_ray.benchmark.alfworld.contract import ALFWORLD
from memprism_ray.benchmark.ebalfred.contract import EBALFRED
from memprism_ray.policy.base import PolicyBackendError, PolicyInput
from memprism_ray.policy.config import OpenAIConfig
from memprism_ray.policy.openai_backend import OpenAIChatPolicy, build_openai_payload

VIEW = Image.new("RGB", (672, 448), (10, 20, 30))
CAM = Image.new("RGB", (112, 112), (200, 0, 0))


class Stub:
    """Scripted server state: fail the first ``fail`` requests with ``fail_status``."""

    def __init__(self) -> None:
        self.fail = 0
        self.fail_status = 503
        self.status_override: int | None = None
        self.delay_s = 0.0
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, request: Request) -> Reply:
        body = request.json()
        with self.lock:
            self.requests.append(body)
            self.headers.append(request.headers)
            failing = self.fail > 0
            if failing:
                self.fail -= 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if request.path != "/v1/chat/completions":
            return 404, {"error": "not found"}
        if failing:
            return self.fail_status, {"error": "busy"}, {"Retry-After": "0"}
        if self.status_override is not None:
            return self.status_override, {"error": {"message": "prompt is too long"}}
        text = body["messages"][0]["content"]
        task = next(p["text"] for p in text if p["type"] == "text")
        action = "look" if "LOOK" in task else "go to the moon"
        usage = {"prompt_tokens": 321, "completion_tokens": 9, "total_tokens": 330}
        return 200, chat_reply(f"<think>ok</think><action>{action}</action>", usage=usage)


@pytest.fixture
def server() -> Iterator[tuple[Stub, str]]:
    stub = Stub()
    with json_endpoint(stub) as url:
        yield stub, url


def policy_for(url: str, **kw) -> OpenAIChatPolicy:
    cfg = OpenAIConfig(base_url=url, model="qwen-vl-test", backoff_s=0.0, max_backoff_s=0.0, timeout_s=5.0, **kw)
    return OpenAIChatPolicy(cfg, ALFWORLD, sleep=lambda s: None)


def decode_png(url: str) -> Image.Image:
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def test_payload_carries_images_as_png_data_urls_in_order() -> None:
    inp = PolicyInput("ebalfred", "g", "o", admissible=("find a Pan",), camera_image=CAM, view_image=VIEW)
    payload = build_openai_payload(inp, OpenAIConfig(model="m"), EBALFRED)
    parts = payload["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url"]
    first, second = decode_png(parts[1]["image_url"]["url"]), decode_png(parts[2]["image_url"]["url"])
    assert first.size == CAM.size and first.getpixel((0, 0)) == (200, 0, 0)
    assert second.size == VIEW.size and second.getpixel((5, 5)) == (10, 20, 30)
    assert payload["model"] == "m" and payload["temperature"] == 0.0 and payload["seed"] == 0


def test_batch_goes_through_the_endpoint(server, monkeypatch) -> None:
    stub, url = server
    monkeypatch.setenv("MEMPRISM_TEST_KEY", "sekrit")
    policy = policy_for(url, api_key_env="MEMPRISM_TEST_KEY")
    inputs = [
        PolicyInput(
            "alfworld",
            f"LOOK {i}" if i % 2 == 0 else f"roam {i}",
            "o",
            admissible=("look",),
            view_image=VIEW if i == 0 else None,
        )
        for i in range(5)
    ]
    with policy:
        outs = policy.act(inputs)
    assert [o.valid for o in outs] == [True, False, True, False, True]  # order preserved under concurrency
    assert outs[0].action == "look" and "not in the admissible" in outs[1].error
    assert outs[0].prompt_tokens == 321 and outs[0].completion_tokens == 9
    assert outs[0].visual_tokens == 24 * 16 + 2 and outs[1].visual_tokens == 0
    assert len(stub.requests) == 5
    with_image = [r for r in stub.requests if any(p["type"] == "image_url" for p in r["messages"][0]["content"])]
    assert len(with_image) == 1
    assert all(h.get("Authorization") == "Bearer sekrit" for h in stub.headers)
    assert all(r["model"] == "qwen-vl-test" and r["max_tokens"] == 512 for r in stub.requests)


@pytest.mark.parametrize("status", [429, 500, 503])
def test_retries_then_succeeds(server, status: int) -> None:
    stub, url = server
    stub.fail, stub.fail_status = 2, status
    delays: list[float] = []
    cfg = OpenAIConfig(base_url=url, backoff_s=0.01, max_backoff_s=0.02, max_retries=3)
    policy = OpenAIChatPolicy(cfg, ALFWORLD, sleep=delays.append)
    out = policy.act([PolicyInput("alfworld", "LOOK", "o", admissible=("look",))])[0]
    assert out.valid and out.action == "look"
    assert len(stub.requests) == 3 and policy.counters["retries"] == 2
    assert delays == [0.01, 0.02]  # exponential, capped
    # the same counters as every endpoint user (memprism_ray/llm_client.py), tokens from `usage`
    assert dict(policy.counters) == {
        "requests": 3,
        "retries": 2,
        "failures": 0,
        "prompt_tokens": 321,
        "completion_tokens": 9,
        "no_usage": 0,
    }


def test_gives_up_after_bounded_retries(server) -> None:
    stub, url = server
    stub.fail = 10
    policy = policy_for(url, max_retries=2)
    with pytest.raises(PolicyBackendError, match=r"failed 3 time\(s\); last error: HTTP 503"):
        policy.act([PolicyInput("alfworld", "LOOK", "o", admissible=("look",))])
    assert len(stub.requests) == 3 and policy.counters["failures"] == 1


def test_a_reply_that_is_no_completion_is_retried_then_the_episodes_failure(server) -> None:
    """A 200 whose body is no chat completion (a proxy's error page) was taken for the model's
    invalid answer: every decision 'invalid', SR 0, 0 failed episodes. It is the endpoint's
    fault: retried, then a backend error, which fails the episode with the reason."""
    stub, url = server
    stub.fail, stub.fail_status = 10, 200
    policy = policy_for(url, max_retries=2)
    with pytest.raises(PolicyBackendError, match=r"not an OpenAI chat completion 3 time\(s\)"):
        policy.act([PolicyInput("alfworld", "LOOK", "o", admissible=("look",))])
    assert len(stub.requests) == 3
    stub.fail = 1  # one error page, then the completion: the decision is the model's
    out = policy.act([PolicyInput("alfworld", "LOOK", "o", admissible=("look",))])[0]
    assert out.valid and out.action == "look"


def test_client_error_is_an_invalid_output_without_retry(server) -> None:
    stub, url = server
    stub.status_override = 400
    out = policy_for(url).act([PolicyInput("alfworld", "LOOK", "o", admissible=("look",))])[0]
    assert not out.valid and "HTTP 400" in out.error and "too long" in out.error
    assert len(stub.requests) == 1
    # A refusal of every request alike (a key gone stale, a model the server no longer serves)
    # made every decision 'invalid' (SR 0, exit 0): the episode fails, with the reason.
    for status in (401, 404):
        stub.status_override = status
        with pytest.raises(PolicyBackendError, match=f"HTTP {status}"):
            policy_for(url).act([PolicyInput("alfworld", "LOOK", "o", admissible=("look",))])


def test_connection_refused_is_retried_then_a_backend_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = policy_for(f"http://127.0.0.1:{port}/v1", max_retries=1)
    with pytest.raises(PolicyBackendError, match="ConnectError"):
        policy.act([PolicyInput("alfworld", "LOOK", "o", admissible=("look",))])
    assert policy.counters["retries"] == 1


def test_config_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="base_url"):
        OpenAIConfig(base_url="127.0.0.1:8000")
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIConfig(max_retries=-1)
    with pytest.raises(ValueError, match="temperature"):
        OpenAIConfig(temperature=-0.1)


def test_timeouts_are_retried_then_reported(server) -> None:
    stub, url = server
    stub.delay_s = 1.0
    policy = OpenAIChatPolicy(
        OpenAIConfig(base_url=url, timeout_s=0.1, max_retries=1, backoff_s=0.0, max_backoff_s=0.0),
        ALFWORLD,
        sleep=lambda s: None,
    )
    with pytest.raises(PolicyBackendError, match="ReadTimeout"):
        policy.act([PolicyInput("alfworld", "LOOK", "o", admissible=("look",))])
    assert policy.counters["retries"] == 1
