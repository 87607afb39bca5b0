"""LangMem from the released ``langmem`` 0.0.30 (paper appendix "External baselines",
"LangMem": "Completed transitions are processed through its stateful memory manager and
stored as a searchable collection; at decision time, the task goal and current observation
form the retrieval query ... its standard consolidation logic and query limit, while keeping
the memory namespace local to each episode").

Following ``create_memory_store_manager``'s documentation ("Using with a LangGraph entrypoint"):
each transition is ``manager.invoke({"messages": [...]})``, each decision
``manager.search(query=...)`` limited to ``query_limit`` (or ``memory.top_k``). Local parts: a
``ChatOpenAI`` pointed at the usage relay, and one in-process ``InMemoryStore`` per episode whose
index embeds with the shared offline MiniLM (LangGraph's documented custom-embedding hook).
"""

from __future__ import annotations

from typing import Any

from memprism_ray.baselines.local import MINILM_DIMS, RelayedMemory, langchain_embeddings
from memprism_ray.baselines.memory import MemoryBaselineConfig

#: ``create_memory_store_manager(query_limit=5)``: the release's default.
DEFAULT_LIMIT = 5
NAMESPACE = ("memories",)


def _content(value: Any) -> str:
    """A hit's memory text: the stored ``{"kind", "content"}`` record, coerced by LangMem to its
    schema (the default ``Memory`` model, whose field is ``content``)."""
    for _ in range(2):
        if isinstance(value, dict):
            value = value.get("content", value)
    return str(getattr(value, "content", value))


class LangMemMemory(RelayedMemory):
    """One episode's LangMem store manager."""

    def __init__(self, config: MemoryBaselineConfig) -> None:
        from langchain_openai import ChatOpenAI
        from langgraph.store.memory import InMemoryStore
        from langmem import create_memory_store_manager

        super().__init__(config, DEFAULT_LIMIT)
        # The relay retries (eval.memory); the SDK's own retries would repeat its attempts.
        key, timeout = config.library_key(), config.budget_s()
        model = ChatOpenAI(model=config.model, base_url=self.base_url, api_key=key, timeout=timeout, max_retries=0)
        self.store = InMemoryStore(index={"dims": MINILM_DIMS, "embed": langchain_embeddings(self.counters)})
        self.manager = create_memory_store_manager(
            model, namespace=NAMESPACE, store=self.store, query_limit=DEFAULT_LIMIT
        )

    def add(self, transition: str) -> None:
        self.manager.invoke({"messages": [{"role": "user", "content": transition}]})

    def search(self, query: str) -> list[str]:
        return [_content(h.value) for h in self.manager.search(query=query, limit=self.top_k)]
