"""Build the configured task policy (paper "Render", eq. task-policy: one frozen policy
``pi_task`` behind every condition; docs/architecture.md "Task policy"). Backends are imported
only when chosen, so ``scripted`` never imports vLLM or transformers."""

from __future__ import annotations

from memprism_ray.policy.base import TaskPolicy
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.policy.contract import TaskContract


def make_policy(config: PolicyConfig, contract: TaskContract) -> TaskPolicy:
    """The :class:`TaskPolicy` selected by ``config.backend``, speaking ``contract``."""
    if config.backend == "vllm":
        # vLLM's engine lives in the policy pool's replicas (AsyncLLM, docs/gpu.md), never in a caller.
        raise ValueError("policy.backend=vllm runs in the Ray policy pool's replicas (policy.num_replicas >= 1)")
    if config.backend == "openai":
        from memprism_ray.policy.openai_backend import OpenAIChatPolicy

        return OpenAIChatPolicy(config.openai, contract)
    if config.backend == "hf":
        from memprism_ray.policy.hf_backend import HFPolicy

        return HFPolicy(config.hf, contract)
    if config.backend == "scripted":
        return contract.scripted_policy(config)
    raise ValueError(f"unknown policy backend {config.backend!r}")


def needs_view_text(config: PolicyConfig, contract: TaskContract) -> bool:
    """Whether the configured policy reads the view as text even in optical conditions."""
    if config.backend != "scripted":
        return False
    return bool(getattr(contract.stand_in_class(), "needs_view_text", False))
