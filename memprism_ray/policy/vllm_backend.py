"""vLLM request construction and engine settings (paper "Experiment Setup": frozen
Qwen2.5-VL-7B-Instruct, greedy decoding; appendix E.3 prompts; notes: vLLM inputs and
``max_pixels``): what the replica's ``AsyncLLM`` (:mod:`memprism_ray.policy.vllm_async`) shares
with an offline ``vllm.LLM`` (``benchmarks/bench_policy_pool.py --llm-batch``). vLLM ignores a
per-image ``max_pixels``, so it is set at start-up. vLLM is not imported here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memprism_ray.policy.base import PolicyInput
from memprism_ray.policy.chat_format import format_qwen_chat
from memprism_ray.policy.config import VLLMConfig
from memprism_ray.policy.contract import TaskContract

ChatFormatter = Callable[[list[dict[str, Any]]], str]


def engine_kwargs(config: VLLMConfig) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` (and ``AsyncEngineArgs``) for ``config``.

    ``max_num_batched_tokens`` and ``max_num_seqs`` are explicit by default, because vLLM's own
    defaults differ by usage context (issue 31); settings left at 0 / '' stay vLLM's defaults."""
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


def build_vllm_request(
    inp: PolicyInput,
    contract: TaskContract,
    *,
    limit_images: int,
    format_chat: ChatFormatter = format_qwen_chat,
    layout: str = "paper",
) -> dict[str, Any]:
    """The ``LLM.generate`` input of one decision: ``{"prompt", "multi_modal_data"?}``."""
    messages, images = contract.build_messages(inp, layout)
    if len(images) > limit_images:
        raise ValueError(f"prompt has {len(images)} images but the engine allows {limit_images} (limit_mm_per_prompt)")
    request: dict[str, Any] = {"prompt": format_chat(messages)}
    if images:
        request["multi_modal_data"] = {"image": images}
    return request
