"""EB-ALFRED training episodes from ALFRED's training annotations (issue 30 item 2; paper
appendix "Training dataset setup"): the list EmbodiedBench's env plays, the trajectory files
it reads (``utils.load_task_json``: ``data/json_2.1.0/<task>/pp/ann_<repeat_idx>.json``,
b247936), evaluation trajectories left out, and presets that train on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprism_ray.benchmark.ebalfred.data import TRAIN_SUBSET, game_ref, list_games
from memprism_ray.benchmark.ebalfred.fixture import TRAIN_FILE, build_fixture
from memprism_ray.benchmark.ebalfred.training import (
    main,
    read_alfred_split,
    shared_trajectories,
    trajectories,
    write_training_list,
)


def _traj(root: Path, split: str, task: str, descs: list[str], plan: tuple[tuple[str, str], ...] = ()) -> None:
    folder = root / split / task
    folder.mkdir(parents=True)
    plan = plan or (("GotoLocation", "desk"),)
    data = {
        "task_type": task.split("-")[0],
        "scene": {"scene_num": 7},
        "plan": {"high_pddl": [{"discrete_action": {"action": a, "args": [x]}} for a, x in plan]},
        "turk_annotations": {"anns": [{"task_desc": d} for d in descs]},
    }
    (folder / "traj_data.json").write_text(json.dumps(data))


@pytest.fixture
def alfred(tmp_path: Path) -> Path:
    """A json_2.1.0 tree shaped as ALFRED's download: <split>/<task>/<trial>/traj_data.json."""
    root = tmp_path / "json_2.1.0"
    _traj(root, "train", "pick_and_place_simple-Mug-None-Desk-301/trial_T1", ["Put a mug on the desk.", "Mug to desk."])
    _traj(root, "train", "look_at_obj_in_light-CD-None-DeskLamp-303/trial_T2", ["Look at a CD under a lamp."])
    _traj(root, "train", "pick_clean_then_place_in_recep-Ladle-None-DiningTable-4/trial_T3", ["Rinse a ladle."])
    _traj(root, "valid_seen", "pick_heat_then_place_in_recep-Apple-None-GarbageCan-10/trial_T4", ["Heat an apple."])
    return root


def test_one_entry_per_annotation_of_every_training_trajectory(alfred: Path) -> None:
    entries, _ = read_alfred_split(alfred)
    assert [(e["task"].split("/")[1], e["repeat_idx"]) for e in entries] == [
        ("trial_T2", 0), ("trial_T1", 0), ("trial_T1", 1), ("trial_T3", 0),
    ]  # fmt: skip
    assert entries[2]["instruction"] == "Mug to desk."
    with pytest.raises(FileNotFoundError, match=r"json_2\.1\.0\.7z"):
        read_alfred_split(alfred.parent / "nothing")
    broken = alfred / "train" / "pick_and_place_simple-Mug-None-Desk-301" / "trial_T9"
    broken.mkdir()
    (broken / "traj_data.json").write_text("{}")
    with pytest.raises(ValueError, match=r"trial_T9/traj_data\.json: no turk_annotations"):
        read_alfred_split(alfred)


def test_the_list_and_the_files_embodiedbench_reads(alfred: Path, tmp_path: Path) -> None:
    """Trajectories an evaluation list names are left out (here a clean trajectory listed as
    an evaluation episode); every kept (task, annotation) gets its pp/ann_<r>.json."""
    evaluation = tmp_path / "splits.json"
    held = {"task": "pick_clean_then_place_in_recep-Ladle-None-DiningTable-4/trial_T3", "repeat_idx": 0}
    subsets = ["base", "common_sense", "complex_instruction", "visual_appearance", "spatial", "long_horizon"]
    evaluation.write_text(json.dumps({s: [dict(held, instruction="Rinse a ladle.")] for s in subsets}))
    eb_data = tmp_path / "eb_alfred" / "data"
    existing = eb_data / "json_2.1.0" / "look_at_obj_in_light-CD-None-DeskLamp-303/trial_T2" / "pp" / "ann_0.json"
    existing.parent.mkdir(parents=True)
    existing.write_text("{}")  # a file already there (an evaluation trajectory's) is never replaced
    out = tmp_path / "alfred_train.json"
    counts = write_training_list(alfred, out, eb_data=eb_data, exclude_splits=evaluation)
    assert counts == {
        "episodes": 3, "trajectories": 2, "excluded_episodes": 1, "files_placed": 2, "unplayable_trajectories": 0,
    }  # fmt: skip
    games = list_games([TRAIN_SUBSET], out)
    assert [g.game_id for g in games] == ["alfred_train/0", "alfred_train/1", "alfred_train/2"]
    mug = eb_data / "json_2.1.0" / "pick_and_place_simple-Mug-None-Desk-301/trial_T1" / "pp"
    ann = json.loads((mug / "ann_1.json").read_text())
    assert ann["turk_annotations"]["anns"][1]["task_desc"] == "Mug to desk." and ann["scene"]["scene_num"] == 7
    assert existing.read_text() == "{}"
    assert not (eb_data / "json_2.1.0" / held["task"]).exists()


