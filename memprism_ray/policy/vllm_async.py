"""The task policy on vLLM's asynchronous engine: one request per decision (paper
"Experiment Setup": frozen Qwen2.5-VL-7B-Instruct, greedy decoding; appendix E.3 prompts;
docs/gpu.md "Why AsyncLLM in a Ray actor").

``vllm.LLM.generate`` (the offline engine of :mod:`memprism_ray.policy.vllm_backend`)
blocks until its whole batch is done, so a replica fed by many rollout workers runs their
small batches one after another: measured on one H100 with a 7B-shaped Qwen2.5-VL, calls
of 4 in sequence reach 11.7 decisions/s against 28.5 for one batch of 256
(shared/gpu/README.md). ``vllm.v1.engine.async_llm.AsyncLLM`` instead takes requests at any
time and batches everything in flight at each engine step (continuous batching). Here every
decision is its own ``generate(prompt, sampling_params, request_id)`` request, so requests
from every caller of a replica share the engine's steps.

Why an ``AsyncLLM`` inside a Ray actor (:class:`~memprism_ray.actors.workers.PolicyReplica`)
rather than ``vllm serve`` behind the OpenAI backend or Ray Serve: the actor is placed,
restarted and killed by Ray like every other stage and asks Ray for its GPU (so the
autoscaler provisions it), images arrive as PNG bytes or object references instead of
base64 JSON over HTTP, and the one routing rule needed -- a group sticks to one replica,
groups balanced by load -- is ours (``PolicyPool``), not a proxy layer's.

Request construction is the offline backend's (:func:`build_vllm_request`), so both paths
send byte-identical prompts. Failures stay per request: a request vLLM rejects (prompt too
long, too many images: ``ValueError`` or vLLM's client errors) becomes an invalid
:class:`PolicyOutput` with the reason; an engine failure becomes a
:class:`PolicyBackendError` *value* for that request only, which the caller counts as a
failed trajectory. This module imports vLLM only when it builds an engine, and never Ray.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
import uuid
from collections.abc import Sequence
from typing import Any

from memprism_ray.policy.base import PolicyBackendError, PolicyInput, PolicyOutput
from memprism_ray.policy.chat_format import format_qwen_chat
from memprism_ray.policy.config import VLLMConfig
from memprism_ray.policy.parsing import failed_output, to_output
from memprism_ray.policy.tokens import count_visual_tokens
from memprism_ray.policy.vllm_backend import ChatFormatter, build_vllm_request, engine_kwargs, sampling_kwargs

#: Exception class names vLLM uses for a bad request (v0.24: ``VLLMValidationError``,
#: a ``VLLMClientError``); older releases raise ``ValueError``.
REJECTED = ("VLLMValidationError", "VLLMClientError")


def build_async_engine(config: VLLMConfig) -> Any:
    """``AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(config)))``."""
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise PolicyBackendError(
            "the vllm backend needs vLLM on the replica's node (GPU nodes: pip install -r requirements/gpu.txt; "
            "docs/gpu.md)"
        ) from exc
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(config)))


def make_sampling_params(**kwargs: Any) -> Any:
    """``vllm.SamplingParams`` that report only the finished completion (one output per
    request, not one per token)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, **kwargs)


def is_rejection(exc: BaseException) -> bool:
    """Whether ``exc`` is vLLM refusing one request (as opposed to the engine failing)."""
    return isinstance(exc, ValueError) or any(c.__name__ in REJECTED for c in type(exc).__mro__)


