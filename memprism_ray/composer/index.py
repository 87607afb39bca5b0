"""Incremental per-stream index behind ``select`` and ``compose`` (paper "Composer:
Relational View Construction", appendix D.3; appendix "Computational and storage
complexity").

Semantics are those of the straightforward path in ``composer.reference``: one pass of
``Merge(sigma_{w,c}, TaskRelevant, RecentContext)`` over the stream, then one pass of the
compiler over the selection, O(N) in the history length N. Computed that way, a decision
late in an episode pays for the whole history although a page shows a few dozen entries.

The stream is append-only (records never change), so everything a view needs can be kept
per stream and extended by the new events only:

* the reading of each record (``EventView``) and, per goal, whether it matches the goal;
* per (outcome filter, goal) the ``window=all`` selection before recent context (the
  *base*: events in scope or restored), its scope count, and the per-entity positions of
  its events (for DependencyChain links);
* per base and compiler the state of the single left-to-right compiler pass: TemporalTrace
  closed entries plus the open run (first event, kept events, failed actions, pending
  stretch); ActionEffect groups with attempts, outcome counts, first update/exception and
  transitions, ordered by latest attempt; EntityState chains with distinct values and
  goal-matching distinct values, entities ordered by latest update. Compiled groups, rows
  and chains are rebuilt only when an event touches them.

A view then costs O(new events) to bring the index up to date plus O(what it returns):
``window=all`` TemporalTrace/ActionEffect/EntityState finish their open part, DependencyChain
finds the most recent linked events by bisecting per-entity position lists and the nearest
context by a backward walk bounded by the cap, recent windows walk at most 10 events.
Returned structures are *equal* to the reference path's for every stream, action, goal and
setting (tests compare both; a fixture pins the bytes). Under ``goal_restore="history"`` a
recent window restores every earlier goal-matching event, so its selection and compile stay
proportional to those events (the restore prefix is taken from the index by bisection).

Indexes are found by stream identity: an :class:`EventStream` maps to its index through a
weak reference and is checked in O(1) to still extend what was indexed (same length
prefix, same last record object); a list or tuple of records maps through its first record
and is checked by identity of the indexed prefix (a C-level comparison). A stream that
arrives as a new object (an actor receives the pickled stream at every decision) continues
a recently used index whose stream is gone when the recorder's digest chain proves it: the
index's digest chained over the new records equals the stream's digest. Anything else
rebuilds the index, so a stale index is never used.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import lru_cache

from memprism_ray.composer.compilers import (
    COARSE_KEY_INTERMEDIATES,
    DEPENDENCY_CAPS,
    MEDIUM_RECENT_ATTEMPTS,
    _chain,
    _shown_attempts,
    _state_values,
    compile_view,
)
from memprism_ray.composer.records import EventView, event_view
from memprism_ray.composer.select import ComposerConfig, Reason, SelectedEvent, Selection, as_records
from memprism_ray.composer.structures import (
    OUTCOME_ORDER,
    ActionEffect,
    ChainLink,
    DependencyChain,
    EffectGroup,
    EntityRow,
    EntityState,
    Histogram,
    LinkKind,
    StateChain,
    StateValue,
    TemporalTrace,
    TraceEntry,
    TraceGap,
    TraceRun,
    View,
    ViewBody,
)
from memprism_ray.composer.terms import goal_terms, text_terms
from memprism_ray.recorder.events import Outcome
from memprism_ray.recorder.stream import EventStream, StreamRecord, _canonical_json  # the digest's encoding
from memprism_ray.view_space import WINDOW_SIZES, ViewAction

_EXC = Outcome.EXCEPTION
_UPD = Outcome.STATE_UPDATE
_NOC = Outcome.NO_OBSERVED_CHANGE
_SLOT = {_EXC: 0, _UPD: 1, _NOC: 2}


def _item(ev: EventView, reason: Reason, gm: bool) -> SelectedEvent:
    """The memoised SelectedEvent (the same object the reference path returns)."""
    key = (reason, gm)
    item = ev.memo.get(key)
    if item is None:
        item = ev.memo[key] = SelectedEvent(ev, reason, gm)
    return item


def _run_hist(outcome: Outcome, count: int) -> Histogram:
    """Histogram of ``count`` events that all have ``outcome`` (events of one run)."""
    return tuple((o, count if o is outcome else 0) for o in OUTCOME_ORDER)


# --- TemporalTrace -------------------------------------------------------------------
class _TraceMedium:
    """Medium TemporalTrace over a growing item list: closed entries + the open
    no_observed_change run (start, whether any of it matches the goal)."""

    __slots__ = ("out", "r0", "r_gm", "seen")

    def __init__(self) -> None:
        self.seen = 0
        self.out: list[TraceEntry] = []
        self.r0 = -1
        self.r_gm = False

    def sync(self, items: list[SelectedEvent]) -> None:
        out = self.out
        for k in range(self.seen, len(items)):
            it = items[k]
            if it.event.outcome is _NOC:
                if self.r0 < 0:
                    self.r0, self.r_gm = k, it.goal_match
                elif it.goal_match:
                    self.r_gm = True
                continue
            if self.r0 >= 0:
                out.append(self._noc(items, self.r0, k))
                self.r0 = -1
            out.append(it)
        self.seen = len(items)

    def _noc(self, items: list[SelectedEvent], i: int, j: int) -> TraceEntry:
        return items[i] if j - i == 1 else TraceRun(items[i], items[j - 1], j - i, _NOC, self.r_gm)

    def entries(self, items: list[SelectedEvent]) -> tuple[TraceEntry, ...]:
        if self.r0 < 0:
            return tuple(self.out)
        return (*self.out, self._noc(items, self.r0, len(items)))


class _TraceCoarse:
    """Coarse TemporalTrace over a growing item list: entries of closed runs + the open
    run's state (its outcome and start, failed actions, entries up to its last kept event,
    the first position after it, whether any of it matches the goal)."""

    __slots__ = ("failed", "gm_any", "out", "outcome", "r0", "run_out", "seen", "tail")

    def __init__(self) -> None:
        self.seen = 0
        self.out: list[TraceEntry] = []
        self.r0 = -1
        self.outcome: Outcome | None = None
        self.run_out: list[TraceEntry] = []
        self.tail = 0
        self.failed: set[str] = set()
        self.gm_any = False

    @staticmethod
    def _stretch(items: list[SelectedEvent], a: int, b: int, outcome: Outcome) -> list[TraceEntry]:
        """Events ``[a, b)`` of one run that no rule keeps: one event is shown as itself
        (a one-event gap would save nothing), two or more collapse into a TraceGap."""
        if b - a == 1:
            return [items[a]]
        if b - a >= 2:
            return [TraceGap(items[a].event.t, items[b - 1].event.t, b - a, _run_hist(outcome, b - a))]
        return []

    def _run_entries(self, items: list[SelectedEvent], j: int, is_last: bool) -> list[TraceEntry]:
        """Entries of the open run ``[r0, j)`` (``is_last``: it ends the selection)."""
        r0, outcome = self.r0, self.outcome
        assert outcome is not None
        if outcome is _NOC:
            return [items[r0] if j - r0 == 1 else TraceRun(items[r0], items[j - 1], j - r0, _NOC, self.gm_any)]
        if not is_last or self.tail >= j:
            return [*self.run_out, *self._stretch(items, self.tail, j, outcome)]
        return [*self.run_out, *self._stretch(items, self.tail, j - 1, outcome), items[j - 1]]

    def sync(self, items: list[SelectedEvent]) -> None:
        for k in range(self.seen, len(items)):
            it = items[k]
            o = it.event.outcome
            if o is not self.outcome or self.r0 < 0:
                if self.r0 >= 0:
                    self.out.extend(self._run_entries(items, k, is_last=False))
                self.r0, self.outcome, self.tail, self.gm_any = k, o, k, False
                self.run_out = []
                self.failed = set()
            if o is _NOC:
                if it.goal_match:
                    self.gm_any = True
                continue
            keep = k == self.r0
            if o is _EXC:
                if it.event.action not in self.failed:
                    self.failed.add(it.event.action)
                    keep = True
            elif it.goal_match:
                keep = True
            if keep:
                self.run_out.extend(self._stretch(items, self.tail, k, o))
                self.run_out.append(it)
                self.tail = k + 1
        self.seen = len(items)

    def entries(self, items: list[SelectedEvent]) -> tuple[TraceEntry, ...]:
        if self.r0 < 0:
            return ()
        return (*self.out, *self._run_entries(items, len(items), is_last=True))


# --- ActionEffect --------------------------------------------------------------------
class _Group:
    __slots__ = ("act", "built", "counts", "entity", "first_exc", "first_upd", "gm", "its", "transitions")

    def __init__(self, act: str, entity: str) -> None:
        self.act, self.entity = act, entity
        self.its: list[SelectedEvent] = []
        self.counts = [0, 0, 0]
        self.gm = False
        self.first_upd = self.first_exc = -1
        self.transitions: list[int] = []
        self.built: dict[str, tuple[int, EffectGroup]] = {}

    def add(self, it: SelectedEvent) -> None:
        k = len(self.its)
        o = it.event.outcome
        if k and self.its[-1].event.outcome is not o:
            self.transitions.append(k)
        self.its.append(it)
        self.counts[_SLOT[o]] += 1
        if it.goal_match:
            self.gm = True
        if o is _UPD and self.first_upd < 0:
            self.first_upd = k
        elif o is _EXC and self.first_exc < 0:
            self.first_exc = k

    def group(self, gamma: str) -> EffectGroup:
        its = self.its
        n = len(its)
        hit = self.built.get(gamma)
        if hit is not None and hit[0] == n:
            return hit[1]
        if gamma == "fine":
            attempts, numbers = tuple(its), tuple(range(1, n + 1))
        else:
            keep = {0, n - 1}
            keep.update(k for k in (self.first_upd, self.first_exc) if k >= 0)
            if gamma == "medium":
                keep.update(self.transitions)
                keep.update(range(max(0, n - MEDIUM_RECENT_ATTEMPTS), n))
            shown = sorted(keep)
            attempts, numbers = tuple(its[k] for k in shown), tuple(k + 1 for k in shown)
        c = self.counts
        g = EffectGroup(
            act=self.act,
            entity=self.entity,
            count=n,
            histogram=((_EXC, c[0]), (_UPD, c[1]), (_NOC, c[2])),
            attempts=attempts,
            numbers=numbers,
            first_t=its[0].event.t,
            latest_t=its[-1].event.t,
            goal_match=self.gm,
        )
        self.built[gamma] = (n, g)
        return g


class _Effect:
    """ActionEffect groups of a growing item list; per gamma the groups in order of their
    latest attempt (the reference sorts by ``latest_t``, unique per group)."""

    __slots__ = ("groups", "order", "seen")

    def __init__(self) -> None:
        self.seen = 0
        self.groups: dict[tuple[str, str], _Group] = {}
        self.order: dict[str, tuple[int, OrderedDict[tuple[str, str], EffectGroup | None]]] = {}

    def sync(self, items: list[SelectedEvent]) -> None:
        groups = self.groups
        for k in range(self.seen, len(items)):
            it = items[k]
            key = (it.event.act, it.event.entity)
            g = groups.get(key)
            if g is None:
                g = groups[key] = _Group(*key)
            g.add(it)
        self.seen = len(items)

    def compile(self, items: list[SelectedEvent], gamma: str) -> ActionEffect:
        self.sync(items)
        seen, order = self.order.get(gamma, (0, None))
        if order is None:
            order = OrderedDict()
        touched: dict[tuple[str, str], None] = {}
        for k in range(seen, len(items)):
            ev = items[k].event
            key = (ev.act, ev.entity)
            order.pop(key, None)
            order[key] = None
            touched[key] = None
        for key in touched:
            order[key] = self.groups[key].group(gamma)
        self.order[gamma] = (len(items), order)
        return ActionEffect(tuple(order.values()))  # type: ignore[arg-type]


# --- EntityState ---------------------------------------------------------------------
class _Key:
    __slots__ = ("attribute", "built", "distinct", "gm_idx", "key", "updates")

    def __init__(self, key: str, attribute: str) -> None:
        self.key, self.attribute = key, attribute
        self.updates: list[StateValue] = []
        self.distinct: list[StateValue] = []
        self.gm_idx: list[int] = []  # positions in `distinct` whose value matches the goal
        self.built: dict[str, tuple[int, StateChain]] = {}

    def add(self, sv: StateValue) -> None:
        self.updates.append(sv)
        if not self.distinct or sv.value != self.distinct[-1].value:
            self.distinct.append(sv)
            if sv.goal_match:
                self.gm_idx.append(len(self.distinct) - 1)

    def chain(self, gamma: str) -> StateChain:
        total = len(self.updates)
        hit = self.built.get(gamma)
        if hit is not None and hit[0] == total:
            return hit[1]
        distinct = self.distinct
        if gamma == "fine":
            c = StateChain(self.key, self.attribute, tuple(self.updates), total, 0)
        elif gamma == "medium" or len(distinct) <= 2:
            c = StateChain(self.key, self.attribute, tuple(distinct), total, 0)
        else:
            last = len(distinct) - 1
            middle: list[int] = []
            for k in reversed(self.gm_idx):
                if len(middle) == COARSE_KEY_INTERMEDIATES:
                    break
                if 1 <= k < last:
                    middle.append(k)
            keep = [0, *reversed(middle), last]
            c = StateChain(self.key, self.attribute, tuple(distinct[k] for k in keep), total, len(distinct) - len(keep))
        self.built[gamma] = (total, c)
        return c


class _Entity:
    __slots__ = ("built", "first_t", "goal_match", "keys", "latest_t", "name", "rank", "version")

    def __init__(self, name: str, rank: int, t: int, goal_match: bool) -> None:
        self.name, self.rank = name, rank
        self.keys: list[_Key] = []
        self.first_t = self.latest_t = t
        self.goal_match = goal_match
        self.version = 0
        self.built: dict[str, tuple[int, EntityRow]] = {}

    def row(self, gamma: str) -> EntityRow:
        hit = self.built.get(gamma)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        r = EntityRow(
            entity=self.name,
            chains=tuple(k.chain(gamma) for k in self.keys),
            first_t=self.first_t,
            latest_t=self.latest_t,
            goal_match=self.goal_match,
        )
        self.built[gamma] = (self.version, r)
        return r


class _State:
    """EntityState chains of a growing item list; per gamma the entity rows in order of
    (latest update, first appearance): the reference's stable sort by ``latest_t``."""

    __slots__ = ("entities", "goal", "keys", "order", "seen")

    def __init__(self, goal: frozenset[str]) -> None:
        self.goal = goal
        self.seen = 0
        self.keys: dict[str, _Key] = {}
        self.entities: dict[str, _Entity] = {}
        self.order: dict[str, tuple[int, OrderedDict[str, EntityRow | None]]] = {}

    def sync(self, items: list[SelectedEvent]) -> None:
        goal, keys, entities = self.goal, self.keys, self.entities
        for k in range(self.seen, len(items)):
            ev = items[k].event
            if not ev.deltas:
                continue
            for d, sv in zip(ev.deltas, _state_values(ev, goal), strict=True):
                kd = keys.get(d.key)
                if kd is None:
                    kd = keys[d.key] = _Key(d.key, d.attribute)
                    ent = entities.get(d.entity)
                    if ent is None:
                        gm = bool(goal) and not goal.isdisjoint(text_terms(d.entity))
                        ent = entities[d.entity] = _Entity(d.entity, len(entities), ev.t, gm)
                    ent.keys.append(kd)
                kd.add(sv)
                ent = entities[d.entity]
                ent.latest_t = ev.t
                ent.version += 1
        self.seen = len(items)

    def compile(self, items: list[SelectedEvent], gamma: str) -> EntityState:
        self.sync(items)
        seen, order = self.order.get(gamma, (0, None))
        if order is None:
            order = OrderedDict()
        touched: dict[str, None] = {}
        entities = self.entities
        for k in range(seen, len(items)):
            ev = items[k].event
            if not ev.deltas:
                continue
            names = {d.entity for d in ev.deltas}
            for name in sorted(names, key=lambda e: entities[e].rank) if len(names) > 1 else names:
                order.pop(name, None)
                order[name] = None
                touched[name] = None
        for name in touched:
            order[name] = entities[name].row(gamma)
        self.order[gamma] = (len(items), order)
        return EntityState(tuple(order.values()))  # type: ignore[arg-type]


