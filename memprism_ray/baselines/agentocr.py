"""The ``agentocr`` condition: AgentOCR (w/o RL) optical history on equal terms (paper appendix
"Optical baseline scope"): the last 50 steps drawn flat as one image in AgentOCR's ALFWorld
format (:mod:`memprism_ray.render.flat_history`), shown in the view slot; no auxiliary model.
"""

from __future__ import annotations

from memprism_ray.baselines.memory import MemoryCounters, MemorySelector, MemoryView
from memprism_ray.policy.base import HistoryRecord
from memprism_ray.render.flat_history import FlatHistoryConfig, render_flat_history


class FlatHistoryMemory:
    """One episode's completed steps, drawn whole at every decision."""

    def __init__(self, config: FlatHistoryConfig | None = None) -> None:
        self.config = config or FlatHistoryConfig()
        self.records: list[HistoryRecord] = []
        self.counters = MemoryCounters()

    def write(self, record: HistoryRecord, goal: str) -> None:
        self.records.append(record)

    def retrieve(self, goal: str, observation: str, history: tuple[HistoryRecord, ...]) -> MemoryView:
        rendered = render_flat_history(self.records, self.config)
        return MemoryView(image=rendered.image, visual_tokens=rendered.visual_tokens, image_text=rendered.text)

    def close(self) -> None:
        self.records.clear()


def agentocr_selector(config: FlatHistoryConfig | None = None) -> MemorySelector:
    cfg = config or FlatHistoryConfig()
    return MemorySelector("agentocr", lambda episode_id, goal: FlatHistoryMemory(cfg))
