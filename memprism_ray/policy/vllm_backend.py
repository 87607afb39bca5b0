"""vLLM offline-engine task policy (paper "Experiment Setup": frozen Qwen2.5-VL-7B-Instruct,
greedy decoding; appendix E.3 prompts; notes: vLLM offline inputs and ``max_pixels``).

Request construction is a pure function (:func:`build_vllm_request`): the chat prompt with
one vision placeholder per image and ``multi_modal_data={"image": [PIL images]}``, the form
``vllm.LLM.generate`` takes. The engine is created from :func:`engine_kwargs`
(``limit_mm_per_prompt={"image": N}``, ``mm_processor_kwargs={"max_pixels": 672*672}``;
vLLM ignores a per-image ``max_pixels``, so it is set at start-up). vLLM is imported only
when an engine is built, so this module imports on machines without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from memprism_ray.policy.base import PolicyBackendError, PolicyInput, PolicyOutput
from memprism_ray.policy.chat_format import format_qwen_chat
from memprism_ray.policy.config import VLLMConfig
from memprism_ray.policy.parsing import failed_output, to_output
from memprism_ray.policy.prompts import build_messages
from memprism_ray.policy.tokens import count_visual_tokens

ChatFormatter = Callable[[list[dict[str, Any]]], str]


def engine_kwargs(config: VLLMConfig) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` (and ``AsyncEngineArgs``) for ``config``.

    The same keywords build both engines, so the replica's ``AsyncLLM`` and an offline
    ``vllm.LLM`` run the same scheduler: ``max_num_batched_tokens`` and ``max_num_seqs`` are
    explicit by default (:data:`~memprism_ray.policy.config.VLLM_MAX_NUM_BATCHED_TOKENS`),
    because vLLM's own defaults differ by usage context (issue 31). Settings left at 0 / ''
    stay vLLM's defaults (they are not passed)."""
    kw: dict[str, Any] = {
        "model": config.model,
        "max_model_len": config.max_model_len,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "tensor_parallel_size": config.tensor_parallel_size,
        "limit_mm_per_prompt": {"image": config.limit_mm_per_prompt},
        "mm_processor_kwargs": {"min_pixels": config.min_pixels, "max_pixels": config.max_pixels},
        "seed": config.seed,
        "dtype": config.dtype,
        "enforce_eager": config.enforce_eager,
        "load_format": config.load_format,
        "enable_prefix_caching": config.enable_prefix_caching,
    }
    if config.tokenizer:
        kw["tokenizer"] = config.tokenizer
    if config.max_num_seqs:
        kw["max_num_seqs"] = config.max_num_seqs
    if config.max_num_batched_tokens:
        kw["max_num_batched_tokens"] = config.max_num_batched_tokens
    return kw


def sampling_kwargs(config: VLLMConfig) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams``: greedy when temperature is 0."""
    greedy = config.temperature == 0.0
    kw: dict[str, Any] = {
        "temperature": config.temperature,
        "top_p": 1.0 if greedy else config.top_p,
        "max_tokens": config.max_tokens,
        "seed": config.seed,
    }
    if config.ignore_eos:
        kw["ignore_eos"] = True
    return kw


def scheduler_summary(config: VLLMConfig) -> str:
    """The engine settings a throughput reader asks about first, as one log line's tail."""

    def knob(value: int) -> str:
        return f"{value:,}" if value else "vLLM's default"

    return (
        f"max_num_batched_tokens {knob(config.max_num_batched_tokens)}, max_num_seqs {knob(config.max_num_seqs)}, "
        f"prefix caching {'on' if config.enable_prefix_caching else 'off'}, "
        f"{'eager' if config.enforce_eager else 'torch.compile + CUDA graphs'}, "
        f"frontend threads {config.frontend_threads}"
    )


def build_vllm_request(
    inp: PolicyInput,
    *,
    limit_images: int,
    format_chat: ChatFormatter = format_qwen_chat,
    layout: str = "paper",
) -> dict[str, Any]:
    """The ``LLM.generate`` input of one decision: ``{"prompt", "multi_modal_data"?}``;
    ``layout`` is ``policy.prompt_layout`` (:func:`~memprism_ray.policy.prompts.prompt_parts`)."""
    messages, images = build_messages(inp, layout)
    if len(images) > limit_images:
        raise ValueError(f"prompt has {len(images)} images but the engine allows {limit_images} (limit_mm_per_prompt)")
    request: dict[str, Any] = {"prompt": format_chat(messages)}
    if images:
        request["multi_modal_data"] = {"image": images}
    return request