# --- DependencyChain -----------------------------------------------------------------
def _dependency(base: _Base, k: int, tail: list[SelectedEvent], n_recent: int, gamma: str) -> DependencyChain:
    """DependencyChain of ``base.items[:k] + tail`` where ``tail`` holds the stream's last
    ``n_recent`` events (anchor last): as ``compile_dependency``, without the scan."""
    cap = DEPENDENCY_CAPS[gamma]
    if not tail:
        return DependencyChain((), cap, 0)
    anchor = tail[-1]
    links = [ChainLink(anchor, LinkKind.ANCHOR)]
    if n_recent == 2:
        links.append(ChainLink(tail[0], LinkKind.PREVIOUS))
    room = cap - len(links)
    anchor_entities = anchor.event.link_entities
    items = base.items
    base.sync_links()
    found: set[int] = set()
    for e in anchor_entities:
        positions = base.links.get(e)
        if positions:
            hi = bisect_left(positions, k)
            found.update(positions[max(0, hi - room) : hi])
    linked_pos = sorted(found, reverse=True)[:room]
    for j in linked_pos:
        it = items[j]
        shared = it.event.link_entities & anchor_entities
        kind = LinkKind.SAME_ENTITY if it.event.entity == anchor.event.entity else LinkKind.SHARED_KEY
        links.append(ChainLink(it, kind, tuple(sorted(shared))))
    need = room - len(linked_pos)
    j = k - 1
    skip = set(linked_pos)
    while need > 0 and j >= 0:
        if j not in skip:
            links.append(ChainLink(items[j], LinkKind.CONTEXT))
            need -= 1
        j -= 1
    return DependencyChain(tuple(links[:cap]), cap, k)


