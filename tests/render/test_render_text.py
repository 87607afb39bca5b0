"""Text renderer: the Dynamic Text twin of the image (same entries, same cap)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memprism_ray.composer import SelectedEvent, compose
from memprism_ray.composer.structures import TraceGap, TraceRun
from memprism_ray.recorder import EventStream, RawEvent
from memprism_ray.render import RenderConfig, layout, render_text
from memprism_ray.testing.synthetic_streams import alfworld_like_stream, random_stream
from memprism_ray.view_space import ALL_ACTIONS, ViewAction

HEADER = 3


def alfworld_steps() -> EventStream:
    s = EventStream({"goal": "put a clean mug in cabinet"})
    for action, entity, delta, failed in [
        (
            "go to countertop 2",
            "countertop 2",
            [("agent.location", "countertop 2"), ("mug 1.location", "countertop 2")],
            False,
        ),
        ("examine countertop 2", "countertop 2", [], False),
        ("open countertop 2", "countertop 2", [], True),
        ("go to countertop 2", "countertop 2", [("agent.location", "countertop 2")], False),
        ("go to drawer 1", "drawer 1", [("agent.location", "drawer 1")], False),
        ("go to countertop 2", "countertop 2", [("agent.location", "countertop 2")], False),
        ("take mug 1 from countertop 2", "mug 1", [("agent.holding", "mug 1"), ("mug 1.location", "agent")], False),
    ]:
        s.record(RawEvent("o", action, "f"), entity=entity, act=action.split()[0], delta=delta, failed=failed)
    return s


def test_lines_read_verbatim() -> None:
    s = alfworld_steps()
    text = render_text(compose(s, "TemporalTrace/recent_long/all/fine", goal=""))
    lines = text.splitlines()
    assert lines[0] == "view: TemporalTrace | window=recent_long | filter=all | gamma=fine"
    assert lines[1] == "goal: "
    assert lines[2] == "events 7 | in scope 7 | selected 7 | entries 7"
    assert (
        lines[-1]
        == "step 7 | take mug 1 from countertop 2 | state_update | agent.holding -> mug 1; mug 1.location -> agent"
    )
    assert "step 3 | open countertop 2 | exception" in lines
    assert "step 2 | examine countertop 2 | no_observed_change" in lines
    # the repeated location is an unchanged delta: fine shows it with '=', medium hides it
    assert "step 4 | go to countertop 2 | no_observed_change | agent.location = countertop 2" in lines
    medium = render_text(compose(s, "TemporalTrace/recent_long/all/medium", goal="")).splitlines()
    assert "steps 4-5" not in "\n".join(medium)  # 4 is no-change, 5 an update: no run
    goal_text = render_text(compose(s, "TemporalTrace/recent_long/all/fine"))
    assert (
        goal_text.splitlines()[-1].endswith("[goal]")
        and goal_text.splitlines()[1] == "goal: put a clean mug in cabinet"
    )


def test_grouped_views_name_entities_and_attempts() -> None:
    s = alfworld_steps()
    effect = render_text(compose(s, "ActionEffect/all/all/fine", goal="")).splitlines()
    i = effect.index("go countertop 2 | attempts 3 | exception 0, state_update 2, no_observed_change 1")
    assert effect[i + 1 : i + 4] == [
        "  #1 step 1 | go to countertop 2 | state_update | agent.location -> countertop 2; "
        "mug 1.location -> countertop 2",
        "  #2 step 4 | go to countertop 2 | no_observed_change | agent.location = countertop 2",
        "  #3 step 6 | go to countertop 2 | state_update | agent.location -> countertop 2",
    ]
    state = render_text(compose(s, "EntityState/all/all/medium", goal="")).splitlines()
    assert "mug 1 | mug 1.location: countertop 2 -> agent" in state
    assert "agent | agent.location: countertop 2 -> drawer 1 -> countertop 2 | agent.holding: mug 1" in state
    fine = render_text(compose(s, "EntityState/all/all/fine", goal="")).splitlines()
    assert "mug 1 | mug 1.location: countertop 2 -> agent | sources: step 1 go, step 7 take" in fine, (
        "fine chains name each update's source step and action"
    )
    dep = render_text(compose(s, "DependencyChain/all/all/medium", goal="")).splitlines()
    assert dep[HEADER].startswith("anchor | step 7 | take mug 1 from countertop 2")
    assert dep[HEADER + 1].startswith("previous | step 6 | go to countertop 2")
    # Shared agent.* keys link too (paper "Composer": events that share entities, state keys).
    assert dep[HEADER + 2] == (
        "shared_key | step 5 | go to drawer 1 | state_update | agent.location -> drawer 1 | via agent"
    )
    assert dep[HEADER + 4] == (
        "shared_key | step 1 | go to countertop 2 | state_update | agent.location -> countertop 2; "
        "mug 1.location -> countertop 2 | via agent, mug 1"
    )
    assert [line.split(" | ")[0] for line in dep[HEADER + 5 :]] == ["context"] * 2


def entry_ts(entry) -> tuple[int, int]:
    if isinstance(entry, SelectedEvent):
        return entry.event.t, entry.event.t
    if isinstance(entry, TraceRun):
        return entry.first.t, entry.last.t
    assert isinstance(entry, TraceGap)
    return entry.first_t, entry.last_t


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(0, 400),
    seed=st.integers(0, 100),
    action=st.sampled_from([a for a in ALL_ACTIONS if a.tau == "TemporalTrace"]),
    side=st.sampled_from([448, 672, 896]),
)
def test_same_cap_as_the_image(n: int, seed: int, action: ViewAction, side: int) -> None:
    view = compose(alfworld_like_stream(n, seed), action)
    cfg = RenderConfig(max_side=side)
    page = layout(view, cfg)
    lines = render_text(view, cfg).splitlines()
    body = lines[HEADER:]
    entries = view.body.entries  # type: ignore[union-attr]
    if page.omitted:
        assert body[0] == f"... {page.omitted} earlier entries omitted"
        body = body[1:]
    elif not entries:
        assert body == ["(no events in this view)"]
        return
    assert len(body) == page.shown == len(entries) - page.omitted
    for line, entry in zip(body, entries[page.omitted :], strict=False):
        a, b = entry_ts(entry)
        assert re.match(rf"steps? {a}(-{b})? \|", line), (line, a, b)
    # the image draws exactly the kept entries: one block per entry after the marker
    drawn = [blk for blk in page.blocks if blk.kind != "marker"]
    assert [blk.lines for blk in drawn] == [[line] for line in body]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 120), seed=st.integers(0, 100), action=st.sampled_from(ALL_ACTIONS))
def test_text_is_the_layout_of_every_view(n: int, seed: int, action: ViewAction) -> None:
    view = compose(random_stream(n, seed), action)
    page = layout(view)
    text = render_text(view)
    assert text == "\n".join(page.lines)
    assert text.count("\n") + 1 == HEADER + sum(len(b.lines) for b in page.blocks)
    assert "\t" not in text


def test_scripted_reader_finds_what_the_view_shows() -> None:
    reader = pytest.importorskip("memprism_ray.benchmark.alfworld.reader")
    stream = alfworld_like_stream(60, 11)
    text = render_text(compose(stream, "EntityState/all/state_update/medium"), RenderConfig(max_side=896))
    facts = reader.read_facts(text)
    shown = {line.split(" | ", 1)[0] for line in text.splitlines()[HEADER:]}
    checked = 0
    for key, value in stream.state.items():
        entity, _, attr = key.rpartition(".")
        if attr == "location" and entity in shown and entity != "agent" and value != "agent":
            assert facts.seen_at.get(entity) == value, (entity, value)
            checked += 1
    assert checked >= 3
