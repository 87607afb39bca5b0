"""Reference Composer: the straightforward O(N) ``select`` and compilers (paper "Composer:
Relational View Construction", appendix C.3; appendix "Computational and storage
complexity": scope filtering is O(N) in the history length).

This is the literal implementation every view is defined by: ``select_reference`` walks
the events that can be selected once, and each ``compile_*_reference`` is a single pass
over the selection. The production path (``composer.select``/``compose``) answers the same
question from an incremental per-stream index (``composer.index``) so that a decision costs
what the page shows, not what the history holds; it must return *equal* structures for
every stream, view action, goal and setting, which the tests check against this module.
``canonical`` gives a process-independent form of a :class:`View` (sets sorted, enums by
value) for pinning outputs across versions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any

from memprism_ray.composer.records import _CACHE, DeltaView, EventView, event_view
from memprism_ray.composer.select import (
    DEFAULT_CONFIG,
    ComposerConfig,
    Reason,
    SelectedEvent,
    Selection,
    as_action,
    as_records,
)
from memprism_ray.composer.structures import (
    ActionEffect,
    ChainLink,
    DependencyChain,
    EffectGroup,
    EntityRow,
    EntityState,
    LinkKind,
    StateChain,
    StateValue,
    TemporalTrace,
    TraceEntry,
    TraceGap,
    TraceRun,
    View,
    histogram,
)
from memprism_ray.composer.terms import goal_terms, text_terms
from memprism_ray.recorder.events import Outcome
from memprism_ray.recorder.stream import EventStream, StreamRecord
from memprism_ray.view_space import WINDOW_SIZES, ViewAction

DEPENDENCY_CAPS: dict[str, int] = {"coarse": 6, "medium": 8, "fine": 10}
MEDIUM_RECENT_ATTEMPTS = 2
COARSE_KEY_INTERMEDIATES = 2


# --- Select ----------------------------------------------------------------------------
def select_reference(
    stream_or_records: EventStream | Sequence[StreamRecord],
    action: ViewAction | str,
    goal: str,
    config: ComposerConfig | None = None,
) -> Selection:
    """``Merge(sigma_{w,c}(E), TaskRelevant(E, g), RecentContext(E, tau))`` (C.3), one
    pass over the events that can be selected (the whole stream for ``window=all``)."""
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
    rows = records.records if isinstance(records, EventStream) else records
    cache = _CACHE
    for i in range(lo, n):
        rec = rows[i]
        hit = cache.get(id(rec))
        ev = hit[1] if hit is not None and hit[0] is rec else event_view(rec)
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
        memo_key = (reason, gm)
        item = ev.memo.get(memo_key)
        if item is None:
            item = ev.memo[memo_key] = SelectedEvent(ev, reason, gm)
        items.append(item)
    return Selection(
        action=act,
        goal=goal,
        goal_terms=tuple(sorted(terms)),
        items=tuple(items),
        n_stream=n,
        n_scope=n_scope,
        recent_ts=tuple(records[i].event.t for i in range(max(0, n - 2), n)),
    )


# --- Compilers ---------------------------------------------------------------------------
_EXC = Outcome.EXCEPTION
_UPD = Outcome.STATE_UPDATE
_NOC = Outcome.NO_OBSERVED_CHANGE


def _check_gamma(gamma: str) -> None:
    if gamma not in DEPENDENCY_CAPS:
        raise ValueError(f"unknown gamma {gamma!r}; valid gamma names: coarse, medium, fine")


# --- TemporalTrace -------------------------------------------------------------------
def _run(items: tuple[SelectedEvent, ...], i: int, j: int) -> TraceRun:
    return TraceRun(
        first=items[i],
        last=items[j - 1],
        count=j - i,
        outcome=items[i].event.outcome,
        goal_match=any(items[k].goal_match for k in range(i, j)),
    )


def compile_temporal_reference(selection: Selection, gamma: str) -> TemporalTrace:
    _check_gamma(gamma)
    items = selection.items
    if gamma == "fine":
        return TemporalTrace(items)
    out: list[TraceEntry] = []
    n = len(items)
    i = 0
    while i < n:
        outcome = items[i].event.outcome
        j = i + 1
        if gamma == "medium" and outcome is not _NOC:
            out.append(items[i])
            i = j
            continue
        while j < n and items[j].event.outcome is outcome:
            j += 1
        if j - i == 1:
            out.append(items[i])
        elif outcome is _NOC:
            out.append(_run(items, i, j))
        else:
            out.extend(_coarse_run(items, i, j, is_last=j == n))
        i = j
    return TemporalTrace(tuple(out))


def _coarse_run(items: tuple[SelectedEvent, ...], i: int, j: int, *, is_last: bool) -> list[TraceEntry]:
    keep = [False] * (j - i)
    keep[0] = True
    if is_last:
        keep[-1] = True
    failed: set[str] = set()
    for k in range(i, j):
        it = items[k]
        if it.event.outcome is _EXC:
            if it.event.action not in failed:
                failed.add(it.event.action)
                keep[k - i] = True
        elif it.goal_match:
            keep[k - i] = True
    out: list[TraceEntry] = []
    k = i
    while k < j:
        if keep[k - i]:
            out.append(items[k])
            k += 1
            continue
        m = k
        while m < j and not keep[m - i]:
            m += 1
        if m - k == 1:  # a one-event gap would hide the event without saving an entry
            out.append(items[k])
        else:
            collapsed = items[k:m]
            out.append(TraceGap(collapsed[0].event.t, collapsed[-1].event.t, m - k, histogram(collapsed)))
        k = m
    return out


# --- ActionEffect --------------------------------------------------------------------
def _shown_attempts(its: list[SelectedEvent], gamma: str) -> list[int]:
    n = len(its)
    if gamma == "fine":
        return list(range(n))
    keep = {0, n - 1}
    first_upd = next((k for k, it in enumerate(its) if it.event.outcome is _UPD), None)
    first_exc = next((k for k, it in enumerate(its) if it.event.outcome is _EXC), None)
    keep.update(k for k in (first_upd, first_exc) if k is not None)
    if gamma == "medium":
        keep.update(k for k in range(1, n) if its[k].event.outcome is not its[k - 1].event.outcome)
        keep.update(range(max(0, n - MEDIUM_RECENT_ATTEMPTS), n))
    return sorted(keep)


def compile_effect_reference(selection: Selection, gamma: str) -> ActionEffect:
    _check_gamma(gamma)
    # One pass: per (act, entity) the attempts, outcome counts and whether any matches the goal.
    groups: dict[tuple[str, str], list] = {}
    slot = {_EXC: 0, _UPD: 1, _NOC: 2}
    for it in selection.items:
        ev = it.event
        key = (ev.act, ev.entity)
        g = groups.get(key)
        if g is None:
            g = groups[key] = [[], [0, 0, 0], False]
        g[0].append(it)
        g[1][slot[ev.outcome]] += 1
        if it.goal_match:
            g[2] = True
    out = []
    for (act, entity), (its, counts, goal_match) in groups.items():
        if gamma == "fine":
            attempts, numbers = tuple(its), tuple(range(1, len(its) + 1))
        else:
            shown = _shown_attempts(its, gamma)
            attempts, numbers = tuple(its[k] for k in shown), tuple(k + 1 for k in shown)
        out.append(
            EffectGroup(
                act=act,
                entity=entity,
                count=len(its),
                histogram=((_EXC, counts[0]), (_UPD, counts[1]), (_NOC, counts[2])),
                attempts=attempts,
                numbers=numbers,
                first_t=its[0].event.t,
                latest_t=its[-1].event.t,
                goal_match=goal_match,
            )
        )
    out.sort(key=lambda g: g.latest_t)
    return ActionEffect(tuple(out))


# --- EntityState ---------------------------------------------------------------------
def _state_values(ev: EventView, goal: frozenset[str]) -> tuple[StateValue, ...]:
    """The event's deltas as StateValues for this goal (memoised on the event)."""
    memo_key = ("state_values", goal)
    values = ev.memo.get(memo_key)
    if values is None:
        values = ev.memo[memo_key] = tuple(
            StateValue(d.value, ev.t, ev.act, d.changed, bool(goal) and not goal.isdisjoint(d.value_terms))
            for d in ev.deltas
        )
    return values


