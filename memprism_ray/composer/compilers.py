"""The four relation compilers ``C_{tau,gamma}`` (paper "Composer: Relational View
Construction", appendix D.3, and the view teacher's "View-specific gamma behavior").

Granularity rules (``selection`` is the merged, time-ordered ``E^_t``):

TemporalTrace
    fine: every selected event. medium: runs of >= 2 no_observed_change events become one
    :class:`TraceRun`. coarse: maximal runs of equal outcome; a no_observed_change run is one
    :class:`TraceRun`; elsewhere each run's first event, the view's latest event, new exceptions and goal-matching
    state_updates are kept, and each stretch of >= 2 other events becomes a :class:`TraceGap`.
ActionEffect
    groups by (action type, entity) with attempt count and outcome histogram; coarse shows the
    first, latest, first state_update and first exception attempts, medium adds outcome
    transitions and the 2 most recent, fine every attempt.
EntityState
    accepted new values (never an inferred old value) in chains per entity and key; fine: every
    update, unchanged repeats flagged; medium: distinct changes; coarse: initial -> latest plus
    at most 2 goal-matching intermediates, the skipped count in ``elided``.
DependencyChain
    anchor = latest event, then the previous one, then events sharing an entity or delta-key
    prefix with it ("events that share entities, state keys, or nearby time steps", paper
    "Composer"; appendix E.2), most recent first, then earlier context; at most 6 / 8 / 10
    events for coarse / medium / fine.

Coarse entries are nested within medium within fine (TemporalTrace: counts are monotone);
every compiler is one pass over the selection (O(N)).
"""

from __future__ import annotations

from memprism_ray.composer.records import DeltaView, EventView
from memprism_ray.composer.select import SelectedEvent, Selection
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
    ViewBody,
    histogram,
)
from memprism_ray.composer.terms import text_terms
from memprism_ray.recorder.events import Outcome

DEPENDENCY_CAPS: dict[str, int] = {"coarse": 6, "medium": 8, "fine": 10}
#: Most recent attempts a medium ActionEffect group always shows.
MEDIUM_RECENT_ATTEMPTS = 2
#: Goal-matching intermediate values a coarse EntityState chain keeps.
COARSE_KEY_INTERMEDIATES = 2

_EXC = Outcome.EXCEPTION
_UPD = Outcome.STATE_UPDATE
_NOC = Outcome.NO_OBSERVED_CHANGE


def _check_gamma(gamma: str) -> None:
    if gamma not in DEPENDENCY_CAPS:
        raise ValueError(f"unknown gamma {gamma!r}; valid gamma names: coarse, medium, fine")


def compile_temporal(selection: Selection, gamma: str) -> TemporalTrace:
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
            out.append(TraceRun(items[i], items[j - 1], j - i, outcome, any(it.goal_match for it in items[i:j])))
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


def compile_effect(selection: Selection, gamma: str) -> ActionEffect:
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


def _state_values(ev: EventView, goal: frozenset[str]) -> tuple[StateValue, ...]:
    """The event's deltas as StateValues for this goal."""
    return tuple(
        StateValue(d.value, ev.t, ev.act, d.changed, bool(goal) and not goal.isdisjoint(d.value_terms))
        for d in ev.deltas
    )


def compile_state(selection: Selection, gamma: str) -> EntityState:
    _check_gamma(gamma)
    goal = frozenset(selection.goal_terms)
    # key -> [StateValue] in time order; the dict keeps first-appearance order of keys.
    chains: dict[str, list[StateValue]] = {}
    owner: dict[str, DeltaView] = {}
    for it in selection.items:
        ev = it.event
        if not ev.deltas:
            continue
        for d, sv in zip(ev.deltas, _state_values(ev, goal), strict=True):
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


def compile_dependency(selection: Selection, gamma: str) -> DependencyChain:
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


COMPILERS = {
    "TemporalTrace": compile_temporal,
    "ActionEffect": compile_effect,
    "EntityState": compile_state,
    "DependencyChain": compile_dependency,
}


def compile_view(selection: Selection, gamma: str | None = None) -> ViewBody:
    """``C_{tau,gamma}(E^_t)`` for the selection's view action (``gamma`` overrides it)."""
    tau = selection.action.tau
    return COMPILERS[tau](selection, gamma or selection.action.gamma)
