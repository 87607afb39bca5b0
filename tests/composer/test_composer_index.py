"""The incremental index (``composer.index``) against the reference O(N) path.

``compose``/``select`` answer from a per-stream index that is extended by new events only;
every answer must equal ``compose_reference``/``select_reference`` (the verbatim
straightforward implementation) whatever the order in which views are asked for while the
stream grows, for streams, tuples and lists of records, all 144 actions, goals and
goal-restore modes.
"""

from __future__ import annotations

import gc
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memprism_ray.composer import ComposerConfig, compose, select
from memprism_ray.composer.index import _STREAMS, clear_indexes
from memprism_ray.composer.reference import compose_reference, select_reference
from memprism_ray.composer.synthetic import alfworld_like_stream, random_stream
from memprism_ray.recorder import EventStream
from memprism_ray.view_space import ALL_ACTIONS

GOALS = [None, "", "put a clean mug in cabinet", "heat some apple and put it in drawer", "open the drawer"]
MODES = ["window", "history", "off"]

requests = st.tuples(
    st.integers(0, len(ALL_ACTIONS) - 1),
    st.sampled_from(GOALS),
    st.sampled_from(MODES),
    st.sampled_from(["s", "t", "l"]),
)


def _source(kind: str, stream: EventStream, records: list) -> object:
    return {"s": stream, "t": tuple(records), "l": list(records)}[kind]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    kind=st.sampled_from(["random", "alfworld"]),
    n=st.integers(0, 90),
    plan=st.lists(st.tuples(st.integers(0, 6), st.lists(requests, min_size=1, max_size=6)), min_size=1, max_size=25),
)
def test_growing_stream_equals_reference(seed: int, kind: str, n: int, plan: list) -> None:
    """Append a few events, ask for a few views, repeat: every view equals the reference."""
    clear_indexes()
    full = random_stream(n, seed) if kind == "random" else alfworld_like_stream(n, seed)
    grow = EventStream(full.meta)
    records: list = []
    it = iter(full)
    for k, asks in plan:
        for rec in [r for _, r in zip(range(k), it, strict=False)]:
            grow.append(rec.raw, rec.event)
            records.append(rec)
        for index, goal, mode, src_kind in asks:
            action = ALL_ACTIONS[index]
            cfg = ComposerConfig(goal_restore=mode)
            src = _source(src_kind, grow, records)
            assert compose(src, action, goal, cfg) == compose_reference(src, action, goal, cfg), action.name
            g = goal or ""
            assert select(src, action, g, cfg) == select_reference(src, action, g, cfg), action.name


@pytest.mark.parametrize("n", [0, 1, 2, 3, 57])
def test_every_action_equals_reference(n: int) -> None:
    stream = random_stream(n, 11)
    for action in ALL_ACTIONS:
        for goal in GOALS:
            for mode in MODES:
                cfg = ComposerConfig(goal_restore=mode)
                assert compose(stream, action, goal, cfg) == compose_reference(stream, action, goal, cfg)


def test_long_alfworld_stream_equals_reference_at_every_step() -> None:
    """A 400-event episode grown one event per decision, every window=all view each 37 steps."""
    full = alfworld_like_stream(400, 3)
    grow = EventStream(full.meta)
    wide = [a for a in ALL_ACTIONS if a.window == "all"]
    for k, rec in enumerate(full):
        grow.append(rec.raw, rec.event)
        a = ALL_ACTIONS[(k * 13) % len(ALL_ACTIONS)]
        assert compose(grow, a) == compose_reference(grow, a)
        if k % 37 == 0:
            for b in wide:
                assert compose(grow, b) == compose_reference(grow, b)


def test_sequences_sharing_a_first_record_are_not_confused() -> None:
    """Two record tuples that start with the same record and then differ: an index built for
    one must not answer for the other (identity of the whole indexed prefix is checked)."""
    a = alfworld_like_stream(60, 1)
    b = alfworld_like_stream(60, 2)
    mixed = (a[0], *b.records[1:])
    action = ALL_ACTIONS[0]
    for act in (action, *[x for x in ALL_ACTIONS if x.window == "all"]):
        assert compose(a.records, act) == compose_reference(a.records, act)
        assert compose(mixed, act) == compose_reference(mixed, act)
        assert compose(a.records[:30], act) == compose_reference(a.records[:30], act)


def test_copied_and_rebuilt_streams_get_their_own_answers() -> None:
    base = random_stream(40, 5)
    twin = base.copy()
    extra = random_stream(45, 6)
    for rec in extra.records[40:]:
        twin.append(rec.raw, rec.event)
    for act in [x for x in ALL_ACTIONS if x.window == "all"]:
        assert compose(base, act) == compose_reference(base, act)
        assert compose(twin, act) == compose_reference(twin, act)
        assert compose(base, act).n_stream == 40 and compose(twin, act).n_stream == 45