# --- the index -----------------------------------------------------------------------
class _Goal:
    """Per goal-term set: whether each event matches, and the matching events' positions
    with their GOAL_RESTORE items (the restore prefix of ``goal_restore="history"``)."""

    __slots__ = ("match", "pos", "restored", "terms")

    def __init__(self, terms: frozenset[str]) -> None:
        self.terms = terms
        self.match: list[bool] = []
        self.pos: list[int] = []
        self.restored: list[SelectedEvent] = []

    def sync(self, views: list[EventView]) -> None:
        terms = self.terms
        for i in range(len(self.match), len(views)):
            ev = views[i]
            gm = bool(terms) and not terms.isdisjoint(ev.terms)
            self.match.append(gm)
            if gm:
                self.pos.append(i)
                self.restored.append(_item(ev, Reason.GOAL_RESTORE, True))


class _Base:
    """The ``window=all`` selection of one (outcome filter, goal, restore) before recent
    context: stream positions, items, scope count, per-compiler states."""

    __slots__ = ("goal", "items", "links", "links_seen", "n", "n_scope", "pos", "restore", "states", "want")

    def __init__(self, want: Outcome | None, restore: bool, goal: _Goal) -> None:
        self.want, self.restore, self.goal = want, restore, goal
        self.n = 0
        self.pos: list[int] = []
        self.items: list[SelectedEvent] = []
        self.n_scope = 0
        self.states: dict[tuple[str, str], object] = {}
        self.links: dict[str, list[int]] = {}
        self.links_seen = 0

    def sync(self, views: list[EventView]) -> None:
        want, restore, match = self.want, self.restore, self.goal.match
        for i in range(self.n, len(views)):
            ev = views[i]
            gm = match[i]
            if want is None or ev.outcome is want:
                reason = Reason.SCOPE
                self.n_scope += 1
            elif gm and restore:
                reason = Reason.GOAL_RESTORE
            else:
                continue
            self.pos.append(i)
            self.items.append(_item(ev, reason, gm))
        self.n = len(views)

    def sync_links(self) -> None:
        links, items = self.links, self.items
        for j in range(self.links_seen, len(items)):
            for e in items[j].event.link_entities:
                positions = links.get(e)
                if positions is None:
                    links[e] = [j]
                else:
                    positions.append(j)
        self.links_seen = len(items)

    def compile(self, tau: str, gamma: str) -> ViewBody:
        items = self.items
        if tau == "TemporalTrace":
            if gamma == "fine":
                return TemporalTrace(tuple(items))
            state = self.states.get((tau, gamma))
            if state is None:
                state = self.states[(tau, gamma)] = _TraceMedium() if gamma == "medium" else _TraceCoarse()
            state.sync(items)  # type: ignore[attr-defined]
            return TemporalTrace(state.entries(items))  # type: ignore[attr-defined]
        if tau == "ActionEffect":
            effect = self.states.get((tau, ""))
            if effect is None:
                effect = self.states[(tau, "")] = _Effect()
            return effect.compile(items, gamma)  # type: ignore[attr-defined]
        if tau == "EntityState":
            state = self.states.get((tau, ""))
            if state is None:
                state = self.states[(tau, "")] = _State(self.goal.terms)
            return state.compile(items, gamma)  # type: ignore[attr-defined]
        raise ValueError(f"no incremental compiler for {tau!r}")


