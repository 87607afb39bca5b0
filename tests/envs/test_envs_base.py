"""The shared Env protocol types: validation and plain-data round trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from memprism_ray.envs.base import Env, GameRef, Observation, Transition


def test_observation_and_transition_normalise_and_freeze() -> None:
    obs = Observation("intro", "put a mug in desk", ["go to desk 1", "look"], {"step": 0})
    assert obs.admissible == ("go to desk 1", "look")
    tr = Transition("Nothing happens.", 0, 0, 0, ("look",), {"step": 1})
    assert (tr.reward, tr.done, tr.won) == (0.0, False, False)
    assert isinstance(tr.reward, float)
    with pytest.raises(AttributeError):
        obs.text = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"admissible": "look"}, "sequence of strings"),
        ({"admissible": ["look", 3]}, "non-string"),
        ({"meta": {"x": object()}}, "JSON-serialisable"),
        ({"meta": ["not", "a", "mapping"]}, "mapping"),
    ],
)
def test_observation_rejects_bad_fields(kwargs: dict, message: str) -> None:
    base = {"text": "t", "goal": "g", "admissible": ("look",), "meta": {}}
    with pytest.raises(ValueError, match=message):
        Observation(**{**base, **kwargs})


def test_transition_rejects_non_numeric_reward() -> None:
    with pytest.raises(ValueError, match="reward must be a number"):
        Transition("ok", True, False, False, ())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="feedback must be str"):
        Transition(None, 0.0, False, False, ())  # type: ignore[arg-type]


def test_game_ref_round_trip_and_errors(tmp_path: Path) -> None:
    ref = GameRef("task-Mug-None-Desk-301/trial_1", str(tmp_path / "game.tw-pddl"), "pick_and_place_simple", "train")
    assert isinstance(ref.path, Path)
    assert GameRef.from_dict(ref.to_dict()) == ref
    with pytest.raises(ValueError, match="missing field"):
        GameRef.from_dict({"game_id": "x"})
    with pytest.raises(ValueError, match="non-empty"):
        GameRef("", tmp_path, "t", "train")


def test_alfworld_env_satisfies_the_protocol() -> None:
    from memprism_ray.benchmark.alfworld.env import AlfworldEnv

    env = AlfworldEnv(num_slots=3, fast=False)
    try:
        assert isinstance(env, Env)
        assert env.num_slots == 3
    finally:
        env.close()
