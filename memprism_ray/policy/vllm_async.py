"""The task policy on vLLM's asynchronous engine: one request per decision (paper
"Experiment Setup": frozen Qwen2.5-VL-7B-Instruct, greedy decoding; appendix E.3 prompts;
docs/gpu.md "Why AsyncLLM in a Ray actor").

``vllm.LLM.generate`` blocks until its whole batch is done: on one H100 with a 7B-shaped
Qwen2.5-VL, calls of 4 in sequence reach 11.7 decisions/s against 28.5 for one batch of 256
(shared/gpu/README.md). ``AsyncLLM`` batches every request in flight at each engine step, so all
callers of a replica share its steps. The front end (PNG decoding, chat templating, vLLM's input
processing) shares the event loop and is timed (:attr:`AsyncVLLMPolicy.frontend`);
``vllm.frontend_threads`` moves the first two to threads. A rejected request becomes an invalid
output, an engine failure a :class:`PolicyBackendError` for that request only."""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memprism_ray.policy.base import PolicyBackendError, PolicyInput, PolicyOutput
from memprism_ray.policy.chat_format import format_qwen_chat
from memprism_ray.policy.config import PROMPT_LAYOUTS, VLLMConfig
from memprism_ray.policy.contract import TaskContract
from memprism_ray.policy.parsing import failed_output
from memprism_ray.policy.tokens import config_visual_tokens
from memprism_ray.policy.vllm_backend import ChatFormatter, build_vllm_request, engine_kwargs, sampling_kwargs

#: vLLM 0.24's exception class names for a bad request; older releases raise ``ValueError``.
REJECTED = ("VLLMValidationError", "VLLMClientError")
#: The timed front-end stages (:attr:`AsyncVLLMPolicy.frontend`).
FRONTEND_STAGES = ("decode", "template", "mm_preprocess")


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


def engine_settings(engine: Any, config: VLLMConfig) -> dict[str, Any]:
    """The scheduler settings ``engine`` runs with: what vLLM resolved (``source: engine``), else
    the keywords it was built from (``source: requested``: the fake engine)."""
    vc = getattr(engine, "vllm_config", None)
    if vc is not None:
        sched = getattr(vc, "scheduler_config", None)
        cache = getattr(vc, "cache_config", None)
        model = getattr(vc, "model_config", None)
        return {
            "source": "engine",
            "max_num_batched_tokens": getattr(sched, "max_num_batched_tokens", None),
            "max_num_seqs": getattr(sched, "max_num_seqs", None),
            "enable_chunked_prefill": getattr(sched, "enable_chunked_prefill", None),
            "encoder_cache_size": getattr(sched, "encoder_cache_size", None),
            "enable_prefix_caching": getattr(cache, "enable_prefix_caching", None),
            "max_model_len": getattr(model, "max_model_len", None),
            "enforce_eager": getattr(model, "enforce_eager", None),
        }
    kw = getattr(engine, "engine_kwargs", None) or engine_kwargs(config)
    keys = ("max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching", "max_model_len", "enforce_eager")
    return {"source": "requested", **{k: kw.get(k) for k in keys}}


def _timed_call(fn: Callable[[], Any]) -> tuple[bool, Any, float]:
    """``fn()`` with its duration; an exception is returned, to be raised on the loop."""
    t0 = time.perf_counter()
    try:
        return True, fn(), time.perf_counter() - t0
    except Exception as exc:
        return False, exc, time.perf_counter() - t0