class StreamIndex:
    """Everything the Composer derives from one append-only stream, extended in place."""

    __slots__ = ("__weakref__", "bases", "digest", "goals", "lock", "owner", "records", "views")

    def __init__(self) -> None:
        self.records: list[StreamRecord] = []
        self.views: list[EventView] = []
        self.goals: dict[frozenset[str], _Goal] = {}
        self.bases: dict[tuple[Outcome | None, bool, frozenset[str]], _Base] = {}
        # Views of one stream may be requested from several threads (a threaded actor).
        self.lock = threading.RLock()
        # For an EventStream's index: the stream (weakly) and its digest at len(records).
        self.owner: weakref.ref | None = None
        self.digest: str | None = None

    def extend(self, rows: Sequence[StreamRecord]) -> None:
        """Take the records appended since the last call (their readings come lazily)."""
        if len(rows) > len(self.records):
            self.records.extend(rows[len(self.records) :])

    def read_all(self) -> list[EventView]:
        """Readings of every record (views over the whole history need them all; recent
        windows read only their events, as the reference does)."""
        records, views = self.records, self.views
        for i in range(len(views), len(records)):
            views.append(event_view(records[i]))
        return views

    def goal(self, terms: frozenset[str]) -> _Goal:
        g = self.goals.get(terms)
        if g is None:
            g = self.goals[terms] = _Goal(terms)
        g.sync(self.read_all())
        return g

    def base(self, want: Outcome | None, restore: bool, goal: _Goal) -> _Base:
        key = (want, restore, goal.terms)
        b = self.bases.get(key)
        if b is None:
            b = self.bases[key] = _Base(want, restore, goal)
        b.sync(self.read_all())
        return b


