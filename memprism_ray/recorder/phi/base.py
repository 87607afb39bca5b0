"""The event extractor interface Phi (paper: "Recorder"; appendix D.1-D.2).

"An event extractor Phi, together with rule-based checks, maps the raw event to" the
structured event; the :class:`~memprism_ray.recorder.stream.EventStream` validates the deltas,
assigns ``t`` and classifies the outcome. Extractors never see or produce old values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from memprism_ray.recorder.events import Event, Outcome, RawEvent, StateDelta
from memprism_ray.recorder.stream import EventStream


@dataclass(frozen=True, slots=True)
class Extraction:
    """What an extractor read off one raw event; ``outcome`` forces one (``None``: the stream classifies)."""

    entity: str
    act: str
    delta: tuple[StateDelta, ...] = ()
    failed: bool = False
    outcome: Outcome | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Phi(Protocol):
    """An event extractor: ``(raw event, latest known state) -> Extraction``."""

    name: str

    def extract(self, raw: RawEvent, known_state: Mapping[str, str]) -> Extraction: ...


def record_event(stream: EventStream, raw: RawEvent, phi: Phi) -> Event:
    """Run ``phi`` on ``raw`` against the stream's tracked state and append the result."""
    return record_extraction(stream, raw, phi.extract(raw, stream.state))


def record_extraction(stream: EventStream, raw: RawEvent, ex: Extraction) -> Event:
    """Append ``raw`` with what an extractor read off it; the stream validates the deltas,
    assigns ``t`` and, unless ``ex`` forces it, classifies the outcome (appendix D.1)."""
    return stream.record(
        raw,
        entity=ex.entity,
        act=ex.act,
        delta=ex.delta,
        failed=ex.failed,
        outcome=ex.outcome,
        evidence=ex.evidence,
    )
