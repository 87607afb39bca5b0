"""Expert plans of EB-ALFRED episodes as D1's expert-trajectory table."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memprism_ray.benchmark.ebalfred.data import PlanStep, SceneInstances, list_games, resolve_plan
from memprism_ray.benchmark.ebalfred.env import EbAlfredConfig, EbAlfredEnv
from memprism_ray.benchmark.ebalfred.expert import annotation_plans, play_expert, write_expert_table
from memprism_ray.benchmark.ebalfred.fixture import build_fixture
from memprism_ray.benchmark.ebalfred.fixture_format import load_transcripts


def fixture_plans(fixture: Path) -> dict[str, list[str]]:
    """``game_id -> recorded expert skills`` of a fixture."""
    return {k: [s["action"] for s in ep["steps"]] for k, ep in load_transcripts(fixture)["episodes"].items()}


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
    assert annotation_plans(root / "splits.json", games, alfred) == {"base/0": [PlanStep("find a Desk")]}
    # The training list (ALFRED train trajectories, subset alfred_train) has its own file.
    train = list_games(["alfred_train"], root / "alfred_train.json")
    task = json.loads((root / "alfred_train.json").read_text())["alfred_train"][0]["task"]
    (alfred / "train" / task).mkdir(parents=True)
    (alfred / "train" / task / "traj_data.json").write_text(json.dumps({"plan": {"high_pddl": plan}}))
    assert annotation_plans(root / "alfred_train.json", train[:1], alfred) == {
        "alfred_train/0": [PlanStep("find a Desk")]
    }


def _scenes(root: Path) -> tuple[dict[str, SceneInstances], dict[str, SceneInstances]]:
    """Each fixture episode's scene at reset, by game id and by ALFRED task."""
    from memprism_ray.benchmark.ebalfred.fixture import TRAIN_FILE
    from memprism_ray.benchmark.ebalfred.skills import instance_names

    episodes = load_transcripts(root)["episodes"]
    by_game, by_task = {}, {}
    for name in ("splits.json", TRAIN_FILE):
        for subset, entries in json.loads((root / name).read_text()).items():
            for i, entry in enumerate(entries):
                ep = episodes[f"{subset}/{i}"]
                objects = tuple(ep["scene_objects"])
                scene = SceneInstances(objects, instance_names(objects), tuple(ep["skills"]))
                by_game[f"{subset}/{i}"] = by_task[entry["task"]] = scene
    return by_game, by_task


def test_plans_from_alfred_s_lower_case_names_play_without_an_invalid_action(tmp_path: Path) -> None:
    """Issue 35 item 1: the fixture's ALFRED annotations name objects as ALFRED does
    (``diningtable``, ``sinkbasin``, ``desklamp``, ``garbagecan``). Their translation, its
    instances named in the scene at reset (issue 41 item 1), is the recorded plan of every
    episode (evaluation and training, with or without ALFRED's low actions), and played through
    the env no action is invalid and every episode is won. Before, ``find a Diningtable`` was no
    skill: an invalid output, and the episode lost."""
    from memprism_ray.benchmark.ebalfred.data import plan_from_high_pddl
    from memprism_ray.benchmark.ebalfred.fixture import ALFRED_DIR, TRAIN_FILE

    root = build_fixture(tmp_path / "fx", episodes_per_subset=2)
    evaluation, train = list_games(path=root / "splits.json"), list_games(["alfred_train"], root / TRAIN_FILE)
    games = evaluation + train
    recorded = fixture_plans(root)
    plans = annotation_plans(root / "splits.json", evaluation, root / ALFRED_DIR)
    plans.update(annotation_plans(root / TRAIN_FILE, train, root / ALFRED_DIR))
    scenes, by_task = _scenes(root)
    assert {g.game_id: resolve_plan(plans[g.game_id], scenes[g.game_id]) for g in games} == {
        g.game_id: (recorded[g.game_id], []) for g in games
    }
    assert any("find a DiningTable" in p for p in recorded.values())
    for traj in (root / ALFRED_DIR).glob("*/*/*/traj_data.json"):
        data = json.loads(traj.read_text())
        task = f"{traj.parent.parent.name}/{traj.parent.name}"
        if any(
            la["api_action"]["action"] == "OpenObject" and la["high_idx"] == 1 for la in data["plan"]["low_actions"]
        ):
            continue  # a pickup from inside a drawer: only the low actions show the drawer opened
        alone = plan_from_high_pddl(data["plan"]["high_pddl"])  # high-level plan (and its planner ids) alone
        assert resolve_plan(alone, by_task[task]) in [(p, []) for p in recorded.values()]
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


