"""What the Composer reads off one recorded step (paper "Composer", appendix C.1 and C.3).

An :class:`EventView` is an immutable, display-ready reading of one
:class:`~memprism_ray.recorder.StreamRecord`: the structured event, the executed action as
text, each accepted delta with its entity/attribute split (``recorder.split_key``) and
whether it changed the tracked state, the event's normalised terms (for goal matching)
and its link entities (for DependencyChain).

A reading is rebuilt at every compose (nothing is cached): at the paper's horizons
(<= 50 events) a per-record cache saved at most 1.13x of a whole decision's compose +
render (``benchmarks/bench_views.py --horizons-only``), below the 1.3x a cache must buy.
"""

from __future__ import annotations

from dataclasses import dataclass

from memprism_ray.composer.terms import text_terms
from memprism_ray.recorder.events import Outcome, split_key
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

    @property
    def changed_deltas(self) -> tuple[DeltaView, ...]:
        """Deltas that changed the tracked state (what medium/coarse views display)."""
        return tuple(d for d in self.deltas if d.changed)


def _build(record: StreamRecord) -> EventView:
    ev = record.event
    changed = record.changed if len(record.changed) == len(ev.delta) else (True,) * len(ev.delta)
    deltas = []
    term_texts = [ev.entity, record.raw.action_text]
    # DependencyChain links events that share an entity or a state-key prefix, the agent's
    # own keys (agent.location, agent.holding) included: the paper links "events that share
    # entities, state keys, or nearby time steps" ("Composer", DependencyChain) and its view
    # teacher lists "same-entity or shared state/delta-key-prefix events" (appendix D); no
    # entity is exempt.
    links = set()
    if ev.entity:
        links.add(ev.entity)
    for d, flag in zip(ev.delta, changed):
        entity, attribute = split_key(d.key)
        deltas.append(DeltaView(d.key, entity, attribute, d.new_value, bool(flag), text_terms(d.new_value)))
        term_texts.append(d.key)
        term_texts.append(d.new_value)
        if entity:
            links.add(entity)
    action = " ".join(record.raw.action_text.split())
    return EventView(
        t=ev.t,
        entity=ev.entity,
        act=ev.act,
        action=action,
        outcome=ev.outcome,
        deltas=tuple(deltas),
        terms=text_terms(" | ".join(term_texts)),
        link_entities=frozenset(links),
    )


def event_view(record: StreamRecord) -> EventView:
    """The :class:`EventView` of ``record``."""
    if not isinstance(record, StreamRecord):
        raise ValueError(f"the Composer reads StreamRecords (an EventStream's items), got {type(record).__name__}")
    return _build(record)
