"""Mem0 and Mem0^g from the released ``mem0ai`` 1.0.11 (paper appendix "External baselines",
"Mem0 and Mem0^g": "the release's standard extraction and memory-update pipeline over the
serialized transitions"; Mem0^g "enables the graph-memory configuration ... left at the
recommended values"). 1.0.11 is the last release with the ``graph`` extra (2.0.0 dropped
it); both variants use it so they differ only in the graph store.

Write and retrieve follow the release's README "Basic Usage": every completed transition is
``memory.add(messages, user_id=...)`` (LLM fact extraction, then the LLM memory-update
decision over the top similar memories), and every decision is
``memory.search(query=..., user_id=..., limit=3)`` whose ``results[*]["memory"]`` are shown
as ``- memory`` lines; with the graph store on, ``relations`` (BM25-reranked
``source -- relationship -- destination`` triples) follow.

Local parts (mem0's documented config keys): ``llm`` provider ``openai`` with
``openai_base_url`` (the usage relay to ``memory.base_url``); ``embedder`` provider
``langchain`` with the shared offline MiniLM (384 dims); ``vector_store`` Qdrant with an
in-process ``QdrantClient(":memory:")``; history in SQLite ``:memory:``; ``graph_store``
provider ``kuzu`` with ``db: ":memory:"`` (mem0 docs "Graph Memory", "Kuzu (embedded)":
Kuzu runs in-process, no server, unlike Neo4j/Memgraph/Neptune/AGE). Telemetry is off.
"""

from __future__ import annotations

import os
from typing import Any

from memprism_ray.baselines.local import MINILM_DIMS, langchain_embeddings, relay_for
from memprism_ray.baselines.memory import (
    MemoryBaselineConfig,
    MemoryCounters,
    MemoryView,
    as_view,
    retrieval_query,
    serialize_transition,
)
from memprism_ray.policy.base import HistoryRecord

#: README "Basic Usage": ``memory.search(query=message, user_id=user_id, limit=3)``.
DEFAULT_LIMIT = 3
USER_ID = "agent"


def mem0_config(llm_base_url: str, config: MemoryBaselineConfig, embeddings: Any, graph: bool) -> dict[str, Any]:
    from qdrant_client import QdrantClient

    out: dict[str, Any] = {
        "llm": {
            "provider": "openai",
            "config": {"model": config.model, "openai_base_url": llm_base_url, "api_key": config.library_key()},
        },
        "embedder": {"provider": "langchain", "config": {"model": embeddings, "embedding_dims": MINILM_DIMS}},
        "vector_store": {
            "provider": "qdrant",
            "config": {
                "collection_name": "mem0",
                "embedding_model_dims": MINILM_DIMS,
                "client": QdrantClient(location=":memory:"),
            },
        },
        "history_db_path": ":memory:",
    }
    if graph:
        out["graph_store"] = {"provider": "kuzu", "config": {"db": ":memory:"}}
    return out


class Mem0Memory:
    """One episode's Mem0 (``graph=True``: Mem0^g)."""

    def __init__(self, config: MemoryBaselineConfig, *, graph: bool) -> None:
        os.environ.setdefault("MEM0_TELEMETRY", "False")  # read at import: no network calls
        from mem0 import Memory

        self.counters = MemoryCounters()
        self.graph = graph
        self.limit = config.top_k or DEFAULT_LIMIT
        self._relay = relay_for(config)
        self._key, base_url = self._relay.register(self.counters)
        self.memory = Memory.from_config(mem0_config(base_url, config, langchain_embeddings(self.counters), graph))

    def write(self, record: HistoryRecord, goal: str) -> None:
        self.memory.add([{"role": "user", "content": serialize_transition(record)}], user_id=USER_ID)

    def retrieve(self, goal: str, observation: str, history: tuple[HistoryRecord, ...]) -> MemoryView:
        found = self.memory.search(query=retrieval_query(goal, observation), user_id=USER_ID, limit=self.limit)
        lines = [str(m.get("memory", "")) for m in found.get("results", [])]
        for rel in found.get("relations", []) or []:
            lines.append(f"{rel.get('source')} -- {rel.get('relationship')} -- {rel.get('destination')}")
        return as_view(lines)

    def close(self) -> None:
        self._relay.unregister(self._key)
        self.memory.close()