class AsyncVLLMPolicy:
    """One decision = one engine request; many decisions in flight at once.

    ``engine`` (anything with vLLM's async ``generate(prompt, sampling_params, request_id)``
    contract) and ``sampling_factory`` (keyword arguments -> sampling params) can be
    injected: tests and ``benchmarks/bench_policy_pool.py --engine fake`` use
    :class:`memprism_ray.policy.fake_vllm.FakeAsyncEngine`. By default both are vLLM's.
    """

    name = "vllm"

    def __init__(self, config: VLLMConfig, *, engine: Any = None, sampling_factory: Any = None) -> None:
        self.config = config
        if engine is None:
            engine = build_async_engine(config)
            sampling_factory = sampling_factory or make_sampling_params
        self.engine = engine
        self._sampling = sampling_factory or dict
        self.sampling_params = self._sampling(**sampling_kwargs(config))
        self._format: ChatFormatter | None = format_qwen_chat if config.chat_template == "qwen2_vl" else None
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self.in_flight = 0
        self.counters = {"requests": 0, "rejected": 0, "engine_errors": 0}

    async def _formatter(self) -> ChatFormatter:
        """The checkpoint's chat template (``chat_template: model``), resolved once."""
        if self._format is None:
            tokenizer = self.engine.get_tokenizer()
            if inspect.isawaitable(tokenizer):  # an async method before vLLM 0.11
                tokenizer = await tokenizer
            if not getattr(tokenizer, "chat_template", None):
                raise PolicyBackendError(
                    f"model {self.config.model!r} has no chat template; set vllm.chat_template=qwen2_vl for Qwen-VL"
                )
            self._format = lambda messages: tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        return self._format

    def _request_id(self, tag: str = "") -> str:
        return f"{self._prefix}-{next(self._ids)}{'-' + tag if tag else ''}"

    async def _generate(self, prompt: Any, params: Any, request_id: str) -> Any:
        """The final ``RequestOutput`` of one request."""
        self.in_flight += 1
        self.counters["requests"] += 1
        try:
            final = None
            async for out in self.engine.generate(prompt, params, request_id):
                final = out
            if final is None:
                raise PolicyBackendError(f"vLLM request {request_id} finished without an output")
            return final
        finally:
            self.in_flight -= 1

    async def act_one(self, inp: PolicyInput, tag: str = "") -> PolicyOutput:
        """One decision. Raises :class:`PolicyBackendError` only when the engine fails."""
        t0 = time.perf_counter()
        visual = count_visual_tokens(
            inp.images(),
            self.config.visual_token_family,
            min_pixels=self.config.min_pixels,
            max_pixels=self.config.max_pixels,
        )
        fmt = await self._formatter()
        try:
            request = build_vllm_request(inp, limit_images=self.config.limit_mm_per_prompt, format_chat=fmt)
        except ValueError as exc:
            return failed_output(f"request not built: {exc}", visual_tokens=visual, latency_s=0.0)
        try:
            out = await self._generate(request, self.sampling_params, self._request_id(tag))
        except PolicyBackendError:
            self.counters["engine_errors"] += 1
            raise
        except Exception as exc:
            if is_rejection(exc):
                self.counters["rejected"] += 1
                return failed_output(
                    f"vLLM rejected the request: {str(exc)[:300]}",
                    visual_tokens=visual,
                    latency_s=time.perf_counter() - t0,
                )
            self.counters["engine_errors"] += 1
            raise PolicyBackendError(f"vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        completion = out.outputs[0]
        return to_output(
            inp,
            completion.text,
            prompt_tokens=len(out.prompt_token_ids) if out.prompt_token_ids is not None else None,
            completion_tokens=len(completion.token_ids),
            visual_tokens=visual,
            latency_s=time.perf_counter() - t0,
        )

    async def act(self, inputs: Sequence[PolicyInput], tag: str = "") -> list[PolicyOutput | BaseException]:
        """Every input as its own concurrent request; an engine failure is returned as that
        input's value (never raised), so one bad request fails one trajectory."""
        return list(await asyncio.gather(*(self.act_one(inp, tag) for inp in inputs), return_exceptions=True))

    async def complete(self, prompt: str, *, max_tokens: int, temperature: float = 0.0, tag: str = "") -> str:
        """The completion of one user message ``prompt`` (chat-formatted; no image): the
        LLM view teacher of D1 served by the pool (paper appendix D.2)."""
        fmt = await self._formatter()
        params = self._sampling(temperature=temperature, top_p=1.0, max_tokens=max_tokens, seed=self.config.seed)
        text = fmt([{"role": "user", "content": prompt}])
        try:
            out = await self._generate({"prompt": text}, params, self._request_id(tag))
        except PolicyBackendError:
            raise
        except Exception as exc:
            if is_rejection(exc):
                raise ValueError(f"vLLM rejected the teacher request: {str(exc)[:300]}") from None
            raise PolicyBackendError(f"vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        return out.outputs[0].text

    def shutdown(self) -> None:
        stop = getattr(self.engine, "shutdown", None)
        if callable(stop):
            stop()