# Stream identity -> (weak reference to the stream, its index).
_STREAMS: dict[int, tuple[weakref.ref, StreamIndex]] = {}
# First record identity -> indexes of record sequences starting with it (most recent first).
_SEQUENCES: OrderedDict[int, list[StreamIndex]] = OrderedDict()
_SEQUENCE_KEYS_MAX = 64
_SEQUENCE_INDEXES_MAX = 4
# Re-entrant: a stream collected by the garbage collector while this thread holds the lock
# runs its weak-reference callback (``_forget``) here, which takes the lock again.
_REGISTRY_LOCK = threading.RLock()


def _forget(key: int, ref: weakref.ref) -> None:
    with _REGISTRY_LOCK:
        hit = _STREAMS.get(key)
        if hit is not None and hit[0] is ref:
            del _STREAMS[key]


# Recently used indexes of EventStreams, kept (strongly) after their stream is gone: a
# stream that arrives as a new object with the same content plus new events (an actor
# receives the pickled stream at every decision) continues such an index. Bounded.
_RECENT: OrderedDict[int, StreamIndex] = OrderedDict()
_RECENT_MAX = 64
_RECENT_RECORDS_MAX = 200_000
#: Most new events a continued index catches up on (beyond it the index is rebuilt).
CATCH_UP_MAX = 256


