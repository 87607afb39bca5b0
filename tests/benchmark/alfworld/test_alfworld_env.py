"""AlfworldEnv on the real engine: protocol behaviour, slots, expert, stock-identical text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from memprism_ray.benchmark.alfworld.env import AlfworldEnv, goal_from_intro
from memprism_ray.envs.base import Observation, Transition

TRANSCRIPT = Path(__file__).parents[2] / "recorder" / "phi" / "data" / "alfworld_transcript.json"


def test_reset_observation(alfworld_env: AlfworldEnv, alfworld_games: dict) -> None:
    game = alfworld_games["train"][0]
    obs = alfworld_env.reset(game)
    assert isinstance(obs, Observation)
    assert obs.text.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert obs.text.rstrip().endswith(f"Your task is to: {obs.goal}.")
    traj = json.loads((game.path.parent / "traj_data.json").read_text())
    assert obs.goal == traj["template"]["task_desc"]
    assert "help" not in obs.admissible and obs.admissible == tuple(sorted(obs.admissible))
    assert any(a.startswith("go to ") for a in obs.admissible)
    assert obs.meta["game_id"] == game.game_id and obs.meta["task_type"] == game.task_type
    assert obs.meta["step"] == 0 and obs.meta["expert_action"] in obs.admissible


def test_non_admissible_and_help_go_to_the_engine(alfworld_env: AlfworldEnv, alfworld_games: dict) -> None:
    alfworld_env.reset(alfworld_games["train"][1])
    tr = alfworld_env.step("fly to the moon")
    assert isinstance(tr, Transition)
    assert tr.feedback == "Nothing happens." and not tr.done and tr.reward == 0.0
    assert tr.meta["step"] == 1
    tr = alfworld_env.step("help")
    assert "Available commands" in tr.feedback and "help" not in tr.admissible
    assert tr.meta["step"] == 2


def test_expert_wins_every_task_type(alfworld_env: AlfworldEnv, alfworld_games: dict) -> None:
    for game in alfworld_games["train"]:
        obs = alfworld_env.reset(game)
        action, tr = obs.meta["expert_action"], None
        for _ in range(120):
            assert action in (tr.admissible if tr else obs.admissible)
            tr = alfworld_env.step(action)
            if tr.done:
                break
            action = tr.meta["expert_action"]
        assert tr is not None and tr.won and tr.done and tr.reward == 1.0, game.game_id
        with pytest.raises(ValueError, match="is over"):
            alfworld_env.step("look")


def _play(env: AlfworldEnv, game, actions: list[str], slot: int = 0) -> list[tuple]:
    obs = env.reset(game, slot=slot)
    out = [(obs.text, obs.admissible)]
    for a in actions:
        tr = env.step(a, slot=slot)
        out.append((tr.feedback, tr.admissible, tr.won))
        if tr.done:
            break
    return out


def _random_actions(env: AlfworldEnv, game, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    obs = env.reset(game)
    adm, actions = obs.admissible, []
    for _ in range(n):
        a = rng.choice(adm) if rng.random() > 0.1 else "jump"
        actions.append(a)
        tr = env.step(a)
        adm = tr.admissible
        if tr.done:
            break
    return actions


def test_slots_are_independent(alfworld_games: dict) -> None:
    g0, g1 = alfworld_games["eval_in_distribution"][:2]
    with AlfworldEnv(2) as env:
        a0, a1 = _random_actions(env, g0, 8, 1), _random_actions(env, g1, 8, 2)
        solo0, solo1 = _play(env, g0, a0), _play(env, g1, a1)
        # interleaved in two slots
        o0, o1 = env.reset(g0, slot=0), env.reset(g1, slot=1)
        assert (o0.text, o0.admissible) == solo0[0] and (o1.text, o1.admissible) == solo1[0]
        for i in range(max(len(a0), len(a1))):
            if i < len(a0) and i + 1 < len(solo0):
                tr = env.step(a0[i], slot=0)
                assert (tr.feedback, tr.admissible, tr.won) == solo0[i + 1]
            if i < len(a1) and i + 1 < len(solo1):
                tr = env.step(a1[i], slot=1)
                assert (tr.feedback, tr.admissible, tr.won) == solo1[i + 1]
        assert env._slots[1].game == g1


def test_engine_caches_keep_transcripts_identical_to_stock(alfworld_games: dict) -> None:
    from memprism_ray.benchmark.alfworld import engine

    games = alfworld_games["eval_out_of_distribution"][:3]
    with AlfworldEnv(1) as fast:
        scripts = [_random_actions(fast, g, 12, 7 + i) for i, g in enumerate(games)]
        fast_runs = [_play(fast, g, s) for g, s in zip(games, scripts, strict=False)]
    engine.uninstall_engine_caches()
    try:
        assert not engine._ORIGINALS
        with AlfworldEnv(1, fast=False) as stock:
            stock_runs = [_play(stock, g, s) for g, s in zip(games, scripts, strict=False)]
    finally:
        engine.install_engine_caches()
    assert fast_runs == stock_runs
    stats = dict(engine._STATS)
    assert stats["parse_hits"] > stats["parse_misses"] and stats["translate_hits"] > 0
    assert stats["command_hits"] > 0  # the command memo answered some of these steps


def test_live_feedback_is_parsed_and_known_to_the_phi_fixture(alfworld_env: AlfworldEnv, alfworld_games: dict) -> None:
    from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
    from memprism_ray.recorder import EventStream, RawEvent
    from memprism_ray.recorder.phi import record_event
    from tests.recorder.phi.make_alfworld_transcript import feedback_template

    known = set(json.loads(TRANSCRIPT.read_text())["templates"])
    phi, rng = AlfworldPhi(), random.Random(3)
    seen = set()
    for game in alfworld_games["eval_in_distribution"][:3]:
        obs = alfworld_env.reset(game)
        stream, o_pre, adm, meta = EventStream(), obs.text, obs.admissible, obs.meta
        for _ in range(25):
            a = meta["expert_action"] if rng.random() < 0.5 else rng.choice(adm)
            tr = alfworld_env.step(a)
            ev = record_event(stream, RawEvent(o_pre, a, tr.feedback, tr.reward), phi)
            assert ev.evidence["feedback_kind"] != "unknown", tr.feedback
            seen.add(feedback_template(tr.feedback))
            o_pre, adm, meta = tr.feedback, tr.admissible, tr.meta
            if tr.done:
                break
    assert seen <= known, seen - known


def test_errors_are_clear(alfworld_games: dict) -> None:
    with AlfworldEnv(1, max_steps=2) as env:
        with pytest.raises(ValueError, match="has no game"):
            env.step("look")
        with pytest.raises(ValueError, match=r"slot must be an int in \[0, 0\]"):
            env.reset(alfworld_games["train"][0], slot=1)
        env.reset(alfworld_games["train"][0])
        with pytest.raises(ValueError, match="action must be a str"):
            env.step(3)  # type: ignore[arg-type]
        assert not env.step("look").done
        last = env.step("look")
        assert last.done and not last.won and last.meta["truncated"]
    with pytest.raises(ValueError, match="num_slots"):
        AlfworldEnv(0)
    with pytest.raises(ValueError, match="Your task is to"):
        goal_from_intro("no task here")
