"""The Mind2Web loader reads the official release layout and schema (issue 12 item 2),
checked on the generated fixture and on hand-written files; a missing path is one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprism_ray.benchmark.mind2web import data
from memprism_ray.benchmark.mind2web.data import Mind2WebDataError, Task, list_games, load_task, resolve_data_root
from memprism_ray.benchmark.mind2web.fixture import SPLIT_SITES, build_fixture


def load_split(split: str, root: Path | None = None) -> list[Task]:
    """Every task of ``split`` as the env reads them: the games, then each game's task."""
    return [load_task(g) for g in list_games(split, root)]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fixture(tmp_path_factory.mktemp("m2w"), tasks_per_site=2, seed=3)


def _task(aid: str = "t1", op: str = "CLICK", attrs: str = '{"class": "x"}') -> dict:
    return {
        "annotation_id": aid,
        "website": "site",
        "domain": "Travel",
        "subdomain": "Airlines",
        "confirmed_task": "Do it",
        "action_reprs": ["[button]  Go -> CLICK"],
        "actions": [
            {
                "action_uid": "u1",
                "raw_html": "<html></html>",
                "cleaned_html": '<html><button backend_node_id="7">Go</button></html>',
                "operation": {"op": op, "original_op": "HOVER", "value": ""},
                "pos_candidates": [{"tag": "button", "backend_node_id": "7", "attributes": attrs}],
                "neg_candidates": [],
            }
        ],
    }


def _write(root: Path, split: str, tasks: list) -> Path:
    (root / split).mkdir(parents=True, exist_ok=True)
    path = root / split / f"{split}_0.json"
    path.write_text(json.dumps(tasks))
    return path


def test_fixture_splits_follow_the_release_layout(root: Path) -> None:
    for split in data.SPLITS:
        assert (root / split / f"{split}_0.json").exists()
        tasks = load_split(split, root)
        assert len(tasks) == 2 * len(SPLIT_SITES[split])
        assert all(t.split == split and t.steps for t in tasks)
    train = load_split("train", root)
    test_domain = load_split("test_domain", root)
    assert {t.domain for t in test_domain}.isdisjoint({t.domain for t in train})  # Cross-Domain
    step = train[0].steps[0]
    assert step.op in data.OPS and step.pos and step.neg and step.cleaned_html and step.repr
    assert step.pos[0].attributes["backend_node_id"] == step.pos[0].backend_node_id  # attributes JSON decoded


def test_games_name_tasks_and_load_back(root: Path) -> None:
    games = list_games("test_task", root)
    assert len({g.game_id for g in games}) == len(games)
    for g in games:
        task = load_task(g)
        assert task.annotation_id == g.game_id and g.task_type == task.domain and g.split == "test_task"


def test_fixture_is_deterministic(tmp_path: Path) -> None:
    a = build_fixture(tmp_path / "a", tasks_per_site=2, seed=3)
    b = build_fixture(tmp_path / "b", tasks_per_site=2, seed=3)
    c = build_fixture(tmp_path / "c", tasks_per_site=2, seed=4)
    read = lambda r: (r / "train" / "train_0.json").read_text()  # noqa: E731
    assert read(a) == read(b) != read(c)


def test_missing_path_says_where_to_get_the_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MIND2WEB_DATA", raising=False)
    with pytest.raises(Mind2WebDataError) as err:
        resolve_data_root(None)
    msg = str(err.value)
    assert "huggingface.co/datasets/osunlp/Mind2Web" in msg and "MIND2WEB_DATA" in msg and "corpus.data_root" in msg
    with pytest.raises(Mind2WebDataError, match="does not exist"):
        resolve_data_root(tmp_path / "nowhere")
    with pytest.raises(Mind2WebDataError, match="holds none of the split folders"):
        resolve_data_root(tmp_path)


def test_env_var_and_data_level_are_accepted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write(tmp_path / "data", "train", [_task()])
    monkeypatch.setenv("MIND2WEB_DATA", str(tmp_path))
    assert resolve_data_root(None) == tmp_path / "data"
    assert [t.annotation_id for t in load_split("train")] == ["t1"]
    with pytest.raises(Mind2WebDataError, match=r"no \*\.json files"):
        load_split("test_task")


@pytest.mark.parametrize(
    ("task", "match"),
    [
        (_task(op="SCROLL"), r"operation\.op='SCROLL' is not one of CLICK, TYPE, SELECT"),
        (_task(attrs="{not json"), "candidate 'attributes' is not JSON"),
        ({**_task(), "actions": []}, "field 'actions' must be a non-empty list"),
        ({k: v for k, v in _task().items() if k != "confirmed_task"}, "field 'confirmed_task' must be a string"),
    ],
)
def test_malformed_tasks_name_the_field(tmp_path: Path, task: dict, match: str) -> None:
    _write(tmp_path, "train", [task])
    with pytest.raises(Mind2WebDataError, match=match):
        load_split("train", tmp_path)


def test_duplicate_ids_and_unknown_splits_are_errors(tmp_path: Path) -> None:
    _write(tmp_path, "train", [_task("a"), _task("a")])
    with pytest.raises(Mind2WebDataError, match="appears twice"):
        load_split("train", tmp_path)
    with pytest.raises(Mind2WebDataError, match="not a Mind2Web split"):
        list_games("valid", tmp_path)


def test_original_op_and_lowercase_ops_are_read(tmp_path: Path) -> None:
    _write(tmp_path, "train", [_task(op="click")])
    step = load_split("train", tmp_path)[0].steps[0]
    assert (step.op, step.original_op) == ("CLICK", "HOVER")
