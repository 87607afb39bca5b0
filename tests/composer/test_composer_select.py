"""Composer select: Merge(sigma_{w,c}, TaskRelevant, RecentContext) of appendix D.3."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memprism_ray.composer import ComposerConfig, Reason, compose, goal_terms, select, text_terms
from memprism_ray.composer.records import EventView
from memprism_ray.recorder import EventStream, RawEvent, StreamRecord
from memprism_ray.testing.synthetic_streams import alfworld_like_stream, random_stream
from memprism_ray.view_space import ALL_ACTIONS, WINDOW_SIZES, ViewAction

actions = st.sampled_from(ALL_ACTIONS)
goals = st.sampled_from(["put a clean mug in cabinet", "heat some apple and put it in drawer", "", "look around"])
modes = st.sampled_from(["window", "history", "off"])


def reference(stream: EventStream, action: ViewAction, goal: str, mode: str) -> dict[int, Reason]:
    """An independent, literal reading of the D.3 Merge."""
    events = stream.events
    n = len(events)
    size = WINDOW_SIZES[action.window]
    in_window = {e.t for e in events[-size:]} if size else {e.t for e in events}
    terms = goal_terms(goal)
    out: dict[int, Reason] = {}
    for rec in stream:
        e = rec.event
        words = text_terms(" ".join([e.entity, rec.raw.action_text, *(f"{d.key} {d.new_value}" for d in e.delta)]))
        matches = bool(terms & words)
        if e.t in in_window and (action.filter == "all" or e.outcome.value == action.filter):
            out[e.t] = Reason.SCOPE
        elif (matches and mode == "history") or (matches and mode == "window" and e.t in in_window):
            out[e.t] = Reason.GOAL_RESTORE
        elif action.tau == "DependencyChain" and e.t > n - 2:
            out[e.t] = Reason.RECENT_CONTEXT
    return out


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 40), seed=st.integers(0, 10_000), action=actions, goal=goals, mode=modes)
def test_select_is_the_c3_merge(n: int, seed: int, action: ViewAction, goal: str, mode: str) -> None:
    stream = random_stream(n, seed)
    sel = select(stream, action, goal, ComposerConfig(goal_restore=mode))
    got = {it.event.t: it.reason for it in sel.items}
    assert got == reference(stream, action, goal, mode)
    ts = [it.event.t for it in sel.items]
    assert ts == sorted(set(ts)), "time order, no duplicates"
    assert sel.n_stream == n
    assert sel.n_scope == sum(1 for r in got.values() if r is Reason.SCOPE)
    terms = goal_terms(goal)
    for it in sel.items:
        assert it.goal_match == bool(terms & it.event.terms)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(11, 60), seed=st.integers(0, 1000), action=actions)
def test_window_sizes_and_filters(n: int, seed: int, action: ViewAction) -> None:
    stream = random_stream(n, seed)
    sel = select(stream, action, "", ComposerConfig(goal_restore="off"))
    scope = [it for it in sel.items if it.reason is Reason.SCOPE]
    size = {"recent_short": 6, "recent_long": 10, "all": n}[action.window]
    window = stream.events[n - size :]
    assert [it.event.t for it in scope] == [
        e.t for e in window if action.filter == "all" or e.outcome.value == action.filter
    ]
    assert all(it.event.t > n - size for it in scope)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 50), seed=st.integers(0, 1000), action=actions)
def test_dependency_chain_keeps_latest_and_previous_from_unfiltered_stream(
    n: int, seed: int, action: ViewAction
) -> None:
    stream = random_stream(n, seed)
    dep = ViewAction("DependencyChain", action.window, action.filter, action.gamma)
    sel = select(stream, dep, "")
    ts = [it.event.t for it in sel.items]
    assert ts[-1] == n
    if n >= 2:
        assert ts[-2] == n - 1
    latest = sel.items[-1]
    if action.filter not in ("all", latest.event.outcome.value):
        assert latest.reason is Reason.RECENT_CONTEXT
    # Other view types never add recent context.
    other = select(stream, ViewAction("TemporalTrace", action.window, action.filter, action.gamma), "")
    assert all(it.reason is not Reason.RECENT_CONTEXT for it in other.items)


def test_goal_restore_brings_back_filtered_goal_events() -> None:
    s = EventStream({"goal": "put a clean mug in cabinet"})

    def step(action: str, entity: str, delta: list[tuple[str, str]], failed: bool = False) -> None:
        s.record(RawEvent("o", action, "f"), entity=entity, act=action.split()[0], delta=delta, failed=failed)

    step("go to countertop 1", "countertop 1", [("agent.location", "countertop 1")])
    step("take mug 2 from countertop 1", "mug 2", [("agent.holding", "mug 2")])  # plural/instance folding
    step("go to sinkbasin 1", "sinkbasin 1", [("agent.location", "sinkbasin 1")])
    step("open cabinet 3", "cabinet 3", [], failed=True)
    step("look", "agent", [])
    sel = select(s, ViewAction("TemporalTrace", "recent_short", "exception", "fine"), s.meta["goal"])
    assert {it.event.t: it.reason for it in sel.items} == {2: Reason.GOAL_RESTORE, 4: Reason.SCOPE}
    assert [it.goal_match for it in sel.items] == [True, True]
    sel = select(s, "TemporalTrace/recent_short/exception/fine", "put two mugs in the cabinet")
    assert [it.event.t for it in sel.items] == [2, 4]


def test_goal_restore_reads_the_whole_history_by_default() -> None:
    """D.3: Merge(sigma_{w,c}(E_<t), TaskRelevant(E_<t, g), ...) restores goal-matching
    events from the whole history, not only from the time window; ``window`` is an option."""
    s = EventStream({"goal": "put a clean mug in cabinet"})
    s.record(RawEvent("o", "take mug 1 from countertop 1", "f"), entity="mug 1", act="take",
             delta=[("agent.holding", "mug 1")])  # fmt: skip
    for k in range(8):
        s.record(RawEvent("o", f"go to shelf {k + 1}", "f"), entity=f"shelf {k + 1}", act="go",
                 delta=[("agent.location", f"shelf {k + 1}")])  # fmt: skip
    a = ViewAction("TemporalTrace", "recent_short", "all", "fine")
    assert ComposerConfig().goal_restore == "history"
    sel = select(s, a, s.meta["goal"])
    assert [(it.event.t, it.reason) for it in sel.items][:2] == [(1, Reason.GOAL_RESTORE), (4, Reason.SCOPE)]
    assert compose(s, a).n_selected == 7
    windowed = select(s, a, s.meta["goal"], ComposerConfig(goal_restore="window"))
    assert [it.event.t for it in windowed.items] == list(range(4, 10))


def test_goal_terms_definition() -> None:
    assert goal_terms("put a clean mug in cabinet 2") == {"clean", "mug", "cabinet"}
    assert goal_terms("Put two knives in the drawers") == {"knife", "drawer"}
    assert goal_terms("look at the bowl under the desklamp") == {"bowl", "desklamp"}
    assert goal_terms("find some potatoes, boxes and glasses") == {"potato", "box", "glass"}
    assert goal_terms("") == frozenset()
    assert text_terms("Cabinet_12 / mug 3") == {"cabinet", "mug"}
    assert "house" in text_terms("houses")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 30), seed=st.integers(0, 1000), action=actions, goal=goals)
def test_compose_never_changes_the_stream(n: int, seed: int, action: ViewAction, goal: str) -> None:
    stream = random_stream(n, seed)
    before = (stream.records, stream.state, stream.content_digest, len(stream))
    select(stream, action, goal)
    for gamma in ("coarse", "medium", "fine"):
        compose(stream, ViewAction(action.tau, action.window, action.filter, gamma), goal)
    assert (stream.records, stream.state, stream.content_digest, len(stream)) == before


def test_select_accepts_records_and_rejects_other_input() -> None:
    stream = alfworld_like_stream(30, 2)
    a = ViewAction("EntityState", "recent_long", "all", "medium")
    assert select(list(stream), a, "x").items == select(stream, a, "x").items
    with pytest.raises(ValueError, match="not a StreamRecord"):
        select([1, 2], a, "x")  # type: ignore[list-item]
    with pytest.raises(ValueError, match="EventStream or a sequence"):
        select("events.jsonl", a, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="time order"):
        select([stream[3], stream[1]], a, "x")
    with pytest.raises(ValueError, match="unknown view tau"):
        select(stream, "Nope/all/all/fine", "x")
    with pytest.raises(ValueError, match="goal_restore"):
        ComposerConfig(goal_restore="sometimes")


def test_recent_window_selection_reads_only_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    select_mod = importlib.import_module("memprism_ray.composer.select")  # the package exports a function of that name
    read: list[int] = []
    real = select_mod.event_view

    def counting(record: StreamRecord) -> EventView:
        read.append(record.event.t)
        return real(record)

    monkeypatch.setattr(select_mod, "event_view", counting)
    stream = alfworld_like_stream(300, 1)
    a = ViewAction("ActionEffect", "recent_long", "exception", "fine")
    select(stream, a, stream.meta["goal"], ComposerConfig("window"))
    assert read == list(range(291, 301))
    read.clear()
    select(stream, a, stream.meta["goal"], ComposerConfig("history"))
    assert read == list(range(1, 301))
