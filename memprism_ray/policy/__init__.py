"""Task policies (paper "Render", eq. task-policy; appendix E.3-E.5): the batched
:class:`TaskPolicy` protocol, the paper's versioned prompts, the task contracts (a benchmark's
prompt and parser) and the vllm, openai, hf and scripted backends. Backends are imported lazily
(``make_policy``), so importing this package pulls in neither vLLM, httpx nor transformers.
"""

from memprism_ray.policy.base import HistoryRecord, PolicyBackendError, PolicyInput, PolicyOutput, TaskPolicy
from memprism_ray.policy.config import HFConfig, OpenAIConfig, PolicyConfig, VLLMConfig
from memprism_ray.policy.contract import TaskContract
from memprism_ray.policy.factory import make_policy
from memprism_ray.policy.parsing import ParseResult
from memprism_ray.policy.prompts import PROMPT_VERSION

__all__ = [
    "PROMPT_VERSION",
    "HFConfig",
    "HistoryRecord",
    "OpenAIConfig",
    "ParseResult",
    "PolicyBackendError",
    "PolicyConfig",
    "PolicyInput",
    "PolicyOutput",
    "TaskContract",
    "TaskPolicy",
    "VLLMConfig",
    "make_policy",
]