def compile_state_reference(selection: Selection, gamma: str) -> EntityState:
    _check_gamma(gamma)
    goal = frozenset(selection.goal_terms)
    # key -> [StateValue] in time order; the dict keeps first-appearance order of keys.
    chains: dict[str, list[StateValue]] = {}
    owner: dict[str, DeltaView] = {}
    for it in selection.items:
        ev = it.event
        if not ev.deltas:
            continue
        for d, sv in zip(ev.deltas, _state_values(ev, goal)):
            chain = chains.get(d.key)
            if chain is None:
                chains[d.key] = [sv]
                owner[d.key] = d
            else:
                chain.append(sv)
    # Group keys by entity; an entity's first/latest update come from its keys' chains.
    by_entity: dict[str, list[str]] = {}
    for key in chains:
        by_entity.setdefault(owner[key].entity, []).append(key)
    rows = []
    for entity, keys in by_entity.items():
        rows.append(
            EntityRow(
                entity=entity,
                chains=tuple(_chain(key, owner[key].attribute, chains[key], gamma) for key in keys),
                first_t=min(chains[key][0].t for key in keys),
                latest_t=max(chains[key][-1].t for key in keys),
                goal_match=bool(goal) and not goal.isdisjoint(text_terms(entity)),
            )
        )
    rows.sort(key=lambda r: r.latest_t)
    return EntityState(tuple(rows))