def _continues(stream: EventStream) -> StreamIndex | None:
    """An orphaned index whose content ``stream`` extends, proven by the stream's digest:
    chaining the index's digest over the new records must give ``stream.digest`` (the
    recorder's SHA-256 hash chain over meta and every record). Call with the registry lock."""
    n = len(stream)
    target = stream.digest
    lines: dict[int, bytes] = {}
    for idx in reversed(_RECENT.values()):
        m = len(idx.records)
        if idx.digest is None or m > n or n - m > CATCH_UP_MAX:
            continue
        if idx.owner is not None and idx.owner() is not None:
            continue  # still in use by its own stream
        d = idx.digest
        for j in range(m, n):
            line = lines.get(j)
            if line is None:
                line = lines[j] = _canonical_json(stream[j].to_dict())
            d = hashlib.sha256(d.encode() + line).hexdigest()
        if d == target:
            # Same content: take this stream's record objects for the identity checks.
            idx.records = list(stream.records[:m])
            return idx
    return None


def _stream_index(stream: EventStream) -> StreamIndex:
    key = id(stream)
    with _REGISTRY_LOCK:
        hit = _STREAMS.get(key)
        idx = hit[1] if hit is not None and hit[0]() is stream else None
        if idx is not None:
            n = len(idx.records)
            # Append-only: an index is valid while the stream still holds the same last record.
            if n > len(stream) or (n and stream[n - 1] is not idx.records[-1]):
                idx = None
        if idx is None:
            idx = _continues(stream) or StreamIndex()
            ref = weakref.ref(stream, lambda r, key=key: _forget(key, r))
            idx.owner = ref
            _STREAMS[key] = (ref, idx)
        _RECENT[id(idx)] = idx
        _RECENT.move_to_end(id(idx))
        while len(_RECENT) > _RECENT_MAX or (
            len(_RECENT) > 1 and sum(len(i.records) for i in _RECENT.values()) > _RECENT_RECORDS_MAX
        ):
            _RECENT.popitem(last=False)
    return idx


def _sequence_index(rows: Sequence[StreamRecord]) -> StreamIndex:
    """The index of a record sequence: one built for a prefix of it (same record objects)
    is reused and extended; only the records after that prefix are validated."""
    first = rows[0]
    if not isinstance(first, StreamRecord):
        as_records(rows)  # raises the reference error for this sequence
    key = id(first)
    with _REGISTRY_LOCK:
        candidates = _SEQUENCES.get(key)
        if candidates is None:
            candidates = _SEQUENCES[key] = []
            if len(_SEQUENCES) > _SEQUENCE_KEYS_MAX:
                _SEQUENCES.popitem(last=False)
        else:
            _SEQUENCES.move_to_end(key)
        best = None
        for idx in candidates:
            n = len(idx.records)
            # list == compares identical objects without looking inside them (C level).
            if n <= len(rows) and (best is None or n > len(best.records)) and list(rows[:n]) == idx.records:
                best = idx
    n = len(best.records) if best is not None else 0
    # The prefix was validated when it was indexed; check the rest with the reference's messages.
    for i in range(n, len(rows)):
        if not isinstance(rows[i], StreamRecord):
            raise ValueError(f"record {i} is a {type(rows[i]).__name__}, not a StreamRecord")
    for i in range(max(1, n), len(rows)):
        if rows[i].event.t <= rows[i - 1].event.t:
            raise ValueError(f"records are not in time order at position {i}")
    with _REGISTRY_LOCK:
        if best is None:
            best = StreamIndex()
        elif best in candidates:
            candidates.remove(best)
        candidates.insert(0, best)
        del candidates[_SEQUENCE_INDEXES_MAX:]
    return best


def stream_index(stream_or_records: EventStream | Sequence[StreamRecord]) -> StreamIndex | None:
    """The index of an EventStream or of a list/tuple of its records (validated like
    ``as_records``; ``None`` for an empty sequence). Extend it under its lock before use."""
    if isinstance(stream_or_records, EventStream):
        return _stream_index(stream_or_records)
    if isinstance(stream_or_records, (list, tuple)):
        return _sequence_index(stream_or_records) if stream_or_records else None
    as_records(stream_or_records)  # raises the reference error
    raise AssertionError("unreachable")  # pragma: no cover


def _synced(idx: StreamIndex, rows: EventStream | Sequence[StreamRecord]) -> StreamIndex:
    """``idx`` extended to ``rows`` (call with ``idx.lock`` held). A sequence index that
    another thread has meanwhile extended past ``rows`` is replaced by a private one."""
    if len(idx.records) > len(rows):
        idx = StreamIndex()
    if isinstance(rows, EventStream):
        digest = rows.digest  # read before the length: an append updates the digest last
        idx.extend(rows)
        idx.digest = digest if len(rows) == len(idx.records) else None
    else:
        idx.extend(rows)
    return idx


def clear_indexes() -> None:
    """Forget every stream index (benchmarks time a cold compose with it)."""
    with _REGISTRY_LOCK:
        _STREAMS.clear()
        _SEQUENCES.clear()
        _RECENT.clear()
        _INDEXED_VIEWS.clear()
        _SHARED.clear()


