"""What the scripted policy can learn from text it is shown (benchmark/alfworld/reader.py):
ALFWorld feedback sentences, commands in histories and views, and the rule Phi's state keys
as the text renderer prints them."""

from __future__ import annotations

import pytest

from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
from memprism_ray.benchmark.alfworld.reader import EpisodeFacts, instance_type, read_facts
from memprism_ray.composer import compose
from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.stream import EventStream
from memprism_ray.render import render_text
from memprism_ray.view_space import ViewAction


@pytest.mark.parametrize(
    ("name", "kind"), [("mug 1", "mug"), ("butterknife 12", "butterknife"), ("desklamp", "desklamp"), ("", "")]
)
def test_instance_type(name: str, kind: str) -> None:
    assert instance_type(name) == kind


def test_engine_feedback_sentences() -> None:
    f = read_facts(
        "You arrive at countertop 1. On the countertop 1, you see a mug 1, an apple 2, and a knife 1.",
        "You arrive at cabinet 3. The cabinet 3 is closed.",
        "You open the cabinet 3. The cabinet 3 is open. In it, you see a plate 1.",
        "You arrive at drawer 2. The drawer 2 is closed.",
        "You pick up the mug 1 from the countertop 1.",
        "You heat the mug 1 using the microwave 1.",
    )
    assert f.seen_at == {"apple 2": "countertop 1", "knife 1": "countertop 1", "plate 1": "cabinet 3"}
    assert f.visited == ["countertop 1", "cabinet 3", "drawer 2"] and f.location == "drawer 2"
    assert f.opened == {"cabinet 3"} and f.closed == {"drawer 2"}
    assert f.holding == "mug 1" and f.states == {"mug 1": {"hot"}}


def test_moving_and_placing() -> None:
    f = read_facts(
        "You pick up the cd 1 from the drawer 3.",
        "You move the cd 1 to the shelf 2.",
        "You put the pen 2 in the desk 1.",
    )
    assert f.holding is None
    assert f.placed == {"cd 1": "shelf 2", "pen 2": "desk 1"} and f.seen_at["cd 1"] == "shelf 2"
    again = read_facts("You move the cd 1 to the shelf 2.", "You pick up the cd 1 from the shelf 2.")
    assert again.placed == {} and again.holding == "cd 1" and "cd 1" not in again.seen_at


def test_a_later_look_replaces_what_was_seen_there() -> None:
    f = read_facts(
        "You arrive at sidetable 1. On the sidetable 1, you see a keychain 1, and a pen 1.",
        "You arrive at sidetable 1. On the sidetable 1, you see a pen 1.",
    )
    assert f.seen_at == {"pen 1": "sidetable 1"}  # the keychain has moved
    closed_then = read_facts("The fridge 1 is closed.", "You open the fridge 1.", "You close the fridge 1.")
    assert closed_then.closed == {"fridge 1"} and closed_then.opened == set()


def test_commands_in_histories_and_view_rows() -> None:
    f = read_facts("go to shelf 4\nYou arrive at shelf 4. On the shelf 4, you see nothing.")
    assert f.location == "shelf 4" and f.visited == ["shelf 4"]
    ok = read_facts("step 7 | clean cloth 2 with sinkbasin 1 | state_update | cloth 2.clean -> true")
    assert ok.states == {"cloth 2": {"clean"}}
    failed = read_facts("step 7 | clean cloth 2 with sinkbasin 1 | exception")
    assert failed.states == {}
    nothing = read_facts("clean cloth 2 with bathtubbasin 1 | Nothing happens.")
    assert nothing.states == {}
    lamp = read_facts("You turn on the desklamp 1.")
    assert lamp.lamp_on


@pytest.mark.parametrize(
    ("text", "check"),
    [
        ("egg 1 | egg 1.location: countertop 2 -> agent | egg 1.hot: true [goal]",
         lambda f: f.states == {"egg 1": {"hot"}}),
        ("pot 1.cool -> true [goal]", lambda f: f.states == {"pot 1": {"cool"}}),
        ("agent | agent.location: sidetable 1 -> drawer 5 | agent.holding: egg 1",
         lambda f: f.location == "drawer 5" and f.holding == "egg 1"),
        ("agent.holding -> nothing", lambda f: f.holding is None),
        ("fridge 1 | fridge 1.open: closed -> open [goal]", lambda f: "fridge 1" in f.opened),
        ("fridge 1.open = closed", lambda f: f.closed == {"fridge 1"}),
        ("cabinet 2 | cabinet 2.contents: peppershaker 2, mug 1 [goal]",
         lambda f: f.seen_at == {"peppershaker 2": "cabinet 2", "mug 1": "cabinet 2"}),
        ("mug 1.location -> agent", lambda f: "mug 1" not in f.seen_at),
        ("desklamp 1.on -> true", lambda f: f.lamp_on),
    ],
)  # fmt: skip
def test_state_keys_as_rendered(text: str, check) -> None:
    assert check(read_facts(text)), read_facts(text)


def _play(commands_feedback: list[tuple[str, str]], goal: str) -> EventStream:
    phi, stream, obs = AlfworldPhi(), EventStream({"goal": goal}), "You are in the middle of a room."
    for cmd, feedback in commands_feedback:
        raw = RawEvent(obs, cmd, feedback, 0.0)
        ex = phi.extract(raw, stream.state)
        stream.record(raw, entity=ex.entity, act=ex.act, delta=ex.delta, failed=ex.failed, outcome=ex.outcome,
                      evidence=ex.evidence)  # fmt: skip
        obs = feedback
    return stream


TRANSCRIPT = [
    ("go to countertop 2", "You arrive at countertop 2. On the countertop 2, you see a egg 1, and a spoon 2."),
    ("take egg 1 from countertop 2", "You pick up the egg 1 from the countertop 2."),
    ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed."),
    ("heat egg 1 with microwave 1", "You heat the egg 1 using the microwave 1."),
    ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
]


@pytest.mark.parametrize("tau", ["TemporalTrace", "ActionEffect", "EntityState"])
@pytest.mark.parametrize("gamma", ["coarse", "medium", "fine"])
def test_every_relation_view_of_a_real_transcript_is_read(tau: str, gamma: str) -> None:
    goal = "heat some egg and put it in fridge"
    stream = _play(TRANSCRIPT, goal)
    text = render_text(compose(stream, ViewAction(tau, "all", "all", gamma), goal))
    f = read_facts(text)
    assert f.states.get("egg 1") == {"hot"}, text
    assert f.location == "fridge 1", text
    if tau != "ActionEffect":  # grouped by action: the closing look is not a state row there
        assert "fridge 1" in f.closed, text


def test_facts_are_plain_data() -> None:
    f = EpisodeFacts()
    assert f.read("") is f and f.holding is None and f.visited == [] and not f.lamp_on
