"""The recorded-transcript fixture: deterministic, all six subsets, consistent states, the
controller's skill list in EmbodiedBench's real shape, training episodes apart from the
evaluation ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from PIL import Image

from memprism_ray.benchmark.ebalfred.data import SUBSETS, TRAIN_SUBSET, load_splits
from memprism_ray.benchmark.ebalfred.fixture import TRAIN_FILE, build_fixture, object_box
from memprism_ray.benchmark.ebalfred.fixture_format import load_transcripts
from memprism_ray.benchmark.ebalfred.skills import global_skills, instance_names, language_skill_set, scene_filter


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_build_is_deterministic(tmp_path: Path) -> None:
    a = build_fixture(tmp_path / "a", episodes_per_subset=2, resolution=64)
    b = build_fixture(tmp_path / "b", episodes_per_subset=2, resolution=64)
    assert _digest(a) == _digest(b)
    c = build_fixture(tmp_path / "c", episodes_per_subset=2, resolution=80)
    assert _digest(a) != _digest(c)


def test_all_subsets_and_states_are_consistent(tmp_path: Path) -> None:
    root = build_fixture(tmp_path, episodes_per_subset=3, resolution=96)
    splits = load_splits(root / "splits.json")
    doc = load_transcripts(root)
    train = load_splits(root / TRAIN_FILE, (TRAIN_SUBSET,))
    assert set(splits) == set(SUBSETS) and all(len(splits[s]) == 3 for s in SUBSETS)
    # Six training episodes by default (was four): one per family, the two-instance ones included.
    assert len(train[TRAIN_SUBSET]) == 6 and len(doc["episodes"]) == 18 + 6
    for key, ep in doc["episodes"].items():
        subset, i = key.split("/")
        entry = (train if subset == TRAIN_SUBSET else splits)[subset][int(i)]
        assert entry["instruction"] == ep["instruction"]
        assert ep["skills"] == language_skill_set(ep["scene_objects"])
        assert ep["admissible"] == scene_filter(ep["skills"], ep["scene_objects"])
        states = [ep["initial"], *ep["steps"]]
        assert ep["steps"][-1]["conds"] == ep["conds_total"]
        assert [s["conds"] for s in states] == sorted(s["conds"] for s in states)  # progress never drops here
        for s in states:
            with Image.open(root / s["frame"]) as im:
                assert im.format == "PNG" and im.size == (96, 96)
            assert sorted(s["boxes"]) == sorted(v.lower() for v in s["visible"])
            for box in s["boxes"].values():
                assert 0 <= box[0] < box[2] <= 1000 and 0 <= box[1] < box[3] <= 1000
            assert all(st["action"] in ep["admissible"] for st in ep["steps"])
        # A find/open/close record names its instance as EmbodiedBench does (``Drawer_2``: the second).
        names = {n: oid for oid, n in instance_names(ep["scene_objects"]).items()}
        for st in ep["steps"]:
            if st["action"].startswith(("find a ", "open the ", "close the ")):
                name = st["action"].rsplit(" ", 1)[1]
                first = next(o["objectId"] for o in ep["scene_objects"] if o["objectType"] == name.split("_")[0])
                assert st["object_id"] == names.get(name, first)
            else:
                assert st["object_id"] == ""
    long = [len(ep["steps"]) for k, ep in doc["episodes"].items() if k.startswith("long_horizon/")]
    assert min(long) >= 9


def test_skill_lists_have_the_real_shape(tmp_path: Path) -> None:
    """The controller's list as EmbodiedBench's EBAlfEnv builds it (b247936): the 162 global
    skills, then per-scene instance skills; the fixture's scenes have several Drawers,
    Cabinets, CounterTops and Pens, so the instance skills appear (issue 30 item 4)."""
    root = build_fixture(tmp_path, episodes_per_subset=2, resolution=64)
    doc = load_transcripts(root)
    extras = set()
    for ep in doc["episodes"].values():
        assert ep["skills"][:162] == global_skills() and len(ep["skills"]) > 162
        extras.update(ep["skills"][162:])
        assert len(ep["admissible"]) < 40 and set(ep["admissible"]) >= set(ep["skills"][162:])
    assert {
        "find a Drawer_2",
        "open the Drawer_3",
        "close the Cabinet_4",
        "find a CounterTop_2",
        "find a Pen_2",
    } <= extras


def test_training_episodes_are_other_tasks(tmp_path: Path) -> None:
    root = build_fixture(tmp_path, episodes_per_subset=2, resolution=64, train_episodes=5)
    evaluation = load_splits(root / "splits.json")
    train = load_splits(root / TRAIN_FILE, (TRAIN_SUBSET,))[TRAIN_SUBSET]
    assert len(train) == 5 and TRAIN_SUBSET not in json.loads((root / "splits.json").read_text())
    eval_tasks = {e["task"] for eps in evaluation.values() for e in eps}
    eval_goals = {e["instruction"] for eps in evaluation.values() for e in eps}
    assert not {e["task"] for e in train} & eval_tasks and not {e["instruction"] for e in train} & eval_goals
    examples = json.loads((root / "examples" / "alfred_examples.json").read_text())
    long = json.loads((root / "examples" / "alfred_long_horizon_examples.json").read_text())
    assert (len(examples), len(long)) == (10, 7)  # EmbodiedBench's example counts
    assert all(x.startswith("Human instruction: ") and "'executable_plan'" in x for x in examples + long)


def test_boxes_mark_drawn_objects(tmp_path: Path) -> None:
    root = build_fixture(tmp_path, episodes_per_subset=1, resolution=96)
    ep = load_transcripts(root)["episodes"]["base/0"]
    state = ep["steps"][0]
    with Image.open(root / state["frame"]) as im:
        rgb = im.convert("RGB")
        for name in state["visible"]:
            left, t, r, b = object_box(name, 96)
            assert rgb.getpixel(((left + r) // 2, (t + b) // 2)) != rgb.getpixel((1, 1))  # not background


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="episodes_per_subset"):
        build_fixture(tmp_path, episodes_per_subset=0)
    with pytest.raises(ValueError, match="train_episodes"):
        build_fixture(tmp_path, train_episodes=-1)
    with pytest.raises(FileNotFoundError, match="build_fixture"):
        load_transcripts(tmp_path / "nothing")
    root = build_fixture(tmp_path / "f", episodes_per_subset=1)
    doc = json.loads((root / "transcripts.json").read_text())
    doc["version"] = 99
    (root / "transcripts.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="fixture version 99"):
        load_transcripts(root)


def test_the_job_builds_the_fixture_its_settings_ask_for(tmp_path: Path) -> None:
    """The run's own fixture is built again when ``ebalfred.fixture_episodes`` (or the frame
    resolution) changes: it was reused whatever the run asked; a fixture folder the user names is
    never built over, its mismatch is one line."""
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.config import load_config

    bench = get_benchmark("ebalfred")
    said: list[str] = []

    def prepared(*extra: str) -> Path:
        argv = ["--run.out_dir", str(tmp_path), "--run.name", "r", *extra]
        cfg = bench.prepare(load_config("configs/ebalfred_smoke.yaml", argv), said.append)
        return Path(cfg.ebalfred.fixture)

    root = prepared("--ebalfred.fixture_episodes", "1")
    assert len(load_splits(root / "splits.json")[SUBSETS[0]]) == 1 and len(said) == 2
    (root / "frames" / "stale.png").write_bytes(b"")
    assert prepared("--ebalfred.fixture_episodes", "1") == root and len(said) == 3  # reused: not built again
    assert prepared("--ebalfred.fixture_episodes", "2") == root
    assert said[-2] == f"EB-ALFRED fixture built at {root} (2 episode(s) per subset)"
    assert len(load_splits(root / "splits.json")[SUBSETS[0]]) == 2 and not (root / "frames" / "stale.png").exists()
    with pytest.raises(
        ValueError, match=r"ebalfred.fixture .* holds 2 episode\(s\) per subset at 96 px; this run asks 1"
    ):
        prepared("--ebalfred.fixture", str(root), "--ebalfred.fixture_episodes", "1")
    mine = tmp_path / "mine"  # a folder of the user's, named by mistake: it was built over
    mine.mkdir()
    (mine / "splits.json").write_text("{}")
    with pytest.raises(ValueError, match=r"ebalfred.fixture .*mine holds files but no EB-ALFRED fixture"):
        prepared("--ebalfred.fixture", str(mine))
    assert [p.name for p in mine.iterdir()] == ["splits.json"] and (mine / "splits.json").read_text() == "{}"
    (tmp_path / "empty").mkdir()
    assert prepared("--ebalfred.fixture", str(tmp_path / "empty")) == tmp_path / "empty"
