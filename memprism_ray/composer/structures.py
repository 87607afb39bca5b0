"""Typed relational structures ``S_t = C_{tau,gamma}(E^_t)`` (paper "Composer", the four
relation paragraphs, appendix D.3): frozen dataclasses of tuples, hashable, with no text layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from memprism_ray.composer.select import SelectedEvent
from memprism_ray.recorder.events import Outcome, TextEnum
from memprism_ray.view_space import ViewAction

OUTCOME_ORDER: tuple[Outcome, ...] = (Outcome.EXCEPTION, Outcome.STATE_UPDATE, Outcome.NO_OBSERVED_CHANGE)

Histogram = tuple[tuple[Outcome, int], ...]


def histogram(items: tuple[SelectedEvent, ...] | list[SelectedEvent]) -> Histogram:
    """Outcome counts in the fixed order exception, state_update, no_observed_change."""
    counts = dict.fromkeys(OUTCOME_ORDER, 0)
    for it in items:
        counts[it.event.outcome] += 1
    return tuple((o, counts[o]) for o in OUTCOME_ORDER)


@dataclass(frozen=True, slots=True)
class TraceRun:
    """A run of consecutive selected events with the same outcome, shown as one entry:
    its first and latest event and how many it stands for (``count >= 2``)."""

    first: SelectedEvent
    last: SelectedEvent
    count: int
    outcome: Outcome
    goal_match: bool


@dataclass(frozen=True, slots=True)
class TraceGap:
    """Coarse only: consecutive events collapsed into a count between kept events."""

    first_t: int
    last_t: int
    count: int
    histogram: Histogram


#: A shown event is its :class:`SelectedEvent` itself (no wrapper: fine views hold many).
TraceEntry = SelectedEvent | TraceRun | TraceGap


@dataclass(frozen=True, slots=True)
class TemporalTrace:
    """Events ordered by time: action order and task progress."""

    entries: tuple[TraceEntry, ...]

    @property
    def entry_count(self) -> int:
        return len(self.entries)


@dataclass(frozen=True, slots=True)
class EffectGroup:
    """Repeated attempts of one (action type, entity) pair; ``numbers``: the shown attempts' 1-based numbers."""

    act: str
    entity: str
    count: int
    histogram: Histogram
    attempts: tuple[SelectedEvent, ...]
    numbers: tuple[int, ...]
    first_t: int
    latest_t: int
    goal_match: bool

    def shown(self) -> tuple[tuple[int, SelectedEvent], ...]:
        """``(attempt number, attempt)`` pairs in time order."""
        return tuple(zip(self.numbers, self.attempts, strict=True))


@dataclass(frozen=True, slots=True)
class ActionEffect:
    """Groups ordered by their latest attempt (most recent last)."""

    groups: tuple[EffectGroup, ...]

    @property
    def entry_count(self) -> int:
        return sum(len(g.attempts) for g in self.groups)


@dataclass(frozen=True, slots=True)
class StateValue:
    """An accepted new value with its source step, action type and change flag."""

    value: str
    t: int
    act: str
    changed: bool
    goal_match: bool


@dataclass(frozen=True, slots=True)
class StateChain:
    """Ordered chain of new values of one state key. ``total`` counts every update of the
    key in the selection; ``elided`` how many distinct changes a coarse chain skips."""

    key: str
    attribute: str
    values: tuple[StateValue, ...]
    total: int
    elided: int


@dataclass(frozen=True, slots=True)
class EntityRow:
    """All state chains of one entity (keys in order of first update)."""

    entity: str
    chains: tuple[StateChain, ...]
    first_t: int
    latest_t: int
    goal_match: bool


@dataclass(frozen=True, slots=True)
class EntityState:
    """Entities ordered by their latest update (most recent last); no inferred old values."""

    rows: tuple[EntityRow, ...]

    @property
    def entry_count(self) -> int:
        return sum(len(c.values) for r in self.rows for c in r.chains)


class LinkKind(TextEnum):
    """Why an event is linked to the anchor, in priority order."""

    ANCHOR = "anchor"
    PREVIOUS = "previous"
    SAME_ENTITY = "same_entity"
    SHARED_KEY = "shared_key"
    CONTEXT = "context"


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One chain event; ``via`` names the shared entities/key prefixes for a link."""

    item: SelectedEvent
    kind: LinkKind
    via: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DependencyChain:
    """Anchor (the latest event) and linked earlier events in priority order; ``candidates``: how many
    selected events competed for the places after anchor and previous."""

    links: tuple[ChainLink, ...]
    cap: int
    candidates: int

    @property
    def anchor(self) -> ChainLink | None:
        return self.links[0] if self.links else None

    @property
    def entry_count(self) -> int:
        return len(self.links)


ViewBody = TemporalTrace | ActionEffect | EntityState | DependencyChain


@dataclass(frozen=True, slots=True)
class View:
    """A compiled view: the action, the goal, stream/scope sizes and the typed body."""

    action: ViewAction
    goal: str
    goal_terms: tuple[str, ...]
    n_stream: int
    n_scope: int
    n_selected: int
    body: ViewBody

    @property
    def entry_count(self) -> int:
        return self.body.entry_count
