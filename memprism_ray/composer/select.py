"""Event selection ``Select(E_<t, w, c, g)`` (paper "Composer: Relational View Construction",
eq. event-select, and appendix D.3)::

    E^_t = Merge( sigma_{w,c}(E_<t), TaskRelevant(E_<t, g), RecentContext(E_<t, tau) )

``TaskRelevant`` restores goal-matching events from where :attr:`ComposerConfig.goal_restore`
says: ``"history"`` (default: "scope is a principal selection rule rather than an irreversible
deletion", D.3), ``"window"`` or ``"off"`` (an ablation). ``RecentContext``: for DependencyChain
the anchor and the event before it come from the unfiltered stream. Merge keeps time order and
records why each event is in and whether it matches the goal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memprism_ray.composer.records import EventView, event_view
from memprism_ray.composer.terms import goal_terms
from memprism_ray.recorder.events import Outcome, TextEnum
from memprism_ray.recorder.stream import EventStream, StreamRecord
from memprism_ray.view_space import WINDOW_SIZES, ViewAction

GOAL_RESTORE_MODES: tuple[str, ...] = ("window", "history", "off")


@dataclass(frozen=True)
class ComposerConfig:
    """Settings of the Composer (the paper fixes everything else)."""

    goal_restore: str = field(
        default="history",
        metadata={
            "help": "where goal-matching events are restored from: history (the paper's Merge, default) | "
            "window (inside the time window only) | off"
        },
    )

    def __post_init__(self) -> None:
        if self.goal_restore not in GOAL_RESTORE_MODES:
            raise ValueError(
                f"ComposerConfig.goal_restore must be one of {', '.join(GOAL_RESTORE_MODES)}, got {self.goal_restore!r}"
            )


class Reason(TextEnum):
    """Why an event is in the selection (the Merge term that put it there)."""

    SCOPE = "scope"
    GOAL_RESTORE = "goal_restore"
    RECENT_CONTEXT = "recent_context"


@dataclass(frozen=True, slots=True)
class SelectedEvent:
    """One selected event, why it is selected, and whether it matches the goal."""

    event: EventView
    reason: Reason
    goal_match: bool

    @property
    def t(self) -> int:
        return self.event.t


@dataclass(frozen=True, slots=True)
class Selection:
    """``E^_t``: the merged selection in time order; ``recent_ts``: the stream's last two ``t``."""

    action: ViewAction
    goal: str
    goal_terms: tuple[str, ...]
    items: tuple[SelectedEvent, ...]
    n_stream: int
    n_scope: int
    recent_ts: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.items)

    @property
    def ts(self) -> tuple[int, ...]:
        return tuple(it.event.t for it in self.items)

    def count(self, reason: Reason) -> int:
        return sum(1 for it in self.items if it.reason is reason)


DEFAULT_CONFIG = ComposerConfig()


def as_records(stream_or_records: Any) -> Sequence[StreamRecord]:
    """Accept an :class:`EventStream` or a sequence of its :class:`StreamRecord` items."""
    if isinstance(stream_or_records, EventStream):
        return stream_or_records
    if isinstance(stream_or_records, (list, tuple)):
        for i, rec in enumerate(stream_or_records):
            if not isinstance(rec, StreamRecord):
                raise ValueError(f"record {i} is a {type(rec).__name__}, not a StreamRecord")
        for i in range(1, len(stream_or_records)):
            if stream_or_records[i].event.t <= stream_or_records[i - 1].event.t:
                raise ValueError(f"records are not in time order at position {i}")
        return stream_or_records
    raise ValueError(
        f"select expects an EventStream or a sequence of StreamRecords, got {type(stream_or_records).__name__}"
    )


def as_action(action: ViewAction | str) -> ViewAction:
    if isinstance(action, ViewAction):
        return action
    if isinstance(action, str):
        return ViewAction.parse(action)
    raise ValueError(f"view action must be a ViewAction or 'tau/window/filter/gamma', got {type(action).__name__}")


def select(
    stream_or_records: EventStream | Sequence[StreamRecord],
    action: ViewAction | str,
    goal: str,
    config: ComposerConfig | None = None,
) -> Selection:
    """``Merge(sigma_{w,c}(E), TaskRelevant(E, g), RecentContext(E, tau))`` (D.3), one pass. No index
    and no cache: at <= 50 events an incremental per-stream index bought 0.97-1.08x of a whole
    decision's compose + render (``benchmarks/bench_views.py`` docstring)."""
    cfg = config or DEFAULT_CONFIG
    act = as_action(action)
    if not isinstance(goal, str):
        raise ValueError(f"goal must be a string, got {type(goal).__name__}")
    records = as_records(stream_or_records)
    n = len(records)
    size = WINDOW_SIZES[act.window]
    start = 0 if size is None else max(0, n - size)
    want = None if act.filter == "all" else Outcome(act.filter)
    terms = goal_terms(goal)
    restore = bool(terms) and cfg.goal_restore != "off"
    restore_from = 0 if cfg.goal_restore == "history" else start
    context_from = max(0, n - 2) if act.tau == "DependencyChain" else n
    lo = min(start, restore_from if restore else n, context_from)

    items: list[SelectedEvent] = []
    n_scope = 0
    for i in range(lo, n):
        ev = event_view(records[i])
        gm = bool(terms) and not terms.isdisjoint(ev.terms)
        if i >= start and (want is None or ev.outcome is want):
            reason = Reason.SCOPE
            n_scope += 1
        elif gm and restore and i >= restore_from:
            reason = Reason.GOAL_RESTORE
        elif i >= context_from:
            reason = Reason.RECENT_CONTEXT
        else:
            continue
        items.append(SelectedEvent(ev, reason, gm))
    return Selection(
        action=act,
        goal=goal,
        goal_terms=tuple(sorted(terms)),
        items=tuple(items),
        n_stream=n,
        n_scope=n_scope,
        recent_ts=tuple(records[i].event.t for i in range(max(0, n - 2), n)),
    )