# --- select / compose ----------------------------------------------------------------
def _select_parts(
    idx: StreamIndex, act: ViewAction, goal: str, cfg: ComposerConfig
) -> tuple[frozenset[str], _Base | None, int, list[SelectedEvent], int]:
    """``(terms, base, k, tail, n_scope)``: the selection is ``base.items[:k] + tail``
    (``base`` is ``None`` for recent windows, whose selection is ``tail``)."""
    records = idx.records
    n = len(records)
    size = WINDOW_SIZES[act.window]
    want = None if act.filter == "all" else Outcome(act.filter)
    terms = goal_terms(goal)
    restore = bool(terms) and cfg.goal_restore != "off"
    dependency = act.tau == "DependencyChain"
    if size is None:
        g = idx.goal(terms)
        base = idx.base(want, restore, g)
        if not dependency:
            return terms, base, len(base.items), [], base.n_scope
        lo = max(0, n - 2)
        k = bisect_left(base.pos, lo)
        tail = []
        j = k
        for i in range(lo, n):
            if j < len(base.pos) and base.pos[j] == i:
                tail.append(base.items[j])
                j += 1
            else:
                tail.append(_item(idx.views[i], Reason.RECENT_CONTEXT, g.match[i]))
        return terms, base, k, tail, base.n_scope
    start = max(0, n - size)
    context_from = max(0, n - 2) if dependency else n
    items: list[SelectedEvent] = []
    if restore and cfg.goal_restore == "history":
        lo = min(start, context_from)
        g = idx.goal(terms)
        items.extend(g.restored[: bisect_left(g.pos, lo)])
    else:
        lo = min(start, start if restore else n, context_from)
    n_scope = 0
    for i in range(lo, n):
        ev = event_view(records[i])
        gm = bool(terms) and not terms.isdisjoint(ev.terms)
        if i >= start and (want is None or ev.outcome is want):
            reason = Reason.SCOPE
            n_scope += 1
        elif gm and restore:
            reason = Reason.GOAL_RESTORE
        elif i >= context_from:
            reason = Reason.RECENT_CONTEXT
        else:
            continue
        items.append(_item(ev, reason, gm))
    return terms, None, 0, items, n_scope


def _recent_ts(idx: StreamIndex | None) -> tuple[int, ...]:
    if idx is None:
        return ()
    records = idx.records
    return tuple(records[i].event.t for i in range(max(0, len(records) - 2), len(records)))


def select_indexed(
    records: EventStream | Sequence[StreamRecord], act: ViewAction, goal: str, cfg: ComposerConfig
) -> Selection:
    """``select`` answered from the index (equal to ``reference.select_reference``)."""
    idx = stream_index(records)
    if idx is None:
        return Selection(act, goal, tuple(sorted(goal_terms(goal))), (), 0, 0, ())
    with idx.lock:
        idx = _synced(idx, records)
        terms, base, k, tail, n_scope = _select_parts(idx, act, goal, cfg)
        items = tuple(tail) if base is None else (*base.items[:k], *tail)
        return Selection(act, goal, tuple(sorted(terms)), items, len(idx.records), n_scope, _recent_ts(idx))


# --- shared sub-structures --------------------------------------------------------------
# Recent windows are compiled from scratch (a handful of events), as ``compile_effect`` /
# ``compile_state`` do, except that each group, chain and row is looked up by its inputs
# (the memoised SelectedEvents/StateValues it is built from, by identity) before it is
# built: a group or chain whose events did not change since the previous decision (the
# window slid past other events) is the same object, so Render finds its laid-out block by
# identity, and it is not rebuilt. Values are those of the reference compilers.
_SHARED: dict[tuple, tuple[object, object]] = {}
_SHARED_MAX = 8_192


def _shared(key: tuple, refs: object, build: Callable[[], object]) -> object:
    """The one instance built from the inputs named by ``key`` (objects by identity)."""
    hit = _SHARED.get(key)
    if hit is not None:
        return hit[1]
    obj = build()
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.clear()
    # The value keeps the objects named by id in the key alive, so the ids stay theirs.
    _SHARED[key] = (refs, obj)
    return obj


def _effect_shared(selection: Selection, gamma: str) -> ActionEffect:
    """``compile_effect`` with groups shared by their attempts."""
    groups: dict[tuple[str, str], list[SelectedEvent]] = {}
    for it in selection.items:
        ev = it.event
        g = groups.get((ev.act, ev.entity))
        if g is None:
            groups[(ev.act, ev.entity)] = [it]
        else:
            g.append(it)

    def build(act: str, entity: str, its: list[SelectedEvent]) -> EffectGroup:
        counts = [0, 0, 0]
        for it in its:
            counts[_SLOT[it.event.outcome]] += 1
        if gamma == "fine":
            attempts, numbers = tuple(its), tuple(range(1, len(its) + 1))
        else:
            shown = _shown_attempts(its, gamma)
            attempts, numbers = tuple(its[k] for k in shown), tuple(k + 1 for k in shown)
        return EffectGroup(
            act=act,
            entity=entity,
            count=len(its),
            histogram=((_EXC, counts[0]), (_UPD, counts[1]), (_NOC, counts[2])),
            attempts=attempts,
            numbers=numbers,
            first_t=its[0].event.t,
            latest_t=its[-1].event.t,
            goal_match=any(it.goal_match for it in its),
        )

    out = [
        _shared(("E", gamma, tuple(map(id, its))), its, lambda a=act, e=entity, its=its: build(a, e, its))
        for (act, entity), its in groups.items()
    ]
    out.sort(key=lambda g: g.latest_t)  # type: ignore[attr-defined]
    return ActionEffect(tuple(out))  # type: ignore[arg-type]


