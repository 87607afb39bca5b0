"""What the Composer reads off one recorded step (paper "Composer", appendix D.1 and D.3):
an immutable, display-ready :class:`EventView`, cached by content (``_reading``), not by identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from memprism_ray.composer.terms import text_terms
from memprism_ray.recorder.events import Outcome, StateDelta, split_key
from memprism_ray.recorder.stream import StreamRecord


@dataclass(frozen=True, slots=True)
class DeltaView:
    """One accepted ``(key, new_value)`` with its split key and change flag."""

    key: str
    entity: str
    attribute: str
    value: str
    changed: bool
    value_terms: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class EventView:
    """A recorded step as every compiler sees it (read-only)."""

    t: int
    entity: str
    act: str
    action: str
    outcome: Outcome
    deltas: tuple[DeltaView, ...]
    terms: frozenset[str]
    link_entities: frozenset[str]


# Kept, keyed by content (every input of the reading, never an object id): with goal
# restore over the whole history (the paper's Merge, the default) every decision reads
# every recorded step again (benchmarks/results/bench_views.json, "no event-reading cache").
@lru_cache(maxsize=8192)
def _reading(
    t: int,
    entity: str,
    act: str,
    outcome: Outcome,
    delta: tuple[StateDelta, ...],
    action_text: str,
    flags: tuple[bool, ...],
) -> EventView:
    changed = flags if len(flags) == len(delta) else (True,) * len(delta)
    deltas = []
    term_texts = [entity, action_text]
    # Link entities: every entity and key prefix, the agent's included ("events that share
    # entities, state keys, or nearby time steps", "Composer"; appendix E.2).
    links = set()
    if entity:
        links.add(entity)
    for d, flag in zip(delta, changed, strict=True):
        key_entity, attribute = split_key(d.key)
        deltas.append(DeltaView(d.key, key_entity, attribute, d.new_value, bool(flag), text_terms(d.new_value)))
        term_texts.append(d.key)
        term_texts.append(d.new_value)
        if key_entity:
            links.add(key_entity)
    return EventView(
        t=t,
        entity=entity,
        act=act,
        action=" ".join(action_text.split()),
        outcome=outcome,
        deltas=tuple(deltas),
        terms=text_terms(" | ".join(term_texts)),
        link_entities=frozenset(links),
    )


def event_view(record: StreamRecord) -> EventView:
    """The :class:`EventView` of ``record``."""
    if not isinstance(record, StreamRecord):
        raise ValueError(f"the Composer reads StreamRecords (an EventStream's items), got {type(record).__name__}")
    ev = record.event
    return _reading(ev.t, ev.entity, ev.act, ev.outcome, ev.delta, record.raw.action_text, record.changed)