def test_two_instances_of_a_type_old_plans_lose_new_plans_win(tmp_path: Path) -> None:
    """Issue 41 item 1: EmbodiedBench names the second book ``Book_2`` and maps ``Book`` to the
    first. A pick_two_obj_and_place plan that finds "a Book" twice goes back to the book already
    on the desk; a plan that opens "the Drawer" opens the first drawer, not the one holding the
    CD. The plans from the annotations' objectIds name the instances and win, through the env
    and the fake controller's instance table; the bare names (the translation before) lose."""
    from memprism_ray.benchmark.ebalfred.fixture import ALFRED_DIR, TRAIN_FILE

    root = build_fixture(tmp_path / "fx", episodes_per_subset=1)
    train = list_games(["alfred_train"], root / TRAIN_FILE)
    plans = annotation_plans(root / TRAIN_FILE, train, root / ALFRED_DIR)
    goals = {g.game_id: json.loads((root / TRAIN_FILE).read_text())["alfred_train"][i]["instruction"]
             for i, g in enumerate(train)}  # fmt: skip
    two = [g for g in train if "two books" in goals[g.game_id] or "second drawer" in goals[g.game_id]]
    assert len(two) == 2
    env = EbAlfredEnv(1, EbAlfredConfig(controller="fake", fixture=str(root)))
    new = play_expert(env, two, plans)
    assert [ep.won for ep in new] == [True, True]
    played = [list(ep.reference) for ep in new]
    assert "find a Book_2" in played[0] and played[0].count("find a Book") == 1
    assert played[1][:2] == ["find a Drawer_2", "open the Drawer_2"]
    old = play_expert(env, two, {g.game_id: [s.skill for s in plans[g.game_id]] for g in two})
    assert [ep.won for ep in old] == [False, False]
    assert [s.skill for s in plans[two[0].game_id]].count("find a Book") == 2  # the bare names: one book twice


