"""Expert trajectories as Parquet: one row per decision state, streams round-trip."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memprism_ray.adapter.reference_table import OUTPUT_NAME, load_expert_stream
from memprism_ray.benchmark.alfworld.expert_data import collect_expert_trajectories
from memprism_ray.benchmark.alfworld.phi import parse_command


def test_collect_writes_reference_actions_and_streams(alfworld_games: dict, tmp_path: Path) -> None:
    games = alfworld_games["train"][:3]
    path = collect_expert_trajectories(games, tmp_path, progress=False)
    assert path == tmp_path / OUTPUT_NAME
    table = pq.read_table(path)
    rows = table.to_pylist()
    assert {r["game_id"] for r in rows} == {g.game_id for g in games}
    for r in rows:
        assert r["reference_action"] in r["admissible"]
        assert r["won"] and r["reference_source"] == "handcoded_expert"
        assert r["act"] == parse_command(r["reference_action"]).act
        assert r["goal"] and r["o_pre"]
    for ep in range(3):
        ep_rows = [r for r in rows if r["episode"] == ep]
        assert [r["t"] for r in ep_rows] == list(range(1, len(ep_rows) + 1))
        assert [r["done"] for r in ep_rows] == [False] * (len(ep_rows) - 1) + [True]
        stream = load_expert_stream(table, ep)
        assert len(stream) == len(ep_rows)
        assert [e.act for e in stream.events] == [r["act"] for r in ep_rows]
        assert stream.raws[0].o_pre.startswith("-= Welcome to TextWorld")
        # each step's observation is the previous step's feedback
        assert all(stream.raws[i].o_pre == stream.raws[i - 1].feedback for i in range(1, len(stream)))
        # the last event is the winning put / use and the stream knows the hand is empty or the lamp on
        state = stream.state
        assert state.get("agent.holding") == "nothing" or any(k.endswith(".on") for k in state)


def test_walkthrough_fallback_and_empty_input(alfworld_games: dict, tmp_path: Path, monkeypatch) -> None:
    import memprism_ray.benchmark.alfworld.expert_data as ed

    def broken(*args, **kwargs):
        raise NameError("expert gave up")

    original = ed._play
    monkeypatch.setattr(
        ed, "_play", lambda env, game, commands, n: broken() if commands is None else original(env, game, commands, n)
    )
    path = collect_expert_trajectories(alfworld_games["train"][:1], tmp_path, progress=False)
    rows = pq.read_table(path).to_pylist()
    assert {r["reference_source"] for r in rows} == {"walkthrough"} and rows[-1]["won"]
    with pytest.raises(ValueError, match="no games"):
        collect_expert_trajectories([], tmp_path)


def test_an_llm_phi_re_extracts_the_expert_streams(alfworld_games: dict, tmp_path: Path) -> None:
    """phi.kind: llm in D1: the expert plays with the rules, every stream is then re-extracted
    by the LLM Phi from its raw events (one batch per step), so D1 and rollouts share one Phi."""
    from memprism_ray.benchmark.alfworld.phi import ALFWORLD_PHI, AlfworldPhi
    from memprism_ray.recorder.phi.llm import LLMPhi

    batches: list[int] = []

    def complete(batch):
        batches.append(len(batch))
        return ['{"entity": "llm entity", "act_type": "other", "delta_s": []}' for _ in batch]

    games = alfworld_games["train"][:2]
    phi = LLMPhi(ALFWORLD_PHI, complete, AlfworldPhi())
    path = collect_expert_trajectories(games, tmp_path, progress=False, phi=phi)
    table = pq.read_table(path)
    for ep in range(2):
        stream = load_expert_stream(table, ep)
        assert {e.entity for e in stream.events} == {"llm entity"}
        # the act stays the rules' hard evidence
        assert [e.act for e in stream.events] == [parse_command(r.action).act for r in stream.raws]
    assert batches[0] == 2 and sum(batches) == table.num_rows


def test_a_rollin_is_played_by_the_policy_and_labelled_by_the_expert(alfworld_games: dict, tmp_path: Path) -> None:
    """label.rollin_games: the task policy acts under a random view per step, the expert's
    next command is each state's reference, and the label states carry that reference."""
    from memprism_ray.adapter.d1_labels import expert_states, rollin_chooser
    from memprism_ray.benchmark.alfworld.scripted import ScriptedPolicy

    expert_game, *rollin = alfworld_games["train"][:3]
    choose = rollin_chooser(ScriptedPolicy(temperature=0.5, seed=0), seed=0, benchmark="alfworld")
    path = collect_expert_trajectories(
        [expert_game], tmp_path, progress=False, rollin_games=rollin, choose=choose, rollin_steps=12
    )
    table = pq.read_table(path)
    rows = table.to_pylist()
    rolled = [r for r in rows if r["reference_source"] == "rollin"]
    assert {r["game_id"] for r in rolled} == {g.game_id for g in rollin}
    assert all(len([r for r in rolled if r["game_id"] == g.game_id]) <= 12 for g in rollin)
    assert all(r["reference_action"] in r["admissible"] or r["reference_action"] == "look" for r in rolled)
    played, references = [], []
    for ep in sorted({r["episode"] for r in rolled}):
        stream = load_expert_stream(table, ep)
        played += [str(raw.action) for raw in stream.raws]
        references += [r["reference_action"] for r in rolled if r["episode"] == ep]
    assert len(played) == len(rolled)
    # The policy is not the expert: somewhere the command played differs from the reference.
    assert any(p != ref for p, ref in zip(played, references, strict=True))
    states = expert_states(table)
    refs = [s.state.reference_action for s in states]
    assert refs == [r["reference_action"] for r in rows]  # the table's reference, not the command played
    with pytest.raises(ValueError, match="chooser"):
        collect_expert_trajectories([expert_game], tmp_path / "x", progress=False, rollin_games=rollin)
