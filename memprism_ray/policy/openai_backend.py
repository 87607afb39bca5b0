"""Task policy behind any OpenAI-compatible chat endpoint, e.g. ``vllm serve`` (paper
"Experiment Setup": frozen Qwen2.5-VL-7B-Instruct; appendix E.3 prompts; notes: server
``--limit-mm-per-prompt`` / ``--mm-processor-kwargs`` and base64 ``image_url`` parts).

Images travel as base64 PNG ``data:`` URLs inside ``image_url`` parts, in prompt order.
Requests of one batch run concurrently (bounded), each with a timeout and bounded retries
with exponential backoff on 429, 5xx and connection errors (``Retry-After`` honoured up to
the backoff cap). A request the server refuses with another 4xx (e.g. a prompt longer than
the context) becomes an invalid output; an endpoint that stays unavailable after the
retries raises :class:`PolicyBackendError`. Token counts come from the response's
``usage``; visual tokens from the counting rule of the served model family.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from PIL import Image

from memprism_ray.policy.base import PolicyBackendError, PolicyInput, PolicyOutput
from memprism_ray.policy.config import OpenAIConfig
from memprism_ray.policy.parsing import failed_output, to_output
from memprism_ray.policy.prompts import build_messages
from memprism_ray.policy.tokens import count_visual_tokens

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


def image_data_url(image: Image.Image, compress_level: int = 1) -> str:
    """``data:image/png;base64,...`` of ``image`` (PNG keeps the rendered view lossless)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=compress_level)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def build_openai_payload(inp: PolicyInput, config: OpenAIConfig) -> dict[str, Any]:
    """The ``/chat/completions`` request body of one decision."""
    messages, images = build_messages(inp)
    it = iter(images)
    for message in messages:
        parts = []
        for part in message["content"]:
            if part["type"] == "image":
                url = image_data_url(next(it), config.png_compress_level)
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                parts.append(part)
        message["content"] = parts
    greedy = config.temperature == 0.0
    payload: dict[str, Any] = {
        "model": config.model,
        "messages": messages,
        "temperature": config.temperature,
        "top_p": 1.0 if greedy else config.top_p,
        "max_tokens": config.max_tokens,
    }
    if config.seed is not None:
        payload["seed"] = config.seed
    return payload


class _Rejected(Exception):
    """The server refused this request (non-retryable 4xx or an unusable 200)."""


class OpenAIChatPolicy:
    """Batched task policy over HTTP. Call :meth:`close` (or use ``with``) to free the client."""

    name = "openai"

    def __init__(
        self,
        config: OpenAIConfig,
        *,
        client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        headers = {}
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = client or httpx.Client(timeout=config.timeout_s, headers=headers)
        self._owns_client = client is None
        self._sleep = sleep
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.retries_used = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> OpenAIChatPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        delay = self.config.backoff_s * (2**attempt)
        if response is not None and "retry-after" in response.headers:
            with contextlib.suppress(ValueError):
                delay = max(delay, float(response.headers["retry-after"]))
        return min(delay, self.config.max_backoff_s)

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        last = ""
        for attempt in range(self.config.max_retries + 1):
            response: httpx.Response | None = None
            try:
                response = self._client.post(self.url, json=payload, timeout=self.config.timeout_s)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise _Rejected(f"endpoint returned invalid JSON: {exc}") from None
                body = response.text[:300]
                if response.status_code not in RETRY_STATUS:
                    raise _Rejected(f"HTTP {response.status_code}: {body}")
                last = f"HTTP {response.status_code}: {body}"
            if attempt < self.config.max_retries:
                with self._lock:
                    self.retries_used += 1
                self._sleep(self._delay(attempt, response))
        raise PolicyBackendError(f"{self.url} unavailable after {self.config.max_retries + 1} attempts: {last}")

    def _one(self, inp: PolicyInput) -> PolicyOutput:
        visual = count_visual_tokens(
            inp.images(),
            self.config.visual_token_family,
            min_pixels=self.config.min_pixels,
            max_pixels=self.config.max_pixels,
        )
        t0 = time.perf_counter()
        try:
            body = self._post(build_openai_payload(inp, self.config))
            choice = body["choices"][0]["message"]
            text = choice.get("content") or ""
            if isinstance(text, list):  # some servers return content parts
                text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
            if not isinstance(text, str):
                raise _Rejected(f"message content is {type(text).__name__}, not text")
        except _Rejected as exc:
            return failed_output(str(exc), visual_tokens=visual, latency_s=time.perf_counter() - t0)
        except (KeyError, IndexError, TypeError, AttributeError):
            return failed_output(
                "endpoint response has no choices[0].message", visual_tokens=visual, latency_s=time.perf_counter() - t0
            )
        usage = body.get("usage") or {}
        return to_output(
            inp,
            text,
            prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
            completion_tokens=_int_or_none(usage.get("completion_tokens")),
            visual_tokens=visual,
            latency_s=time.perf_counter() - t0,
        )

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput]:
        if len(inputs) <= 1 or self.config.max_concurrency == 1:
            return [self._one(inp) for inp in inputs]
        with ThreadPoolExecutor(max_workers=min(self.config.max_concurrency, len(inputs))) as pool:
            return list(pool.map(self._one, inputs))


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
