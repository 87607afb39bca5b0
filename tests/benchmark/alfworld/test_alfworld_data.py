"""Split listing over an alfworld-download tree, AlfredTWEnv's filters, and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memprism_ray.benchmark.alfworld.data import SPLITS, game_ref_from_path, list_games, resolve_data_root


def test_splits_are_sorted_stable_and_typed(alfworld_corpus: Path, alfworld_games: dict) -> None:
    assert set(alfworld_games) == set(SPLITS)
    for split, games in alfworld_games.items():
        assert len(games) == 6
        ids = [g.game_id for g in games]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        assert {g.split for g in games} == {split}
        for g in games:
            assert g.path.name == "game.tw-pddl" and g.path.is_file()
            assert g.game_id.startswith(g.task_type + "-")
    # a second listing is identical (stable ids)
    assert list_games("train", alfworld_corpus) == alfworld_games["train"]
    # eval-out-of-distribution games use ALFRED's held-out scenes only
    from memprism_ray.benchmark.alfworld.layouts import test_scenes as held_out

    for g in alfworld_games["eval_out_of_distribution"]:
        assert int(g.game_id.split("/")[0].rsplit("-", 1)[1]) in held_out()


def test_task_type_filter(alfworld_corpus: Path) -> None:
    games = list_games("train", alfworld_corpus, task_types=("pick_two_obj_and_place",))
    assert [g.task_type for g in games] == ["pick_two_obj_and_place"]
    with pytest.raises(ValueError, match="unknown ALFWorld task type"):
        list_games("train", alfworld_corpus, task_types=("fly",))


def test_alfredtwenv_filters_apply(alfworld_corpus: Path, tmp_path: Path) -> None:
    src = list_games("train", alfworld_corpus)
    split = tmp_path / "json_2.1.1" / "train"
    kept = split / src[0].game_id
    shutil.copytree(src[0].path.parent, kept)
    # 'movable' / 'Sliced' folders are skipped, as are unsolvable games and games without a game file
    shutil.copytree(src[1].path.parent, split / "pick_and_place_with_movable_recep-X" / "trial_1")
    shutil.copytree(src[2].path.parent, split / "pick_heat_then_place_in_recep-AppleSliced-None-Fridge-1" / "t")
    unsolvable = split / "pick_and_place_simple-Mug-None-Desk-301" / "trial_u"
    shutil.copytree(src[3].path.parent, unsolvable)
    data = json.loads((unsolvable / "game.tw-pddl").read_text())
    data["solvable"] = False
    (unsolvable / "game.tw-pddl").write_text(json.dumps(data))
    missing = split / "pick_and_place_simple-Pen-None-Desk-301" / "trial_m"
    missing.mkdir(parents=True)
    shutil.copy(src[4].path.parent / "traj_data.json", missing)
    games = list_games("train", tmp_path)
    assert [g.game_id for g in games] == [src[0].game_id]


def test_missing_or_empty_data_gives_a_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"ALFWORLD_DATA .*does not exist.*memprism games build"):
        list_games("train")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(ValueError, match=r"has no json_2.1.1/ folder"):
        resolve_data_root()
    (tmp_path / "json_2.1.1" / "valid_seen").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"no json_2.1.1/train/ folder for split 'train'"):
        list_games("train")
    with pytest.raises(ValueError, match=r"no playable ALFWorld games for split 'eval_in_distribution'.*0 traj_data"):
        list_games("eval_in_distribution")
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        list_games("test", tmp_path)


def test_game_ref_from_path(alfworld_games: dict, tmp_path: Path) -> None:
    g = alfworld_games["train"][0]
    assert game_ref_from_path(g.path.parent).task_type == g.task_type
    assert game_ref_from_path(g.path).game_id == g.game_id
    with pytest.raises(ValueError, match="no such ALFWorld game file"):
        game_ref_from_path(tmp_path)
    (tmp_path / "game.tw-pddl").write_text("{}")
    with pytest.raises(ValueError, match=r"no traj_data\.json"):
        game_ref_from_path(tmp_path)


def test_alfworlds_own_placeholder_is_not_an_error(
    alfworld_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memprism_ray.benchmark.alfworld.corpus as corpus

    # importing alfworld.info sets ALFWORLD_DATA=~/.cache/alfworld (an empty folder)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".cache" / "alfworld").mkdir(parents=True)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / ".cache" / "alfworld"))
    monkeypatch.setattr(corpus, "ensure_default_corpus", lambda: alfworld_corpus)
    assert resolve_data_root() == alfworld_corpus
    # the same folder holding games is used as given
    (tmp_path / ".cache" / "alfworld" / "json_2.1.1").mkdir()
    assert resolve_data_root() == tmp_path / ".cache" / "alfworld"


def _copy_split(games: list, root: Path, n: int) -> list[Path]:
    """The first ``n`` games copied into a fresh ``root`` tree (train split); their folders."""
    split = root / "json_2.1.1" / "train"
    out = []
    for g in games[:n]:
        dst = split / g.game_id
        shutil.copytree(g.path.parent, dst)
        out.append(dst)
    return out


def test_broken_game_files_are_reported_not_dropped_silently(
    alfworld_corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from memprism_ray.benchmark.alfworld.data import scan_split

    src = list_games("train", alfworld_corpus)
    _good, bad_game, bad_traj, not_object = _copy_split(src, tmp_path, 4)
    (bad_game / "game.tw-pddl").write_text("not json {")
    (bad_traj / "traj_data.json").write_bytes(b"\xff\xfe")
    (not_object / "game.tw-pddl").write_text("[1, 2]")
    scan = scan_split("train", tmp_path)
    assert [g.game_id for g in scan.games] == [src[0].game_id]
    reasons = {b.game.game_id: b.reason for b in scan.broken}
    assert set(reasons) == {src[1].game_id, src[2].game_id, src[3].game_id}
    assert reasons[src[1].game_id].startswith("game.tw-pddl is not valid JSON")
    assert reasons[src[2].game_id].startswith("traj_data.json unreadable (UnicodeDecodeError")
    assert reasons[src[3].game_id] == "game.tw-pddl holds a list, not a JSON object"
    assert {b.game.split for b in scan.broken} == {"train"}
    assert "3 broken" in scan.summary
    # list_games (training jobs) leaves them out, but says so, naming them.
    with caplog.at_level("WARNING", logger="memprism_ray.benchmark.alfworld.data"):
        assert list_games("train", tmp_path) == scan.games
    assert "3 broken game file(s)" in caplog.text and src[1].game_id in caplog.text


def test_a_split_of_only_broken_games_is_an_error_naming_them(alfworld_corpus: Path, tmp_path: Path) -> None:
    from memprism_ray.benchmark.alfworld.data import scan_split

    src = list_games("train", alfworld_corpus)
    (folder,) = _copy_split(src, tmp_path, 1)
    (folder / "game.tw-pddl").write_text("")
    assert [b.game.game_id for b in scan_split("train", tmp_path).broken] == [src[0].game_id]
    with pytest.raises(ValueError, match=r"no playable ALFWorld games for split 'train'.*1 broken game file\(s\)"):
        list_games("train", tmp_path)