def _chain(key: str, attribute: str, updates: list[StateValue], gamma: str) -> StateChain:
    if gamma == "fine":
        return StateChain(key, attribute, tuple(updates), len(updates), 0)
    distinct = [updates[0]]
    for u in updates[1:]:
        if u.value != distinct[-1].value:
            distinct.append(u)
    if gamma == "medium" or len(distinct) <= 2:
        return StateChain(key, attribute, tuple(distinct), len(updates), 0)
    middle = [k for k in range(1, len(distinct) - 1) if distinct[k].goal_match]
    keep = [0, *middle[-COARSE_KEY_INTERMEDIATES:], len(distinct) - 1]
    return StateChain(key, attribute, tuple(distinct[k] for k in keep), len(updates), len(distinct) - len(keep))


# --- DependencyChain -----------------------------------------------------------------
def compile_dependency_reference(selection: Selection, gamma: str) -> DependencyChain:
    _check_gamma(gamma)
    cap = DEPENDENCY_CAPS[gamma]
    items = selection.items
    if not selection.recent_ts or not items:
        return DependencyChain((), cap, 0)
    anchor = items[-1]
    if anchor.event.t != selection.recent_ts[-1]:
        raise ValueError(
            f"DependencyChain needs the latest event t={selection.recent_ts[-1]} in the selection "
            f"(RecentContext); this selection was made for {selection.action.tau}"
        )
    links = [ChainLink(anchor, LinkKind.ANCHOR)]
    rest = items[:-1]
    if len(selection.recent_ts) == 2 and rest and rest[-1].event.t == selection.recent_ts[0]:
        links.append(ChainLink(rest[-1], LinkKind.PREVIOUS))
        rest = rest[:-1]
    anchor_entities = anchor.event.link_entities
    linked: list[ChainLink] = []
    context: list[ChainLink] = []
    room = cap - len(links)
    for it in reversed(rest):
        if len(linked) >= room:
            break
        shared = it.event.link_entities & anchor_entities
        if shared:
            kind = LinkKind.SAME_ENTITY if it.event.entity == anchor.event.entity else LinkKind.SHARED_KEY
            linked.append(ChainLink(it, kind, tuple(sorted(shared))))
        elif len(context) < room:
            context.append(ChainLink(it, LinkKind.CONTEXT))
    links.extend(linked)
    links.extend(context[: max(0, room - len(linked))])
    return DependencyChain(tuple(links[:cap]), cap, len(rest))


COMPILERS_REFERENCE = {
    "TemporalTrace": compile_temporal_reference,
    "ActionEffect": compile_effect_reference,
    "EntityState": compile_state_reference,
    "DependencyChain": compile_dependency_reference,
}


def compose_reference(
    stream: EventStream | Sequence[StreamRecord],
    action: ViewAction | str,
    goal: str | None = None,
    config: ComposerConfig | None = None,
) -> View:
    """``compose`` by the reference path: ``select_reference`` then one compiler pass."""
    act = as_action(action)
    if goal is None:
        goal = str(stream.meta.get("goal", "")) if isinstance(stream, EventStream) else ""
    sel = select_reference(stream, act, goal, config)
    body = COMPILERS_REFERENCE[act.tau](sel, act.gamma)
    return View(
        action=act,
        goal=goal,
        goal_terms=sel.goal_terms,
        n_stream=sel.n_stream,
        n_scope=sel.n_scope,
        n_selected=len(sel.items),
        body=body,
    )


# --- canonical form ----------------------------------------------------------------------
def canonical(obj: Any) -> Any:
    """A JSON-able, process-independent form of a view structure: dataclasses by type name
    and fields (``EventView.memo`` excluded), enums by value, sets sorted."""
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, ViewAction):
        return obj.name
    if is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {"_": type(obj).__name__}
        for f in fields(obj):
            if f.compare:
                out[f.name] = canonical(getattr(obj, f.name))
        return out
    if isinstance(obj, (frozenset, set)):
        return sorted(canonical(x) for x in obj)
    if isinstance(obj, (tuple, list)):
        return [canonical(x) for x in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"canonical: unexpected {type(obj).__name__} in a view")


def view_digest(view: View) -> str:
    """SHA-256 of :func:`canonical` (equal views, equal digests, in any process)."""
    return hashlib.sha256(json.dumps(canonical(view), sort_keys=True, ensure_ascii=False).encode()).hexdigest()
