"""The ALFWorld rule Phi on real engine text (appendix D.2, prompt E.1 key conventions).

``data/alfworld_transcript.json`` holds every distinct feedback template the real engine
emitted over 216 generated episodes (expert, partly random and random commands; see
``make_alfworld_transcript.py``, which regenerates it in ~2 minutes). A live cross-check on
freshly played games is in ``tests/benchmark/alfworld/test_alfworld_env.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from make_alfworld_transcript import feedback_template

from memprism_ray.benchmark.alfworld.phi import (
    AlfworldPhi,
    classify_feedback,
    list_items,
    parse_command,
)
from memprism_ray.recorder import EventStream, Outcome, RawEvent, StateDelta
from memprism_ray.recorder.phi import Phi, record_event

TRANSCRIPT = Path(__file__).with_name("data") / "alfworld_transcript.json"


@pytest.fixture(scope="module")
def transcript() -> dict:
    return json.loads(TRANSCRIPT.read_text())


def _extract(action: str, feedback: str, known: dict[str, str] | None = None):
    return AlfworldPhi().extract(RawEvent("obs", action, feedback), known or {})


def _deltas(ex) -> dict[str, str]:
    return {d.key: d.new_value for d in ex.delta}


def test_is_a_phi() -> None:
    assert isinstance(AlfworldPhi(), Phi)


def test_transcript_covers_at_least_200_real_episodes_and_no_template_is_unknown(transcript: dict) -> None:
    assert transcript["episodes"] >= 200
    templates = transcript["templates"]
    assert len(templates) >= 25
    unknown = []
    for template, entry in templates.items():
        for ex in entry["examples"]:
            assert feedback_template(ex["feedback"]) == template
            kind, _ = classify_feedback(ex["feedback"])
            result = _extract(ex["action"], ex["feedback"])
            if kind == "unknown" or result.evidence["feedback_kind"] == "unknown":
                unknown.append(ex["feedback"])
    assert unknown == []


def test_every_transcript_example_yields_the_deltas_its_feedback_states(transcript: dict) -> None:
    # A structural check over all real examples: success feedback naming a receptacle view
    # always records the view; failures never carry deltas.
    for entry in transcript["templates"].values():
        for ex in entry["examples"]:
            result = _extract(ex["action"], ex["feedback"])
            deltas = _deltas(result)
            fb = ex["feedback"]
            if fb == "Nothing happens.":
                assert result.failed and deltas == {}
                continue
            assert not result.failed
            if "you see" in fb and ("On the " in fb or "In it" in fb) and "normal" not in fb:
                assert any(k.endswith(".contents") for k in deltas), fb
            if fb.startswith("You arrive at "):
                assert deltas["agent.location"] == parse_command(ex["action"]).target
            if fb.startswith("You pick up"):
                assert deltas["agent.holding"] == parse_command(ex["action"]).target
            if fb.startswith("You move"):
                assert deltas["agent.holding"] == "nothing"


@pytest.mark.parametrize(
    ("action", "act", "target", "other"),
    [
        ("go to drawer 1", "go", "drawer 1", ""),
        ("take mug 1 from desk 2", "take", "mug 1", "desk 2"),
        ("move mug 1 to desk 2", "put", "mug 1", "desk 2"),
        ("put toiletpaper 3 in/on drawer 2", "put", "toiletpaper 3", "drawer 2"),
        ("heat egg 1 with microwave 1", "heat", "egg 1", "microwave 1"),
        ("slice apple 1 with knife 2", "slice", "apple 1", "knife 2"),
        ("use desklamp 1", "use", "desklamp 1", ""),
        ("examine mug 1", "examine", "mug 1", ""),
        ("  Inventory ", "inventory", "", ""),
        ("dance wildly", "other", "", ""),
    ],
)
def test_command_normalisation(action: str, act: str, target: str, other: str) -> None:
    cmd = parse_command(action)
    assert (cmd.act, cmd.target, cmd.other) == (act, target, other)


def test_go_to_a_closed_receptacle() -> None:
    ex = _extract("go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed.")
    assert (ex.entity, ex.act, ex.failed) == ("drawer 1", "go", False)
    assert _deltas(ex) == {"agent.location": "drawer 1", "drawer 1.open": "closed"}


def test_contents_seen_at_a_receptacle_give_per_object_locations() -> None:
    ex = _extract(
        "go to countertop 1",
        "You arrive at countertop 1. On the countertop 1, you see a apple 1, a mug 2, and a butterknife 3.",
    )
    d = _deltas(ex)
    assert d["countertop 1.contents"] == "apple 1, mug 2, butterknife 3"
    assert d["apple 1.location"] == d["mug 2.location"] == d["butterknife 3.location"] == "countertop 1"
    assert list_items("nothing") == []


def test_open_lists_contents_and_marks_open() -> None:
    ex = _extract("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see a egg 1.")
    assert _deltas(ex) == {"fridge 1.open": "open", "fridge 1.contents": "egg 1", "egg 1.location": "fridge 1"}
    assert _deltas(_extract("close fridge 1", "You close the fridge 1.")) == {"fridge 1.open": "closed"}


def test_take_and_put_update_hand_location_and_known_contents() -> None:
    known = {"desk 1.contents": "mug 1, pen 2", "shelf 1.contents": "nothing"}
    take = _extract("take mug 1 from desk 1", "You pick up the mug 1 from the desk 1.", known)
    assert (take.entity, take.act) == ("mug 1", "take")
    assert _deltas(take) == {"agent.holding": "mug 1", "mug 1.location": "agent", "desk 1.contents": "pen 2"}
    put = _extract("move mug 1 to shelf 1", "You move the mug 1 to the shelf 1.", known)
    assert (put.entity, put.act) == ("mug 1", "put")
    assert _deltas(put) == {"agent.holding": "nothing", "mug 1.location": "shelf 1", "shelf 1.contents": "mug 1"}
    # without a known contents value nothing is made up
    assert "desk 1.contents" not in _deltas(
        _extract("take mug 1 from desk 1", "You pick up the mug 1 from the desk 1.")
    )


def test_paper_prompt_wording_is_understood() -> None:
    take = _extract("take toiletpaper 1 from drawer 2", "You take the toiletpaper 1 from the drawer 2.")
    assert _deltas(take)["agent.holding"] == "toiletpaper 1"
    put = _extract("put mug 1 in/on cabinet 1", "You put the mug 1 in/on the cabinet 1.")
    assert _deltas(put)["mug 1.location"] == "cabinet 1"
    arrive = _extract("go to countertop 1", "You arrive at loc 5. On the countertop 1, you see nothing.")
    assert _deltas(arrive)["agent.location"] == "countertop 1"


def test_heat_cool_clean_slice_and_lamp_states() -> None:
    assert _deltas(_extract("clean mug 1 with sinkbasin 1", "You clean the mug 1 using the sinkbasin 1.")) == {
        "mug 1.clean": "true"
    }
    heat = _extract("heat mug 1 with microwave 1", "You heat the mug 1 using the microwave 1.", {"mug 1.cool": "true"})
    assert _deltas(heat) == {"mug 1.hot": "true", "mug 1.cool": "false"}
    assert _deltas(_extract("cool mug 1 with fridge 1", "You cool the mug 1 using the fridge 1.")) == {
        "mug 1.cool": "true"
    }
    assert _deltas(_extract("slice apple 1 with knife 1", "You sliced the apple 1 with the knife 1.")) == {
        "apple 1.sliced": "true"
    }
    assert _deltas(_extract("use desklamp 1", "You turn on the desklamp 1.")) == {"desklamp 1.on": "true"}
    assert _deltas(_extract("use desklamp 1", "You turn off the desklamp 1.")) == {"desklamp 1.on": "false"}


def test_examine_and_inventory() -> None:
    state = _extract("examine apple 1", "This is a hot and clean sliced apple 1.")
    assert _deltas(state) == {"apple 1.hot": "true", "apple 1.clean": "true", "apple 1.sliced": "true"}
    assert _deltas(_extract("examine tomato 1", "This is a cold tomato 1.")) == {"tomato 1.cool": "true"}
    assert _deltas(_extract("examine bowl 1", "This is a normal bowl 1. In it, you see nothing.")) == {
        "bowl 1.contents": "nothing"
    }
    assert _deltas(_extract("examine desklamp 1", "This desklamp 1 is off.")) == {"desklamp 1.on": "false"}
    plain = _extract("examine pen 1", "There's nothing special about pen 1.")
    assert plain.delta == () and plain.evidence["feedback_kind"] == "object_plain"
    assert _deltas(_extract("inventory", "You are carrying: a mug 1.")) == {"agent.holding": "mug 1"}
    assert _deltas(_extract("inventory", "You are not carrying anything.")) == {"agent.holding": "nothing"}
    facing = _extract("look", "You are facing the drawer 1, and drawer 2. Next to it, you see nothing.")
    assert _deltas(facing) == {"agent.location": "drawer 1"}


def test_unknown_feedback_is_flagged_not_invented() -> None:
    ex = _extract("go to drawer 1", "The drawer sings a song.")
    assert ex.evidence["feedback_kind"] == "unknown" and ex.delta == ()
    # a sentence with a valid start but a trailing unexplained part is not accepted either
    assert classify_feedback("You arrive at drawer 1. The drawer sings.")[0] == "unknown"


def test_outcomes_through_the_stream() -> None:
    stream = EventStream({"goal": "put a mug in desk"})
    phi = AlfworldPhi()
    e1 = record_event(
        stream, RawEvent("o", "go to desk 1", "You arrive at desk 1. On the desk 1, you see a mug 1."), phi
    )
    assert e1.outcome is Outcome.STATE_UPDATE
    e2 = record_event(stream, RawEvent("o", "examine desk 1", "On the desk 1, you see a mug 1."), phi)
    assert e2.outcome is Outcome.NO_OBSERVED_CHANGE  # same values as already known
    e3 = record_event(stream, RawEvent("o", "open desk 1", "Nothing happens."), phi)
    assert e3.outcome is Outcome.EXCEPTION and e3.delta == () and e3.act == "open"
    e4 = record_event(stream, RawEvent("o", "take mug 1 from desk 1", "You pick up the mug 1 from the desk 1."), phi)
    assert e4.outcome is Outcome.STATE_UPDATE
    assert StateDelta("desk 1.contents", "nothing") in e4.delta
    assert stream.state["agent.holding"] == "mug 1" and stream.state["mug 1.location"] == "agent"


def test_help_and_templates() -> None:
    ex = _extract("help", "\nAvailable commands:\n  look:   look around your current location\n")
    assert (ex.act, ex.evidence["feedback_kind"], ex.delta) == ("help", "help", ())
    assert feedback_template("You arrive at drawer 1. On the drawer 1, you see a pen 1, and a cd 2.") == (
        "You arrive at {x}. On the {x}, you see {items}."
    )
    assert feedback_template("You are facing the drawer 1, and drawer 2. Next to it, you see nothing.") == (
        "You are facing the {xs}. Next to it, you see nothing."
    )