def test_trajectories_no_skill_can_play_are_left_out_and_counted(
    alfred: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan that needs an ALFRED object EB-ALFRED's skills leave out (a towel, ALFRED's
    ``Towel``; EmbodiedBench lists ``HandTowel`` only) could never be played: it is left out
    of the list and counted (its D1 expert plan would be an error). A name ALFRED does not
    have is a damaged file: an error naming it."""
    towel = "pick_and_place_simple-Towel-None-Bathtub-402/trial_T5"
    _traj(
        alfred,
        "train",
        towel,
        ["Put a towel in the tub."],
        (("GotoLocation", "towelholder"), ("PickupObject", "towel")),
    )
    out = tmp_path / "train.json"
    counts = write_training_list(alfred, out)
    assert counts["unplayable_trajectories"] == 1 and counts["episodes"] == 4
    assert towel not in {e["task"] for e in json.loads(out.read_text())[TRAIN_SUBSET]}
    assert main(["--alfred", str(alfred), "--out", str(out), "--eb-data", "", "--exclude", ""]) == 0
    assert "1 trajectories left out" in capsys.readouterr().out
    _traj(alfred, "train", "pick_and_place_simple-Mug-None-Desk-9/trial_T6", ["x"], (("GotoLocation", "dsek"),))
    with pytest.raises(ValueError, match=r"trial_T6/traj_data\.json: 'dsek' in GotoLocation is not an ALFRED object"):
        read_alfred_split(alfred)


def test_trajectory_overlap_is_seen_through_other_game_ids(tmp_path: Path) -> None:
    """A training list that names an evaluation trajectory has other game ids
    (alfred_train/i vs base/j): the overlap is found by trajectory."""
    root = build_fixture(tmp_path / "fx", episodes_per_subset=2, resolution=48)
    train = list_games([TRAIN_SUBSET], root / TRAIN_FILE)
    evaluation = list_games(path=root / "splits.json")
    assert shared_trajectories(train, evaluation) == []
    leaky = json.loads((root / TRAIN_FILE).read_text())
    base0 = json.loads((root / "splits.json").read_text())["base"][0]
    leaky[TRAIN_SUBSET].append(dict(base0, instruction="Some other wording."))
    (root / "leaky.json").write_text(json.dumps(leaky))
    leaked = list_games([TRAIN_SUBSET], root / "leaky.json")
    assert shared_trajectories(leaked, evaluation) == [base0["task"]]
    assert trajectories([game_ref("base", 0, root / "splits.json")]) == {"base/0": base0["task"]}


def test_command_line(alfred: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "train.json"
    assert main(["--alfred", str(alfred), "--out", str(out), "--eb-data", "", "--exclude", ""]) == 0
    assert "4 training episodes (3 trajectories)" in capsys.readouterr().out
    assert main(["--alfred", str(tmp_path / "none"), "--out", str(out), "--eb-data", "", "--exclude", ""]) == 2
    assert capsys.readouterr().err.startswith("error: ALFRED train annotations not found")
    (tmp_path / "empty" / "train").mkdir(parents=True)  # wrote a list of 0 episodes and exited 0
    assert main(["--alfred", str(tmp_path / "empty"), "--out", str(tmp_path / "e.json"), "--eb-data", ""]) == 2
    assert capsys.readouterr().err == (
        f"error: no playable training trajectory under {tmp_path / 'empty' / 'train'} (it holds none; 0 unplayable): "
        "point --alfred at ALFRED's unpacked json_2.1.0 folder\n"
    )
    assert not (tmp_path / "e.json").exists()


def test_presets_train_on_training_episodes_only(tmp_path: Path) -> None:
    """The paper preset trained on EmbodiedBench's base subset (``train_splits: ""`` fell back
    to the evaluation splits.json): now it trains on alfred_train and, without a training
    list, stops naming the key; the smoke preset trains on the fixture's training list."""
    from memprism_ray.config import load_config

    paper = load_config("configs/ebalfred_paper.yaml", ["--run.out_dir", str(tmp_path)])
    assert paper.ebalfred.train_subsets == (TRAIN_SUBSET,) and not set(paper.ebalfred.subsets) & {TRAIN_SUBSET}
    with pytest.raises(ValueError, match=r"ebalfred\.train_splits is empty"):
        paper.ebalfred.train_splits_path(paper.run.dir)
    given = load_config(
        "configs/ebalfred_paper.yaml", ["--run.out_dir", str(tmp_path), "--ebalfred.train_splits", "/data/t.json"]
    )
    assert given.ebalfred.train_splits_path(given.run.dir) == Path("/data/t.json")
    smoke = load_config("configs/ebalfred_smoke.yaml", ["--run.out_dir", str(tmp_path)])
    assert smoke.ebalfred.train_subsets == (TRAIN_SUBSET,)
    assert smoke.ebalfred.train_splits_path(smoke.run.dir) == smoke.ebalfred.fixture_dir(smoke.run.dir) / TRAIN_FILE
    assert paper.ebalfred.env_config(paper.run.dir, 0.2).n_shots == 10 and paper.ebalfred.skills == "scene"
    with pytest.raises(ValueError, match="not an EB-ALFRED subset"):
        load_config("configs/ebalfred_smoke.yaml", ["--ebalfred.subsets", "alfred_train"])
