"""Task policies (paper "Render", eq. task-policy; appendix E.3-E.5): the batched
:class:`TaskPolicy` protocol, the paper's versioned prompts, action parsers and the vllm,
openai, hf and scripted backends. Backends are imported lazily (``make_policy``), so
importing this package pulls in neither vLLM, httpx nor transformers.
"""

from memprism_ray.policy.base import (
    BENCHMARKS,
    HistoryRecord,
    PolicyBackendError,
    PolicyInput,
    PolicyOutput,
    TaskPolicy,
)
from memprism_ray.policy.config import HFConfig, OpenAIConfig, PolicyConfig, VLLMConfig
from memprism_ray.policy.factory import make_policy
from memprism_ray.policy.parsing import ParseResult, parse_action
from memprism_ray.policy.prompts import PROMPT_VERSION, build_messages, build_prompt_text

__all__ = [
    "BENCHMARKS",
    "PROMPT_VERSION",
    "HFConfig",
    "HistoryRecord",
    "OpenAIConfig",
    "ParseResult",
    "PolicyBackendError",
    "PolicyConfig",
    "PolicyInput",
    "PolicyOutput",
    "TaskPolicy",
    "VLLMConfig",
    "build_messages",
    "build_prompt_text",
    "make_policy",
    "parse_action",
]
