"""Recorder: D.1 validation, latest value per key, append-only and lossless round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memprism_ray.recorder import Event, EventStream, Outcome, RawEvent, StateDelta, split_key
from memprism_ray.recorder.validate import classify_outcome, validate_deltas

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
json_scalar = (
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False) | text
)
json_value = st.recursive(
    json_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8
)
keys = st.sampled_from(
    ["agent.location", "agent.holding", "mug 1.location", "drawer 1.open", "held_object", "apple", " ", ""]
)
values = st.sampled_from(["drawer 1", "open", "closed", "mug 1", "(none)", "none", "unknown", "", " clean "])


@st.composite
def step(draw: st.DrawFn) -> dict:
    return {
        "raw": RawEvent(
            o_pre=draw(text),
            action=draw(
                st.one_of(text, st.fixed_dictionaries({"op": st.sampled_from(["CLICK", "TYPE"]), "ref": text}))
            ),
            feedback=draw(text),
            reward=draw(st.floats(-1, 1)),
            meta=draw(st.dictionaries(text, json_value, max_size=3)),
        ),
        "entity": draw(text),
        "act": draw(st.sampled_from(["go", "take", "open", "put"])),
        "delta": draw(st.lists(st.tuples(keys, values), max_size=5)),
        "failed": draw(st.booleans()),
        "evidence": draw(st.dictionaries(text, json_value, max_size=2)),
    }


def build(steps: list[dict], meta: dict | None = None) -> EventStream:
    s = EventStream(meta or {"goal": "put a clean mug in cabinet"})
    for kw in steps:
        kw = dict(kw)
        raw = kw.pop("raw")
        s.record(raw, **kw)
    return s


def test_validation_drops_empty_unknown_and_exact_duplicates() -> None:
    deltas = [
        StateDelta("agent.location", "drawer 1"),
        StateDelta("", "x"),
        StateDelta("  ", "x"),
        StateDelta("mug 1.location", "unknown"),
        StateDelta("mug 1.location", ""),
        StateDelta("agent.location", "drawer 1"),  # exact duplicate in the same response
        StateDelta("agent.holding", "(none)"),  # a legitimate value
        StateDelta("agent.location", "drawer 2"),  # same key, new value: not an exact duplicate
    ]
    accepted, report = validate_deltas(deltas)
    assert accepted == (
        StateDelta("agent.location", "drawer 1"),
        StateDelta("agent.holding", "(none)"),
        StateDelta("agent.location", "drawer 2"),
    )
    assert (report.empty_key, report.unknown_value, report.duplicate) == (2, 2, 1)


def test_repeated_event_keeps_accepted_deltas_and_tracks_latest() -> None:
    s = EventStream()
    raw = RawEvent("You are in the room.", "go to drawer 1", "You arrive at drawer 1.")
    e1 = s.record(raw, entity="drawer 1", act="go", delta=[("agent.location", "drawer 1")])
    e2 = s.record(raw, entity="drawer 1", act="go", delta=[("agent.location", "drawer 1")])
    assert e1.outcome is Outcome.STATE_UPDATE
    # The repeated event keeps its delta but changes nothing known.
    assert e2.delta == (StateDelta("agent.location", "drawer 1"),)
    assert e2.outcome is Outcome.NO_OBSERVED_CHANGE
    assert s[1].changed == (False,) and s[0].changed == (True,)
    s.record(raw, entity="drawer 2", act="go", delta=[("agent.location", "drawer 2")])
    assert s.state["agent.location"] == "drawer 2"
    assert [e.t for e in s.events] == [1, 2, 3]


def test_failed_action_is_exception() -> None:
    assert classify_outcome([StateDelta("a.b", "c")], {}, failed=True) is Outcome.EXCEPTION
    assert classify_outcome([StateDelta("a.b", "c")], {"a.b": "c"}, failed=False) is Outcome.NO_OBSERVED_CHANGE
    assert classify_outcome([], {}, failed=False) is Outcome.NO_OBSERVED_CHANGE


def test_bad_append_loses_nothing() -> None:
    s = build([{"raw": RawEvent("o", "go to x", "ok"), "entity": "x", "act": "go", "delta": [("agent.location", "x")]}])
    before = (s.records, s.state, s.content_digest)
    with pytest.raises(ValueError, match="expects t=2"):
        s.append(RawEvent("o", "a", "f"), Event(5, "x", "go", "state_update"))
    with pytest.raises(ValueError, match="unknown outcome 'maybe'"):
        s.append(RawEvent("o", "a", "f"), Event(2, "x", "go", "maybe"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="JSON-serialisable"):
        RawEvent("o", "a", "f", meta={"x": object()})
    assert (s.records, s.state, s.content_digest) == before


def test_split_key() -> None:
    assert split_key("mug 1.location") == ("mug 1", "location")
    assert split_key("held_object") == ("agent", "held_object")
    assert split_key("drawer 1") == ("drawer 1", "state")


@settings(max_examples=60, deadline=None)
@given(st.lists(step(), max_size=12))
def test_jsonl_and_parquet_round_trip_losslessly(tmp_path_factory: pytest.TempPathFactory, steps: list[dict]) -> None:
    tmp = tmp_path_factory.mktemp("rt")
    s = build(steps, meta={"goal": "g", "task_id": "t-1", "nested": {"a": [1, 2.5, None]}})
    s.to_jsonl(tmp / "s.jsonl")
    s.to_parquet(tmp / "s.parquet")
    for path in ("s.jsonl", "s.parquet"):
        back = EventStream.load(tmp / path)
        assert back == s
        assert back.state == s.state
        assert back.content_digest == s.content_digest
        assert [r.changed for r in back] == [r.changed for r in s]
        assert [type(r.raw.action) for r in back] == [type(r.raw.action) for r in s]


@settings(max_examples=40, deadline=None)
@given(st.lists(step(), max_size=10))
def test_latest_value_is_last_accepted_write(steps: list[dict]) -> None:
    s = build(steps)
    expected: dict[str, str] = {}
    for rec in s:
        for d in rec.event.delta:
            assert d.key.strip() and d.key == d.key.strip()
            assert d.new_value.lower() not in ("", "unknown")
            expected[d.key] = d.new_value
    assert s.state == expected


def test_load_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        EventStream.load(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "memprism-events", "version": 1, "meta": {}}\n{"raw": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        EventStream.load(bad)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="cannot read as Parquet"):
        EventStream.load(junk)
    with pytest.raises(ValueError, match="unknown event-stream format"):
        EventStream.load(junk.rename(tmp_path / "x.csv"))


def test_content_digest_is_content_address() -> None:
    steps = [{"raw": RawEvent("o", "go to a", "ok"), "entity": "a", "act": "go", "delta": [("agent.location", "a")]}]
    a, b = build(steps), build(steps, meta={"episode_id": "other"})
    assert a.content_digest == b.content_digest  # stream meta is bookkeeping, not content
    c = build(steps + steps)
    assert c.content_digest != a.content_digest
    assert c.copy().content_digest == c.content_digest
