"""Mem0 and Mem0^g from the released ``mem0ai`` 1.0.11 (paper appendix "External baselines",
"Mem0 and Mem0^g": "the release's standard extraction and memory-update pipeline over the
serialized transitions"; Mem0^g "enables the graph-memory configuration ... left at the
recommended values"). 1.0.11 is the last release with the ``graph`` extra (2.0.0 dropped
it); both variants use it so they differ only in the graph store.

Following the README "Basic Usage": each transition is ``memory.add(messages, user_id=...)``,
each decision ``memory.search(query=..., user_id=..., limit=3)``, its memories (and with the
graph store its ``relations`` triples) shown one per line. Local parts, through mem0's documented
config keys: the usage relay as ``openai_base_url``, the shared offline MiniLM, an in-process
Qdrant, SQLite ``:memory:`` history and an embedded Kuzu graph store (no server, unlike
Neo4j/Memgraph). Telemetry is off.
"""

from __future__ import annotations

import os
from typing import Any

from memprism_ray.baselines.local import MINILM_DIMS, RelayedMemory, langchain_embeddings
from memprism_ray.baselines.memory import MemoryBaselineConfig

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


class Mem0Memory(RelayedMemory):
    """One episode's Mem0 (``graph=True``: Mem0^g)."""

    def __init__(self, config: MemoryBaselineConfig, *, graph: bool) -> None:
        os.environ.setdefault("MEM0_TELEMETRY", "False")  # read at import: no network calls
        from mem0 import Memory

        super().__init__(config, DEFAULT_LIMIT)
        self.graph = graph
        self.memory = Memory.from_config(mem0_config(self.base_url, config, langchain_embeddings(self.counters), graph))

    def add(self, transition: str) -> None:
        self.memory.add([{"role": "user", "content": transition}], user_id=USER_ID)

    def search(self, query: str) -> list[str]:
        found = self.memory.search(query=query, user_id=USER_ID, limit=self.top_k)
        lines = [str(m.get("memory", "")) for m in found.get("results", [])]
        for rel in found.get("relations", []) or []:
            lines.append(f"{rel.get('source')} -- {rel.get('relationship')} -- {rel.get('destination')}")
        return lines

    def close(self) -> None:
        super().close()
        self.memory.close()