class VLLMPolicy:
    """Batched task policy on a ``vllm.LLM`` engine.

    ``engine`` and ``sampling_params`` can be injected (tests, or an engine shared with
    other components); by default both are built from ``config``.
    """

    name = "vllm"

    def __init__(
        self, config: VLLMConfig, *, engine: Any = None, sampling_params: Any = None, prompt_layout: str = "paper"
    ) -> None:
        self.config = config
        self.prompt_layout = prompt_layout
        if engine is None:
            try:
                import vllm
            except ImportError as exc:
                raise PolicyBackendError(
                    "the vllm backend needs the vllm package (GPU machines: pip install 'memprism-ray[vllm]')"
                ) from exc
            engine = vllm.LLM(**engine_kwargs(config))
            sampling_params = vllm.SamplingParams(**sampling_kwargs(config))
        self.engine = engine
        self.sampling_params = sampling_params if sampling_params is not None else sampling_kwargs(config)
        self._format: ChatFormatter = format_qwen_chat
        if config.chat_template == "model":
            tokenizer = engine.get_tokenizer()
            if not getattr(tokenizer, "chat_template", None):
                raise PolicyBackendError(
                    f"model {config.model!r} has no chat template; set vllm.chat_template=qwen2_vl for Qwen-VL models"
                )
            self._format = lambda messages: tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )

    def _generate(self, requests: list[dict[str, Any]]) -> list[Any]:
        return list(self.engine.generate(requests, sampling_params=self.sampling_params, use_tqdm=False))

    def shutdown(self) -> None:
        """Stop the engine's core process and free its GPU memory now. ``vllm.LLM`` (0.24)
        has no ``shutdown`` of its own, and its engine core has no check for its parent's
        death: an actor killed without this can leave that process holding the GPU memory
        it reserved (``gpu_memory_utilization``), which the next engine on the GPU needs."""
        core = getattr(getattr(self.engine, "llm_engine", None), "engine_core", None)
        stop = getattr(core, "shutdown", None) or getattr(self.engine, "shutdown", None)
        if callable(stop):
            stop()

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput]:
        t0 = time.perf_counter()
        failures: dict[int, str] = {}
        visual = [
            count_visual_tokens(
                inp.images(),
                self.config.visual_token_family,
                min_pixels=self.config.min_pixels,
                max_pixels=self.config.max_pixels,
            )
            for inp in inputs
        ]
        pending: list[tuple[int, dict[str, Any]]] = []
        for i, inp in enumerate(inputs):
            try:
                pending.append(
                    (
                        i,
                        build_vllm_request(
                            inp,
                            limit_images=self.config.limit_mm_per_prompt,
                            format_chat=self._format,
                            layout=self.prompt_layout,
                        ),
                    )
                )
            except ValueError as exc:
                failures[i] = f"request not built: {exc}"
        raw: dict[int, Any] = {}
        if pending:
            try:
                outs = self._generate([req for _, req in pending])
                if len(outs) != len(pending):
                    raise PolicyBackendError(f"vLLM returned {len(outs)} outputs for {len(pending)} requests")
                raw = {i: out for (i, _), out in zip(pending, outs, strict=True)}
            except ValueError:
                # vLLM validates inputs with ValueError (prompt longer than max_model_len, too
                # many images), failing the whole batch; retry one by one so only the bad
                # request is marked invalid.
                for i, req in pending:
                    try:
                        raw[i] = self._generate([req])[0]
                    except ValueError as exc:
                        failures[i] = f"vLLM rejected the request: {str(exc)[:300]}"
                    except Exception as exc:
                        raise PolicyBackendError(f"vLLM engine failed: {type(exc).__name__}: {exc}") from exc
            except PolicyBackendError:
                raise
            except Exception as exc:
                raise PolicyBackendError(f"vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        latency = time.perf_counter() - t0
        results: list[PolicyOutput] = []
        for i, inp in enumerate(inputs):
            if i in failures:
                results.append(failed_output(failures[i], visual_tokens=visual[i], latency_s=latency))
                continue
            out = raw[i]
            completion = out.outputs[0]
            results.append(
                to_output(
                    inp,
                    completion.text,
                    prompt_tokens=len(out.prompt_token_ids) if out.prompt_token_ids is not None else None,
                    completion_tokens=len(completion.token_ids),
                    visual_tokens=visual[i],
                    latency_s=latency,
                )
            )
        return results