def _state_shared(selection: Selection, gamma: str) -> EntityState:
    """``compile_state`` with chains shared by their updates and rows by their chains."""
    goal = goal_terms_of(selection.goal_terms)
    chains: dict[str, list[StateValue]] = {}
    owner: dict[str, tuple[str, str]] = {}
    for it in selection.items:
        ev = it.event
        if not ev.deltas:
            continue
        for d, sv in zip(ev.deltas, _state_values(ev, goal), strict=True):
            chain = chains.get(d.key)
            if chain is None:
                chains[d.key] = [sv]
                owner[d.key] = (d.entity, d.attribute)
            else:
                chain.append(sv)
    by_entity: dict[str, list[str]] = {}
    for key in chains:
        by_entity.setdefault(owner[key][0], []).append(key)
    rows = []
    for entity, keys in by_entity.items():
        row_chains = tuple(
            _shared(
                ("C", gamma, key, tuple(map(id, chains[key]))),
                chains[key],
                lambda key=key: _chain(key, owner[key][1], chains[key], gamma),
            )
            for key in keys
        )
        first_t = min(chains[key][0].t for key in keys)
        latest_t = max(chains[key][-1].t for key in keys)
        goal_match = bool(goal) and not goal.isdisjoint(text_terms(entity))
        rows.append(
            _shared(
                ("R", entity, first_t, latest_t, goal_match, tuple(map(id, row_chains))),
                row_chains,
                lambda e=entity, c=row_chains, f=first_t, lt=latest_t, gm=goal_match: EntityRow(e, c, f, lt, gm),  # type: ignore[arg-type]
            )
        )
    rows.sort(key=lambda r: r.latest_t)  # type: ignore[attr-defined]
    return EntityState(tuple(rows))  # type: ignore[arg-type]


@lru_cache(maxsize=1024)
def goal_terms_of(terms: tuple[str, ...]) -> frozenset[str]:
    """One frozenset per goal-term tuple (its hash is computed once)."""
    return frozenset(terms)


# The last views whose entries (ActionEffect groups, EntityState rows and chains) are objects
# owned by an index: such objects recur at later decisions while unchanged, so Render keys
# its caches by their identity; for other views (fresh objects) it keys by content only.
_INDEXED_VIEWS: OrderedDict[int, View] = OrderedDict()
_INDEXED_VIEWS_MAX = 256


def _remember(view: View) -> View:
    with _REGISTRY_LOCK:
        _INDEXED_VIEWS[id(view)] = view
        if len(_INDEXED_VIEWS) > _INDEXED_VIEWS_MAX:
            _INDEXED_VIEWS.popitem(last=False)
    return view


def entries_are_indexed(view: View) -> bool:
    """Whether ``view`` was compiled from an index (its groups/rows/chains recur)."""
    return _INDEXED_VIEWS.get(id(view)) is view


def compose_indexed(
    records: EventStream | Sequence[StreamRecord], act: ViewAction, goal: str, cfg: ComposerConfig
) -> View:
    """``compose`` answered from the index (equal to ``reference.compose_reference``)."""
    idx = stream_index(records)
    if idx is None:
        sel = Selection(act, goal, tuple(sorted(goal_terms(goal))), (), 0, 0, ())
        return View(act, goal, sel.goal_terms, 0, 0, 0, compile_view(sel))
    with idx.lock:
        idx = _synced(idx, records)
        terms, base, k, tail, n_scope = _select_parts(idx, act, goal, cfg)
        n = len(idx.records)
        goal_t = tuple(sorted(terms))
        if base is not None and act.tau != "DependencyChain":
            body = base.compile(act.tau, act.gamma)
            return _remember(View(act, goal, goal_t, n, n_scope, k, body))
        if base is not None:
            body = _dependency(base, k, tail, min(n, 2), act.gamma)
            return View(act, goal, goal_t, n, n_scope, k + len(tail), body)
        sel = Selection(act, goal, goal_t, tuple(tail), n, n_scope, _recent_ts(idx))
        # Shared instances need no lock: a race builds an equal object twice, nothing worse.
        if act.tau == "ActionEffect":
            return _remember(View(act, goal, goal_t, n, n_scope, len(tail), _effect_shared(sel, act.gamma)))
        if act.tau == "EntityState":
            return _remember(View(act, goal, goal_t, n, n_scope, len(tail), _state_shared(sel, act.gamma)))
        return View(act, goal, goal_t, n, n_scope, len(tail), compile_view(sel))
