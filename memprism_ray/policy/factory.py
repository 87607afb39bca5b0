"""Build the configured task policy (paper "Render", eq. task-policy: one frozen policy
``pi_task`` behind every condition; docs/architecture.md "Task policy": vllm, openai, hf, scripted).

Backends are imported only when chosen, so selecting ``scripted`` never imports vLLM or
transformers. The scripted CPU stand-in lives in ``memprism_ray.policy.scripted`` and is
looked up by module path: it must expose ``ScriptedPolicy``, built with
``ScriptedPolicy.from_config(config)`` when that classmethod exists, else
``ScriptedPolicy(**config.scripted)``.
"""

from __future__ import annotations

import importlib
import importlib.util

from memprism_ray.policy.base import TaskPolicy
from memprism_ray.policy.config import PolicyConfig

SCRIPTED_MODULE = "memprism_ray.policy.scripted"


def _scripted(config: PolicyConfig) -> TaskPolicy:
    if importlib.util.find_spec(SCRIPTED_MODULE) is None:
        raise ValueError(f"policy.backend=scripted needs the module {SCRIPTED_MODULE}, which is not installed")
    module = importlib.import_module(SCRIPTED_MODULE)
    cls = getattr(module, "ScriptedPolicy", None)
    if cls is None:
        raise ValueError(f"{SCRIPTED_MODULE} does not define ScriptedPolicy")
    if hasattr(cls, "from_config"):
        policy = cls.from_config(config)
    else:
        try:
            policy = cls(**config.scripted)
        except TypeError as exc:
            raise ValueError(f"policy.scripted settings {sorted(config.scripted)} rejected: {exc}") from None
    if not isinstance(policy, TaskPolicy):
        raise ValueError(f"{SCRIPTED_MODULE}.ScriptedPolicy does not implement TaskPolicy (name, act(inputs))")
    return policy


#: Backends whose model lives in the policy pool's replicas (docs/gpu.md): a rollout,
#: labelling or evaluation worker never builds one itself.
POOL_BACKENDS = ("vllm", "hf")


def make_policy(config: PolicyConfig) -> TaskPolicy:
    """The :class:`TaskPolicy` selected by ``config.backend``."""
    if config.backend == "vllm":
        # vLLM's engine lives in the policy pool's replicas (AsyncLLM, docs/gpu.md), never in a caller.
        raise ValueError("policy.backend=vllm runs in the Ray policy pool's replicas (policy.num_replicas >= 1)")
    if config.backend == "openai":
        from memprism_ray.policy.openai_backend import OpenAIChatPolicy

        return OpenAIChatPolicy(config.openai)
    if config.backend == "hf":
        from memprism_ray.policy.hf_backend import HFPolicy

        return HFPolicy(config.hf)
    if config.backend == "scripted":
        return _scripted(config)
    raise ValueError(f"unknown policy backend {config.backend!r}")


def needs_view_text(config: PolicyConfig) -> bool:
    """Whether the configured policy reads the view as text even in optical conditions
    (the scripted stand-in cannot read pixels), without building the policy."""
    if config.backend != "scripted":
        return False
    cls = getattr(importlib.import_module(SCRIPTED_MODULE), "ScriptedPolicy", None)
    return bool(getattr(cls, "needs_view_text", False))