def test_an_instance_that_cannot_be_named_leaves_the_plan_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Never a guess: a find of a type with two instances in the scene whose annotation names
    no objectId is not played; the game is counted with its reason and one warning says so."""
    from memprism_ray.benchmark.ebalfred.fixture import ALFRED_DIR, TRAIN_FILE

    root = build_fixture(tmp_path / "fx", episodes_per_subset=1)
    train = list_games(["alfred_train"], root / TRAIN_FILE)
    plans = annotation_plans(root / TRAIN_FILE, train, root / ALFRED_DIR)
    books = next(g for g in train if any(s.skill == "find a Book" for s in plans[g.game_id]))
    plans[books.game_id] = [PlanStep("find a Book"), *plans[books.game_id][1:]]  # no objectId
    env = EbAlfredEnv(1, EbAlfredConfig(controller="fake", fixture=str(root)))
    unresolved: dict[str, list[str]] = {}
    with caplog.at_level("WARNING", logger="memprism_ray.benchmark.ebalfred.expert"):
        episodes = play_expert(env, train, plans, unresolved=unresolved)
    assert list(unresolved) == [books.game_id] and "2 Books in the scene" in unresolved[books.game_id][0]
    assert len(episodes) == len(train) - 1 and books.game_id not in {ep.game.game_id for ep in episodes}
    assert f"1 of {len(train)} games left out" in caplog.text


def _traj(task_type: str, high: list, low: list, poses: tuple[str, ...] = ()) -> dict:
    return {
        "task_type": task_type,
        "scene": {"scene_num": 7, "object_poses": [{"objectName": p} for p in poses]},
        "plan": {
            "high_pddl": [
                {"high_idx": k, "discrete_action": {"action": v, "args": a}} for k, (v, a) in enumerate(high)
            ],
            "low_actions": [{"high_idx": k, "api_action": api} for k, api in low],
        },
    }


def test_the_audit_counts_plans_without_the_simulator(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``python -m memprism_ray.benchmark.ebalfred.expert``: each file resolved in the scene ALFRED's
    layout and the annotation show, in both orders; a basin named only when it is not the first
    (``SinkBasin`` is no skill) depends on the simulator's order; a find of a two-drawer type
    with no objectId cannot be named; a pick_two plan picks at two finds (before: one)."""
    from memprism_ray.benchmark.ebalfred.expert import audit_annotations, main

    layouts = tmp_path / "layouts"
    layouts.mkdir()
    static = ["Desk|1|0|0", "Drawer|1|0|0", "Drawer|2|0|0", "Sink|1|0|0|SinkBasin", "Sink|2|0|0|SinkBasin"]
    (layouts / "FloorPlan7-openable.json").write_text(json.dumps({k: [0, 0, 0, 0] for k in static}))
    put = lambda obj, where: {"action": "PutObject", "objectId": obj, "receptacleObjectId": where}  # noqa: E731
    pick = lambda obj: {"action": "PickupObject", "objectId": obj}  # noqa: E731
    two = _traj(
        "pick_two_obj_and_place",
        [("GotoLocation", ["desk"]), ("PickupObject", ["book"]), ("GotoLocation", ["desk"]),
         ("PutObject", ["book", "desk"]), ("GotoLocation", ["desk"]), ("PickupObject", ["book"]),
         ("GotoLocation", ["desk"]), ("PutObject", ["book", "desk"])],
        [(1, pick("Book|1|0|0")), (3, put("Book|1|0|0", "Desk|1|0|0")), (5, pick("Book|2|0|0")),
         (7, put("Book|2|0|0", "Desk|1|0|0"))],
        ("Book_a", "Book_b"),
    )  # fmt: skip
    drawer = _traj(
        "pick_and_place_simple",
        [("GotoLocation", ["drawer"]), ("PickupObject", ["cd"]), ("GotoLocation", ["desk"]),
         ("PutObject", ["cd", "desk"])],
        [(1, {"action": "OpenObject", "objectId": "Drawer|2|0|0"}), (1, pick("CD|1|0|0")),
         (1, {"action": "CloseObject", "objectId": "Drawer|2|0|0"}), (3, put("CD|1|0|0", "Desk|1|0|0"))],
        ("CD_a",),
    )  # fmt: skip
    sink = _traj(
        "pick_and_place_simple",
        [("GotoLocation", ["desk"]), ("PickupObject", ["cd"]), ("GotoLocation", ["sinkbasin"]),
         ("PutObject", ["cd", "sinkbasin"])],
        [(1, pick("CD|1|0|0")), (3, put("CD|1|0|0", "Sink|1|0|0|SinkBasin"))],
        ("CD_a",),
    )  # fmt: skip
    no_id = _traj("pick_and_place_simple", [("GotoLocation", ["drawer"]), ("PutObject", ["cd", "drawer"])], [])
    files = []
    for name, traj in (("two", two), ("drawer", drawer), ("sink", sink), ("no_id", no_id)):
        path = tmp_path / "json_2.1.0" / name / "trial" / "pp" / "ann_0.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(traj))
        files.append(path)
    report = audit_annotations(files, layouts)
    assert report["counts"] == {
        "files": 4, "resolved": 2, "order_dependent": 1, "unresolvable": 1,
        "pick_two": 1, "pick_two_distinct": 1, "pick_two_old_same_find": 1,
    }  # fmt: skip
    assert report["reasons"] == {"'find a Sink'": 1, "'find a Drawer'": 1}
    assert "json_2.1.0/sink/" in report["examples"]["order_dependent"]
    assert main([str(tmp_path / "json_2.1.0"), "--layouts", str(layouts)]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == report["counts"]
    assert main([str(tmp_path / "json_2.1.0"), "--layouts", str(tmp_path / "nowhere")]) == 2


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
