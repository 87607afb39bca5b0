"""External memory baselines from their released packages, with local parts only (paper
"Baselines"; appendix "External baselines": "We build every external baseline from its
official public implementation ... Each memory adapter receives the same serialized sequence
of completed environment transitions, and retrieved content is placed in the same memory slot
of the task-policy prompt ... All auxiliary model calls and their token or API costs are
included in the efficiency results"). docs/baselines.md records versions, stores and why.

* ``mem0``       mem0ai 1.0.11 ``Memory``: LLM fact extraction + memory update, top-k search
* ``mem0_graph`` the same release with its graph memory on an embedded Kuzu database
* ``amem``       A-Mem as ``a-mem`` 0.2.6 on PyPI (module ``agentic_memory``, a fork of the
                 A-mem-sys repository the paper cites): notes, links, memory evolution
* ``langmem``    LangMem 0.0.30 ``create_memory_store_manager`` over a LangGraph ``InMemoryStore``

Local parts (``baselines/local.py``): every LLM call goes to ``eval.memory.base_url`` through
an in-process usage relay that charges each response's ``usage`` to the episode's memory;
embeddings come from the offline all-MiniLM-L6-v2; stores are in-process. Each memory is
closed with its episode (appendix: "keeping the memory namespace local to each episode").
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

from memprism_ray.baselines.memory import MemoryBaselineConfig, MemorySelector
from memprism_ray.llm_client import ChatClient, LLMError

__all__ = ["MemoryBaselineConfig", "external_selector"]

#: The extra every external baseline needs, and the module each one imports.
EXTRA_INSTALL = "pip install 'memprism-ray[baselines]'"
REQUIRED_MODULES: dict[str, tuple[str, ...]] = {
    "mem0": ("mem0",),
    "mem0_graph": ("mem0", "kuzu"),
    "amem": ("agentic_memory",),
    "langmem": ("langmem", "langgraph"),
}
#: Released versions the adapters are written against (docs/baselines.md).
RELEASES: dict[str, str] = {
    "mem0": "mem0ai==1.0.11",
    "mem0_graph": "mem0ai[graph]==1.0.11 (kuzu 0.11.3)",
    "amem": "a-mem==0.2.6 (module agentic_memory)",
    "langmem": "langmem==0.0.30 (langgraph InMemoryStore)",
}


#: What a vLLM server needs to accept ``tool_choice="auto"`` (vLLM docs "Tool Calling"; the
#: hermes parser reads Qwen2.5's tool-call format).
TOOL_CALL_FLAGS = "--enable-auto-tool-choice --tool-call-parser hermes"
#: A tool the model may call or not: the check needs the server to accept the request only.
_CHECK_TOOL = {
    "type": "function",
    "function": {
        "name": "memprism_tool_check",
        "description": "Start-up check of tool calling; nothing is done with the call.",
        "parameters": {"type": "object", "properties": {}},
    },
}
_TOOLS_ACCEPTED: set[tuple[str, str]] = set()
_TOOLS_LOCK = threading.Lock()


class BaselineUnavailable(ValueError):
    """A baseline cannot run here: its extra is missing, no endpoint is configured, or the
    endpoint refuses what the baseline sends."""


def check_available(condition: str, config: MemoryBaselineConfig | None) -> MemoryBaselineConfig:
    """The config, or a one-line error: no endpoint configured, the extra not installed, or
    (``mem0_graph``) an endpoint that refuses a tool call (:func:`check_tool_calling`)."""
    if config is None or not config.base_url:
        raise BaselineUnavailable(
            f"condition {condition!r} calls an LLM for its memory and no endpoint is configured: set "
            "eval.memory.base_url (memprism eval --memory-base-url) to an OpenAI-compatible server, e.g. "
            "http://127.0.0.1:8000/v1"
        )
    missing = [m for m in REQUIRED_MODULES[condition] if importlib.util.find_spec(m) is None]
    if missing:
        raise BaselineUnavailable(
            f"condition {condition!r} needs {RELEASES[condition]} (module {', '.join(missing)} not installed): "
            f"{EXTRA_INSTALL}"
        )
    if condition == "mem0_graph":
        check_tool_calling(condition, config)
    return config


def check_tool_calling(condition: str, config: MemoryBaselineConfig) -> None:
    """One small chat request with a tool and ``tool_choice="auto"``, as mem0's graph memory sends
    them, once per endpoint and model in a process: a vLLM server started without
    :data:`TOOL_CALL_FLAGS` answers HTTP 400, which would fail every episode's first write."""
    key = (config.base_url.rstrip("/"), config.model)
    with _TOOLS_LOCK:
        if key in _TOOLS_ACCEPTED:
            return
    messages = [{"role": "user", "content": "Reply with OK."}]
    try:
        with ChatClient(config) as client:
            client.chat(messages, tools=[_CHECK_TOOL], tool_choice="auto", max_tokens=16, temperature=0.0)
    except LLMError as exc:
        said = " ".join(str(exc).split())[:300]
        raise BaselineUnavailable(
            f"condition {condition!r}: mem0's graph memory sends tool calls (tool_choice='auto') and the endpoint "
            f"{config.base_url} did not accept one; serve the model with vLLM's {TOOL_CALL_FLAGS} "
            f"(docs/baselines.md). The check request got: {said}"
        ) from None
    with _TOOLS_LOCK:
        _TOOLS_ACCEPTED.add(key)


def external_selector(condition: str, config: MemoryBaselineConfig | None) -> MemorySelector:
    """The :class:`MemorySelector` of an external baseline; raises :class:`BaselineUnavailable`
    (one line, the fix included) when it cannot run (:func:`check_available`)."""
    cfg = check_available(condition, config)
    return MemorySelector(condition, lambda episode_id, goal: _memory(condition, cfg))


def _memory(condition: str, cfg: MemoryBaselineConfig) -> Any:
    """One episode's memory (each adapter loads its library only here)."""
    if condition in ("mem0", "mem0_graph"):
        from memprism_ray.baselines.mem0_adapter import Mem0Memory

        return Mem0Memory(cfg, graph=condition == "mem0_graph")
    if condition == "amem":
        from memprism_ray.baselines.amem_adapter import AMemMemory

        return AMemMemory(cfg)
    from memprism_ray.baselines.langmem_adapter import LangMemMemory

    return LangMemMemory(cfg)
