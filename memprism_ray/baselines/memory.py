"""Memory-interface conditions: baselines that keep their own per-episode memory and put
what it returns into the prompt's view slot (paper appendix "External baselines": "Each
memory adapter receives the same serialized sequence of completed environment
transitions, and retrieved content is placed in the same memory slot of the task-policy
prompt"; "All auxiliary model calls and their token or API costs are included in the
efficiency results").

A :class:`MemorySelector` shows no MemPrism view; the agent asks it for one
:class:`EpisodeMemory` per episode, retrieves from it before every decision (text or an image
for the view slot) and writes every completed step to it. Each memory counts its auxiliary
calls and tokens (:class:`MemoryCounters`), which the step rows and reports carry. Also the
common protocol of the external baselines: endpoint config, transition text, query, view block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, runtime_checkable

from PIL import Image

from memprism_ray.baselines.base import DecisionContext, ViewDecision
from memprism_ray.config_tree import field
from memprism_ray.llm_client import EndpointConfig
from memprism_ray.policy.base import HistoryRecord


@dataclass
class MemoryBaselineConfig(EndpointConfig):
    """The LLM endpoint and retrieval settings of the external memory baselines (``eval.memory``);
    the usage relay sends every library call with these retries."""

    SECTION: ClassVar[str] = "eval.memory"
    BASE_URL_REQUIRED: ClassVar[bool] = False

    base_url: str = field("", help="OpenAI-compatible endpoint root (…/v1) for the baselines' LLM calls; required")
    model: str = field("Qwen/Qwen2.5-7B-Instruct", help="model name the endpoint serves for memory writes/queries")
    api_key_env: str = field(
        "OPENAI_API_KEY", help="environment variable holding the endpoint's key (unset: the placeholder 'EMPTY')"
    )
    timeout_s: float = field(300.0, help="seconds one LLM request may take before it fails")
    max_retries: int = field(2, help="relay retries after a timeout, connection error or HTTP 408/409/429/5xx")
    top_k: int = field(0, help="memories retrieved per decision (0: each release's documented default)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model:
            raise ValueError("eval.memory.model must name the model the endpoint serves")
        if self.top_k < 0:
            raise ValueError(f"eval.memory.top_k must be >= 0 (0: the release's default), got {self.top_k}")

    def library_key(self) -> str:
        """The key given to a library's client (the OpenAI SDK refuses an empty one)."""
        return self.api_key() or "EMPTY"


def serialize_transition(record: HistoryRecord) -> str:
    """One completed transition as every adapter receives it (the ALFWorld prompt's record line)."""
    return (
        f"[Step {record.step + 1}] Observation: {record.observation} Action: {record.action} Result: {record.feedback}"
    )


def retrieval_query(goal: str, observation: str) -> str:
    """The query of every decision: the task goal and the current observation."""
    return f"Task: {goal}\nCurrent observation: {observation}"


@dataclass
class MemoryCounters:
    """Auxiliary costs of one memory, cumulative (appendix C efficiency metrics)."""

    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embed_calls: int = 0
    #: LLM calls whose response carried no ``usage`` (tokens unknown, counted, never guessed).
    calls_without_usage: int = 0

    def snapshot(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}

    def add(self, other: MemoryCounters) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


#: Step-row columns holding the per-decision increments of :class:`MemoryCounters`.
ROW_KEYS: dict[str, str] = {f.name: f"memory_{f.name}" for f in fields(MemoryCounters)}


@dataclass(frozen=True)
class MemoryView:
    """What a memory puts into the view slot for one decision: text, an image or nothing;
    ``image_text``: the text an image shows (the scripted stand-in's perfect OCR)."""

    text: str | None = None
    image: Image.Image | None = None
    visual_tokens: int = 0
    image_text: str | None = None

    def __post_init__(self) -> None:
        if self.text is not None and self.image is not None:
            raise ValueError("a MemoryView holds text or an image, not both")

    @property
    def medium(self) -> str:
        return "optical" if self.image is not None else "text" if self.text is not None else "none"

    @property
    def pixels(self) -> int:
        return 0 if self.image is None else self.image.width * self.image.height


@runtime_checkable
class EpisodeMemory(Protocol):
    """One episode's memory: ``write`` once per completed step but the last, ``retrieve`` once per decision."""

    counters: MemoryCounters

    def write(self, record: HistoryRecord, goal: str) -> None: ...

    def retrieve(self, goal: str, observation: str, history: tuple[HistoryRecord, ...]) -> MemoryView: ...

    def close(self) -> None: ...


class MemorySelector:
    """A condition whose prompt slot holds what a per-episode memory retrieves."""

    uses_features = False

    def __init__(self, name: str, factory: Callable[[str, str], EpisodeMemory]) -> None:
        self.name = name
        self._factory = factory

    def new_memory(self, episode_id: str, goal: str) -> EpisodeMemory:
        """A fresh memory for one episode (namespaces never shared: no cross-task leakage)."""
        return self._factory(episode_id, goal)

    def select(self, contexts: Sequence[DecisionContext], features: object | None = None) -> list[ViewDecision]:
        return [ViewDecision(None, "none") for _ in contexts]


def memory_totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Sums of the memory counters over step rows (``None`` when no row has them) and the
    per-decision means of calls and tokens."""
    if not any(ROW_KEYS["llm_calls"] in r for r in rows):
        return None
    totals = {key: int(sum(int(r.get(col, 0) or 0) for r in rows)) for key, col in ROW_KEYS.items()}
    n = max(len(rows), 1)
    totals["llm_calls_per_decision"] = totals["llm_calls"] / n
    totals["tokens_per_decision"] = (totals["prompt_tokens"] + totals["completion_tokens"]) / n
    totals["memory_ms_mean"] = sum(float(r.get("memory_ms", 0.0) or 0.0) for r in rows) / n
    return totals


def as_view(lines: list[str]) -> MemoryView:
    """Retrieved items as the view slot's text block (nothing retrieved: no block)."""
    lines = [ln for ln in (s.strip() for s in lines) if ln]
    return MemoryView(text="\n".join(f"- {ln}" for ln in lines)) if lines else MemoryView()