def test_bad_sequences_raise_the_reference_errors() -> None:
    stream = random_stream(12, 2)
    recs = list(stream.records)
    compose(tuple(recs), "TemporalTrace/all/all/fine")  # index the valid prefix first
    cases = [
        (*recs, "not a record"),
        (*recs[:5], recs[7], *recs[6:]),
        ("x", *recs),
        (recs[3], recs[1]),
    ]
    for bad in cases:
        with pytest.raises(ValueError) as got:
            compose(bad, "TemporalTrace/all/all/fine")
        with pytest.raises(ValueError) as want:
            compose_reference(bad, "TemporalTrace/all/all/fine")
        assert str(got.value) == str(want.value)
    with pytest.raises(ValueError, match="EventStream or a sequence"):
        compose({"a": 1}, "TemporalTrace/all/all/fine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="goal must be a string"):
        compose(stream, "TemporalTrace/all/all/fine", 3)  # type: ignore[arg-type]


def test_index_dies_with_its_stream() -> None:
    clear_indexes()
    stream = random_stream(30, 1)
    compose(stream, "EntityState/all/all/fine")
    assert len(_STREAMS) == 1
    del stream
    gc.collect()
    assert len(_STREAMS) == 0


def test_recent_windows_read_only_their_events() -> None:
    """A recent-window view of a long stream does not read the whole history (as the
    reference); a window=all view does, once, and later views read only new events."""
    from memprism_ray.composer.records import _CACHE, clear_cache

    stream = alfworld_like_stream(300, 4)
    clear_cache()
    compose(stream, "DependencyChain/recent_short/exception/coarse")
    assert sorted(view.t for _, view in _CACHE.values()) == list(range(295, 301))
    compose(stream, "TemporalTrace/all/all/coarse")
    assert len(_CACHE) == 300
    sample = alfworld_like_stream(301, 4)[300]
    stream.append(sample.raw, sample.event)
    _CACHE.clear()  # readings only: the index keeps what it has read
    compose(stream, "TemporalTrace/all/all/coarse")
    assert [view.t for _, view in _CACHE.values()] == [301]
    clear_cache()  # readings and indexes: the next window=all view reads everything again
    compose(stream, "TemporalTrace/all/all/coarse")
    assert len(_CACHE) == 301


def test_concurrent_views_of_one_growing_stream_equal_reference() -> None:
    full = alfworld_like_stream(200, 9)
    grow = EventStream(full.meta)
    for rec in full.records[:100]:
        grow.append(rec.raw, rec.event)
    wide = [a for a in ALL_ACTIONS if a.window == "all"]
    errors: list[str] = []

    def worker(offset: int) -> None:
        for k in range(60):
            a = wide[(k + offset) % len(wide)]
            view = compose(grow, a)
            # Whatever length the stream had when the view was taken, the view is that prefix's.
            if view != compose_reference(grow.records[: view.n_stream], a, grow.meta["goal"]):
                errors.append(a.name)

    threads = [threading.Thread(target=worker, args=(i * 5,)) for i in range(3)]
    for t in threads:
        t.start()
    for rec in full.records[100:]:
        grow.append(rec.raw, rec.event)
    for t in threads:
        t.join()
    assert not errors


def test_a_stream_received_anew_each_decision_continues_its_index() -> None:
    """An actor receives the pickled stream at every decision (a new object each time): the
    index of the previous copy is continued (proven by the recorder's digest chain) and
    reads only the new events; answers equal the reference."""
    import pickle

    from memprism_ray.composer.records import _CACHE

    clear_indexes()
    full = alfworld_like_stream(120, 6)
    grow = EventStream(full.meta)
    for rec in full.records[:100]:
        grow.append(rec.raw, rec.event)
    compose(pickle.loads(pickle.dumps(grow)), "EntityState/all/all/fine")
    unread = 0  # events appended since the last window=all view read the history
    for k, rec in enumerate(full.records[100:]):
        grow.append(rec.raw, rec.event)
        unread += 1
        received = pickle.loads(pickle.dumps(grow))
        _CACHE.clear()
        action = ALL_ACTIONS[(k * 17) % len(ALL_ACTIONS)]
        view = compose(received, action)
        read = len(_CACHE)
        assert view == compose_reference(received, action), action.name
        if action.window == "all":
            assert read <= unread, f"{action.name} read {read} records, expected the {unread} new ones"
            unread = 0


def test_continuation_needs_the_same_content() -> None:
    """Streams with the same meta and length but other events, or a live stream's copy,
    never take over another stream's index."""
    import pickle

    clear_indexes()
    a = random_stream(40, 1)
    b = random_stream(40, 2)  # same meta (goal) except the task id: rebuild it with a's meta
    other = EventStream(a.meta)
    for rec in b:
        other.append(rec.raw, rec.event)
    wide = [x for x in ALL_ACTIONS if x.window == "all"]
    first = pickle.loads(pickle.dumps(a))
    for act in wide:
        assert compose(first, act) == compose_reference(first, act)
    del first
    gc.collect()
    for act in wide:
        assert compose(other, act) == compose_reference(other, act)
    live = pickle.loads(pickle.dumps(a))
    twin = pickle.loads(pickle.dumps(a))
    for act in wide:
        assert compose(live, act) == compose_reference(live, act)
        assert compose(twin, act) == compose_reference(twin, act)
    from memprism_ray.composer.records import _CACHE

    _CACHE.clear()
    compose(live, wide[0])
    assert len(_CACHE) == 0, "the live stream kept its own index (the twin did not take it)"
    extra = random_stream(41, 1)
    live.append(extra[40].raw, extra[40].event)
    for act in wide:
        assert compose(live, act) == compose_reference(live, act)
        assert compose(twin, act) == compose_reference(twin, act)
