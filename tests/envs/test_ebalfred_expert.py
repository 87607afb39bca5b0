"""Expert plans of EB-ALFRED episodes as D1's expert-trajectory table."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memprism_ray.envs.ebalfred.data import list_games
from memprism_ray.envs.ebalfred.env import EbAlfredConfig, EbAlfredEnv
from memprism_ray.envs.ebalfred.expert import annotation_plans, fixture_plans, play_expert, write_expert_table
from memprism_ray.envs.ebalfred.fixture import build_fixture


def test_fixture_plans_become_a_d1_table(tmp_path: Path) -> None:
    from memprism_ray.adapter.d1_labels import expert_states

    root = build_fixture(tmp_path / "fx", episodes_per_subset=2)
    games = list_games(["base", "long_horizon"], root / "splits.json")
    env = EbAlfredEnv(1, EbAlfredConfig(controller="fake", fixture=str(root)))
    plans = fixture_plans(root)
    episodes = play_expert(env, games, plans)
    assert all(ep.won for ep in episodes) and len(episodes) == 4
    path = write_expert_table(episodes, tmp_path / "expert.parquet")
    table = pq.read_table(path)
    assert table.num_rows == sum(len(plans[g.game_id]) for g in games)
    assert table.column("reference_action").to_pylist()[: len(plans["base/0"])] == plans["base/0"]
    states = expert_states(table)
    assert len(states) == table.num_rows
    assert states[1].state.reference_action == plans["base/0"][1]
    assert states[0].admissible == tuple(
        json.loads((root / "transcripts.json").read_text())["episodes"]["base/0"]["admissible"]
    )


def test_annotation_plans_need_every_annotation(tmp_path: Path) -> None:
    root = build_fixture(tmp_path / "fx", episodes_per_subset=1)
    games = list_games(["base"], root / "splits.json")
    alfred = tmp_path / "json_2.1.0"
    task = json.loads((root / "splits.json").read_text())["base"][0]["task"]
    with pytest.raises(FileNotFoundError, match="no ALFRED annotation"):
        annotation_plans(root / "splits.json", games, alfred)
    (alfred / "train" / task).mkdir(parents=True)
    plan = [{"discrete_action": {"action": "GotoLocation", "args": ["desk"]}}]
    (alfred / "train" / task / "traj_data.json").write_text(json.dumps({"plan": {"high_pddl": plan}}))
    assert annotation_plans(root / "splits.json", games, alfred) == {"base/0": ["find a Desk"]}
    # The training list (ALFRED train trajectories, subset alfred_train) has its own file.
    train = list_games(["alfred_train"], root / "alfred_train.json")
    task = json.loads((root / "alfred_train.json").read_text())["alfred_train"][0]["task"]
    (alfred / "train" / task).mkdir(parents=True)
    (alfred / "train" / task / "traj_data.json").write_text(json.dumps({"plan": {"high_pddl": plan}}))
    assert annotation_plans(root / "alfred_train.json", train[:1], alfred) == {"alfred_train/0": ["find a Desk"]}


def test_plans_from_alfred_s_lower_case_names_play_without_an_invalid_action(tmp_path: Path) -> None:
    """Issue 35 item 1: the fixture's ALFRED annotations name objects as ALFRED does
    (``diningtable``, ``sinkbasin``, ``desklamp``, ``garbagecan``). Their translation is the
    recorded plan of every episode (evaluation and training, with or without ALFRED's low
    actions), and played through the env no action is invalid and every episode is won.
    Before, ``find a Diningtable`` was no skill: an invalid output, and the episode lost."""
    from memprism_ray.envs.ebalfred.data import skills_from_high_pddl
    from memprism_ray.envs.ebalfred.fixture import ALFRED_DIR, TRAIN_FILE

    root = build_fixture(tmp_path / "fx", episodes_per_subset=2)
    games = list_games(path=root / "splits.json") + list_games(["alfred_train"], root / TRAIN_FILE)
    recorded = fixture_plans(root)
    plans = annotation_plans(root / "splits.json", games[:-4], root / ALFRED_DIR)
    plans.update(annotation_plans(root / TRAIN_FILE, games[-4:], root / ALFRED_DIR))
    assert plans == {g.game_id: recorded[g.game_id] for g in games}
    assert any("find a DiningTable" in p for p in plans.values())
    for traj in (root / ALFRED_DIR).glob("*/*/*/traj_data.json"):
        data = json.loads(traj.read_text())
        assert skills_from_high_pddl(data["plan"]["high_pddl"]) in recorded.values()  # high-level plan alone
    env = EbAlfredEnv(1, EbAlfredConfig(controller="fake", fixture=str(root)))
    steps = []
    real_step = env.step

    def step(action: str, slot: int = 0):  # type: ignore[no-untyped-def]
        steps.append(real_step(action, slot))
        return steps[-1]

    env.step = step  # type: ignore[method-assign]
    episodes = play_expert(env, games, plans)
    assert len(episodes) == len(games) and all(ep.won for ep in episodes)
    assert steps and not [t for t in steps if t.meta.get("invalid_output") or not t.meta["last_action_success"]]


def test_d1_alfred_path_labels_fixture_decisions(tmp_path: Path) -> None:
    """Expert table -> LLM view-teacher labels (a scripted teacher reply per decision) -> SFT rows."""
    import numpy as np

    from memprism_ray.adapter.d1_labels import expert_states, llm_labels
    from memprism_ray.router.encoder import HashingEncoder
    from memprism_ray.router.features import FeatureExtractor
    from memprism_ray.router.teacher import LLMTeacherConfig, LLMViewTeacher
    from memprism_ray.view_space import ViewAction

    root = build_fixture(tmp_path / "fx", episodes_per_subset=1)
    games = list_games(["base"], root / "splits.json")
    env = EbAlfredEnv(1, EbAlfredConfig(controller="fake", fixture=str(root)))
    table = pq.read_table(write_expert_table(play_expert(env, games, fixture_plans(root)), tmp_path / "e.parquet"))
    states = expert_states(table)
    view = {"tau": "EntityState", "window": "all", "filter": "all", "gamma": "medium"}
    reply = json.dumps({"teacher_distribution": [{"a_view": view, "score": 1.0}]})
    prompts: list[str] = []

    def complete_many(batch: list[str], **decoding: object) -> list[str]:
        prompts.extend(batch)
        return [reply] * len(batch)

    with LLMViewTeacher(LLMTeacherConfig(base_url="http://127.0.0.1:9/v1", model="stub")) as teacher:
        data, counts = llm_labels(states, FeatureExtractor(HashingEncoder()), teacher, complete_many=complete_many)
    assert len(prompts) == len(states) == len(data) and counts["labelled"] == len(states)
    assert "find a Mug" in prompts[0]  # the EB-ALFRED reference action reaches the teacher
    want = ViewAction("EntityState", "all", "all", "medium").index
    assert all(int(np.argmax(q)) == want for q in data.q)