def make_sampling_params(**kwargs: Any) -> Any:
    """``vllm.SamplingParams`` that report only the finished completion."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, **kwargs)


def is_rejection(exc: BaseException) -> bool:
    """Whether ``exc`` is vLLM refusing one request (as opposed to the engine failing)."""
    return isinstance(exc, ValueError) or any(c.__name__ in REJECTED for c in type(exc).__mro__)


class AsyncVLLMPolicy:
    """One decision = one engine request; many decisions in flight at once, prompted and parsed
    by ``contract``. ``engine`` and ``sampling_factory`` default to vLLM's (tests inject
    :class:`memprism_ray.testing.fake_vllm.FakeAsyncEngine`)."""

    name = "vllm"

    def __init__(
        self,
        config: VLLMConfig,
        contract: TaskContract,
        *,
        engine: Any = None,
        sampling_factory: Any = None,
        prompt_layout: str = "paper",
    ) -> None:
        self.config = config
        self.contract = contract
        if engine is None:
            engine = build_async_engine(config)
            sampling_factory = sampling_factory or make_sampling_params
        self.engine = engine
        self._sampling = sampling_factory or dict
        self.sampling_params = self._sampling(**sampling_kwargs(config))
        self._params_by_max_tokens: dict[int, Any] = {config.max_tokens: self.sampling_params}
        self._format: ChatFormatter | None = format_qwen_chat if config.chat_template == "qwen2_vl" else None
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self.in_flight = 0
        self.counters = {"requests": 0, "rejected": 0, "engine_errors": 0}
        #: Seconds and calls per front-end stage (``<stage>_s``, ``<stage>_n``), summed over
        #: requests: with threads the seconds of several requests overlap.
        self.frontend: dict[str, float] = {f"{st}_{k}": 0 for st in FRONTEND_STAGES for k in ("s", "n")}
        self.prompt_layout = "paper"
        self.frontend_threads = 0
        self._pool: ThreadPoolExecutor | None = None
        self.configure(prompt_layout=prompt_layout, frontend_threads=config.frontend_threads)
        self._time_engine_inputs()

    def configure(self, *, prompt_layout: str | None = None, frontend_threads: int | None = None) -> dict[str, Any]:
        """Set the prompt layout and the front-end thread count; requests in flight finish as they started."""
        if prompt_layout is not None:
            if prompt_layout not in PROMPT_LAYOUTS:
                raise ValueError(f"policy.prompt_layout must be one of {PROMPT_LAYOUTS}, got {prompt_layout!r}")
            self.prompt_layout = prompt_layout
        if frontend_threads is not None and frontend_threads != self.frontend_threads:
            if frontend_threads < 0:
                raise ValueError(f"vllm.frontend_threads must be >= 0, got {frontend_threads}")
            old, self._pool = self._pool, None
            if frontend_threads:
                self._pool = ThreadPoolExecutor(frontend_threads, thread_name_prefix="memprism-frontend")
            self.frontend_threads = frontend_threads
            if old is not None:
                old.shutdown(wait=False)
        return {"prompt_layout": self.prompt_layout, "frontend_threads": self.frontend_threads}

    def _count(self, stage: str, seconds: float) -> None:
        self.frontend[f"{stage}_s"] += seconds
        self.frontend[f"{stage}_n"] += 1

    def _time_engine_inputs(self) -> None:
        """Time the engine's ``input_processor.process_inputs`` (run on this event loop by vLLM 0.24)."""
        proc = getattr(self.engine, "input_processor", None)
        inner = getattr(proc, "process_inputs", None)
        if not callable(inner):
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self._count("mm_preprocess", time.perf_counter() - t0)

        proc.process_inputs = timed

    async def offload(self, stage: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, timed as front-end ``stage``, in the thread pool when there is one."""
        if self._pool is None:
            ok, value, seconds = _timed_call(fn)
        else:
            ok, value, seconds = await asyncio.get_running_loop().run_in_executor(self._pool, _timed_call, fn)
        self._count(stage, seconds)
        if not ok:
            raise value
        return value

    def _params(self, max_tokens: int | None) -> Any:
        """Sampling params, with ``max_tokens`` overridden for this call (benchmarks)."""
        if max_tokens is None:
            return self.sampling_params
        if max_tokens not in self._params_by_max_tokens:
            self._params_by_max_tokens[max_tokens] = self._sampling(
                **{**sampling_kwargs(self.config), "max_tokens": max_tokens}
            )
        return self._params_by_max_tokens[max_tokens]

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
        """The final ``RequestOutput``; a rejection is raised as is, any other failure as PolicyBackendError."""
        self.in_flight += 1
        self.counters["requests"] += 1
        try:
            final = None
            async for out in self.engine.generate(prompt, params, request_id):
                final = out
        except Exception as exc:
            if is_rejection(exc) or isinstance(exc, PolicyBackendError):
                raise
            raise PolicyBackendError(f"vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.in_flight -= 1
        if final is None:
            raise PolicyBackendError(f"vLLM request {request_id} finished without an output")
        return final

    async def act_one(self, inp: PolicyInput, tag: str = "", max_tokens: int | None = None) -> PolicyOutput:
        """One decision. Raises :class:`PolicyBackendError` only when the engine fails."""
        t0 = time.perf_counter()
        visual = config_visual_tokens(inp.images(), self.config)
        fmt = await self._formatter()
        build = functools.partial(
            build_vllm_request,
            inp,
            self.contract,
            limit_images=self.config.limit_mm_per_prompt,
            format_chat=fmt,
            layout=self.prompt_layout,
        )
        try:
            request = await self.offload("template", build)
        except ValueError as exc:
            return failed_output(f"request not built: {exc}", visual_tokens=visual, latency_s=0.0)
        params, request_id = self._params(max_tokens), self._request_id(tag)
        try:
            out = await self._generate(request, params, request_id)
        except PolicyBackendError:
            self.counters["engine_errors"] += 1
            raise
        except Exception as exc:  # _generate raises nothing else than a rejection
            self.counters["rejected"] += 1
            return failed_output(
                f"vLLM rejected the request: {str(exc)[:300]}", visual_tokens=visual, latency_s=time.perf_counter() - t0
            )
        completion = out.outputs[0]
        return self.contract.to_output(
            inp,
            completion.text,
            prompt_tokens=len(out.prompt_token_ids) if out.prompt_token_ids is not None else None,
            completion_tokens=len(completion.token_ids),
            visual_tokens=visual,
            latency_s=time.perf_counter() - t0,
        )

    async def act(
        self, inputs: Sequence[PolicyInput], tag: str = "", max_tokens: int | None = None
    ) -> list[PolicyOutput | BaseException]:
        """Every input as its own concurrent request; an engine failure is returned as that input's value."""
        return list(
            await asyncio.gather(*(self.act_one(inp, tag, max_tokens) for inp in inputs), return_exceptions=True)
        )

    async def complete(self, prompt: str, *, max_tokens: int, temperature: float = 0.0, tag: str = "") -> str:
        """The completion of one user message ``prompt``: D1's LLM view teacher on the pool (appendix D.2)."""
        fmt = await self._formatter()
        params = self._sampling(temperature=temperature, top_p=1.0, max_tokens=max_tokens, seed=self.config.seed)
        text = fmt([{"role": "user", "content": prompt}])
        try:
            out = await self._generate({"prompt": text}, params, self._request_id(tag))
        except PolicyBackendError:
            raise
        except Exception as exc:  # a rejection (_generate)
            raise ValueError(f"vLLM rejected the teacher request: {str(exc)[:300]}") from None
        return out.outputs[0].text

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        stop = getattr(self.engine, "shutdown", None)
        if callable(stop):
            stop()
