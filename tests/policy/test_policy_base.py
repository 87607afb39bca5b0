"""PolicyInput / PolicyOutput contracts of the TaskPolicy protocol."""

from __future__ import annotations

import pytest
from PIL import Image

from memprism_ray.policy.base import HistoryRecord, PolicyInput, PolicyOutput, TaskPolicy

IMG = Image.new("RGB", (28, 28))


def test_view_modes_and_image_order() -> None:
    assert PolicyInput("alfworld", "g", "o").view_mode == "none"
    assert PolicyInput("alfworld", "g", "o", view_text="").view_mode == "text"
    cam = Image.new("RGB", (56, 28))
    inp = PolicyInput("ebalfred", "g", "o", admissible=["a"], view_image=IMG, camera_image=cam)
    assert inp.view_mode == "image"
    assert inp.images() == [cam, IMG]
    assert inp.admissible == ("a",)  # lists are frozen into tuples


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"benchmark": ""}, "must name a benchmark"),
        ({"view_image": IMG, "view_text": "x"}, "not both"),
        ({"admissible": "go to desk 1"}, "tuple of strings"),
        ({"admissible": ("a", 3)}, "strings only"),
        ({"step": -1}, "non-negative"),
        ({"history": ("step 1",)}, "HistoryRecord"),
        ({"view_image": b"png bytes"}, "PIL.Image"),
        ({"goal": None}, "goal must be a str"),
    ],
)
def test_bad_inputs_name_the_problem(kwargs: dict, message: str) -> None:
    base = {"benchmark": "alfworld", "goal": "g", "observation": "o"}
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        PolicyInput(**base)


def test_history_record_validation() -> None:
    with pytest.raises(ValueError, match="step"):
        HistoryRecord(-2, "o", "a", "f")
    with pytest.raises(ValueError, match="feedback"):
        HistoryRecord(0, "o", "a", None)  # type: ignore[arg-type]


def test_output_invariants_and_dict() -> None:
    with pytest.raises(ValueError, match="needs an action"):
        PolicyOutput(text="x", action=None, valid=True)
    with pytest.raises(ValueError, match="needs an error"):
        PolicyOutput(text="x", action=None, valid=False)
    out = PolicyOutput(text="<action>look</action>", action="look", valid=True, prompt_tokens=10, latency_s=0.5)
    assert out.to_dict()["action"] == "look" and out.to_dict()["prompt_tokens"] == 10


def test_protocol_is_structural() -> None:
    class Echo:
        name = "echo"

        def act(self, inputs):
            return [PolicyOutput(text="", action=i.admissible[0], valid=True) for i in inputs]

    class NoAct:
        name = "x"

    assert isinstance(Echo(), TaskPolicy)
    assert not isinstance(NoAct(), TaskPolicy)
