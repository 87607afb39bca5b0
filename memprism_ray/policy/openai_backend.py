"""Task policy behind any OpenAI-compatible chat endpoint, e.g. ``vllm serve`` (paper
"Experiment Setup": frozen Qwen2.5-VL-7B-Instruct; appendix E.3 prompts; notes: server
``--limit-mm-per-prompt`` / ``--mm-processor-kwargs`` and base64 ``image_url`` parts).

A batch's requests run concurrently through :class:`~memprism_ray.llm_client.ChatClient`. A
refused request or a reply that is no chat completion becomes an invalid output; an endpoint
unavailable after the retries raises :class:`PolicyBackendError`."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from PIL import Image

from memprism_ray.llm_client import (
    ChatClient,
    Closing,
    LLMRefused,
    LLMReplyError,
    LLMUnavailable,
    map_concurrent,
    png_part,
)
from memprism_ray.policy.base import PolicyBackendError, PolicyInput, PolicyOutput
from memprism_ray.policy.config import OpenAIConfig
from memprism_ray.policy.contract import TaskContract
from memprism_ray.policy.parsing import failed_output
from memprism_ray.policy.tokens import config_visual_tokens


def image_part(image: Image.Image, compress_level: int = 1) -> dict[str, Any]:
    """The ``image_url`` part of ``image`` as PNG (lossless: the rendered view as drawn)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=compress_level)
    return png_part(buf.getvalue())


def build_openai_payload(inp: PolicyInput, config: OpenAIConfig, contract: TaskContract) -> dict[str, Any]:
    """The ``/chat/completions`` request body of one decision, prompted by ``contract``."""
    messages, images = contract.build_messages(inp)
    it = iter(images)
    for message in messages:
        message["content"] = [
            image_part(next(it), config.png_compress_level) if part["type"] == "image" else part
            for part in message["content"]
        ]
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


#: The refusals that are one request's own (a prompt past the context, an image too large, a
#: field the server rejects): that decision's invalid action, as the paper counts one. Any other
#: 4xx (401/403 a key, 404 a path or model) refuses every request alike: the episode fails.
REQUEST_FAULTS = frozenset({400, 413, 422})


class OpenAIChatPolicy(Closing):
    """Batched task policy over HTTP, prompted and parsed by ``contract``; :meth:`close` frees
    the client. ``transport`` goes to ``httpx.Client`` (tests)."""

    name = "openai"

    def __init__(
        self,
        config: OpenAIConfig,
        contract: TaskContract,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self.contract = contract
        self.client = ChatClient(config, transport=transport, sleep=sleep)
        self.counters = self.client.counters

    def close(self) -> None:
        self.client.close()

    def _one(self, inp: PolicyInput) -> PolicyOutput:
        visual = config_visual_tokens(inp.images(), self.config)
        t0 = time.perf_counter()
        try:
            reply = self.client.chat(**build_openai_payload(inp, self.config, self.contract))
        except LLMRefused as exc:
            if exc.status not in REQUEST_FAULTS:  # a key, path or model the endpoint refuses: the run's
                raise PolicyBackendError(str(exc)) from None
            return failed_output(str(exc), visual_tokens=visual, latency_s=time.perf_counter() - t0)
        except (LLMUnavailable, LLMReplyError) as exc:  # the endpoint's: the episode fails, counted and named
            raise PolicyBackendError(str(exc)) from None
        prompt, completion = reply.usage or (None, None)
        return self.contract.to_output(
            inp,
            reply.text,
            prompt_tokens=prompt,
            completion_tokens=completion,
            visual_tokens=visual,
            latency_s=time.perf_counter() - t0,
        )

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput]:
        return map_concurrent(self._one, list(inputs), self.config.max_concurrency)
