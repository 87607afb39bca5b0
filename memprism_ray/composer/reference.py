"""Reference Composer: the straightforward O(N) ``select`` and compilers (paper "Composer:
Relational View Construction", appendix D.3; appendix "Computational and storage
complexity": scope filtering is O(N) in the history length).

This is the literal implementation every view is defined by: ``select_reference`` walks
the events that can be selected once, and the compilers of ``composer.compilers`` (each
one pass over the selection) build the structure. The production path
(``composer.select``/``compose``) answers the same question from an incremental per-stream
index (``composer.index``) so that a decision costs what the page shows, not what the
history holds; it must return *equal* structures for every stream, view action, goal and
setting, which the tests check against this module.
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

from memprism_ray.composer.compilers import compile_view
from memprism_ray.composer.records import _CACHE, event_view
from memprism_ray.composer.select import (
    DEFAULT_CONFIG,
    ComposerConfig,
    Reason,
    SelectedEvent,
    Selection,
    as_action,
    as_records,
)
from memprism_ray.composer.structures import View
from memprism_ray.composer.terms import goal_terms
from memprism_ray.recorder.events import Outcome
from memprism_ray.recorder.stream import EventStream, StreamRecord
from memprism_ray.view_space import WINDOW_SIZES, ViewAction


# --- Select ----------------------------------------------------------------------------
def select_reference(
    stream_or_records: EventStream | Sequence[StreamRecord],
    action: ViewAction | str,
    goal: str,
    config: ComposerConfig | None = None,
) -> Selection:
    """``Merge(sigma_{w,c}(E), TaskRelevant(E, g), RecentContext(E, tau))`` (D.3), one
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
    body = compile_view(sel)
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
