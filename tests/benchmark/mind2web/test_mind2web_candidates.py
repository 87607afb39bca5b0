"""MindAct's candidate pool (issue 35 item 4): the release's candidate ranks, read from a safe
format (never a pickle), keep the top 50 candidates per step; a step whose positives are all
ranked outside is wrong; the converter turns the release's pickle into the safe formats
without running pickled code."""

from __future__ import annotations

import collections
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from memprism_ray.benchmark.mind2web import Mind2WebReplayEnv, list_games
from memprism_ray.benchmark.mind2web.candidates import (
    CONVERTER,
    load_candidate_ranks,
    resolve_scores_path,
    sample_id,
    write_scores,
)
from memprism_ray.benchmark.mind2web.contract import encode_mind2web_action
from memprism_ray.benchmark.mind2web.convert_scores import convert, main
from memprism_ray.benchmark.mind2web.data import EVAL_SPLITS, Mind2WebDataError, load_task
from memprism_ray.benchmark.mind2web.fixture import SCORES_FILE, build_fixture, positive_cut
from memprism_ray.benchmark.mind2web.report import mind2web_metrics
from memprism_ray.benchmark.mind2web.snapshot import build_snapshot, human_refs
from memprism_ray.benchmark.mind2web.snapshot_format import ref_of


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fixture(tmp_path_factory.mktemp("m2w-pool"), tasks_per_site=2, seed=0)


def _raw_ranks(root: Path) -> dict[str, dict[str, int]]:
    """The fixture's ranks read straight from its JSONL (the hand computation's input)."""
    lines = (root / SCORES_FILE).read_text().splitlines()
    return {row["sample_id"]: row["ranks"] for row in map(json.loads, lines)}


def _env(root: Path) -> Mind2WebReplayEnv:
    return Mind2WebReplayEnv(candidate_scores=str(root / SCORES_FILE))


def test_fixture_ranks_cut_some_positives_and_some_negatives(root: Path) -> None:
    ranks = _raw_ranks(root)
    tasks = [load_task(g) for split in EVAL_SPLITS for g in list_games(split, root)]
    pos_ranks = [
        ranks[sample_id(t.annotation_id, s.action_uid)][s.pos[0].backend_node_id] for t in tasks for s in t.steps
    ]
    assert any(r >= 50 for r in pos_ranks) and any(r < 50 for r in pos_ranks)
    neg_ranks = [
        ranks[sample_id(t.annotation_id, s.action_uid)][c.backend_node_id]
        for t in tasks
        for s in t.steps
        for c in s.neg
    ]
    assert any(r >= 50 for r in neg_ranks) and any(r < 50 for r in neg_ranks)
    # Every step of every split is ranked (the release's file covers all of them).
    assert all(sample_id(t.annotation_id, s.action_uid) in ranks for t in tasks for s in t.steps)


def test_snapshot_shows_exactly_the_top_50(root: Path) -> None:
    ranks = _raw_ranks(root)
    pool = load_candidate_ranks(root / SCORES_FILE)
    for game in list_games("test_task", root):
        task = load_task(game)
        for i, step in enumerate(task.steps):
            per = ranks[sample_id(task.annotation_id, step.action_uid)]
            snap = build_snapshot(step, pool=pool.pool(task.annotation_id, step.action_uid))
            assert set(snap.refs) == {ref_of(n) for n, r in per.items() if r < 50}
            # The fixture cuts the positive of every fourth step: it is then not on the page.
            assert bool(human_refs(step, snap)) == (per[step.pos[0].backend_node_id] < 50)
            assert (per[step.pos[0].backend_node_id] >= 50) == positive_cut(
                list_games("test_task", root).index(game), i
            )
    with pytest.raises(Mind2WebDataError, match="does not cover this step"):
        pool.pool("no-such-task", "no-such-step")


def _play(env: Mind2WebReplayEnv, root: Path) -> tuple[list[dict], list[dict], dict[str, int]]:
    """Every test task replayed with a fixed predictor: the human action (target: the recorded
    positive, shown or not) on even steps, a CLICK on the first other element on odd ones."""
    episodes, rows, expected = [], [], {}
    for split in EVAL_SPLITS:
        for game in list_games(split, root):
            task = load_task(game)
            obs = env.reset(game)
            admissible = obs.admissible
            for t, step in enumerate(task.steps):
                target = ref_of(step.pos[0].backend_node_id)
                if t % 2 == 0:
                    pred = encode_mind2web_action(step.op, target, None if step.op == "CLICK" else step.value)
                else:
                    pred = encode_mind2web_action("CLICK", next(r for r in admissible if r != target), None)
                tr = env.step(pred)
                rows.append(
                    {
                        "episode_id": game.game_id,
                        "step": t,
                        "correct": tr.meta["correct"],
                        "valid": tr.meta["error"] is None,
                        "element_correct": tr.meta["element_correct"],
                        "op_f1": tr.meta["op_f1"],
                    }
                )
                admissible = tr.admissible
            episodes.append({"episode_id": game.game_id, "split": split, "won": tr.won, "status": "ok"})
            expected[game.game_id] = len(task.steps)
    return episodes, rows, expected


def test_element_accuracy_is_mindact_s_top_50_rule_by_hand(root: Path) -> None:
    """Target of issue 35: with candidate scores, element accuracy equals a hand computation of
    metric.py's rule (a step is element-correct when the predicted element is a positive whose
    rank is < 50), from the raw ranks file; without them every positive is shown."""
    ranks = _raw_ranks(root)
    hand = {split: [0, 0] for split in EVAL_SPLITS}
    hand_project = {split: 0 for split in EVAL_SPLITS}
    for split in EVAL_SPLITS:
        for game in list_games(split, root):
            task = load_task(game)
            for t, step in enumerate(task.steps):
                rank = ranks[sample_id(task.annotation_id, step.action_uid)][step.pos[0].backend_node_id]
                hand[split][0] += int(t % 2 == 0 and rank < 50)
                hand[split][1] += 1
                hand_project[split] += int(t % 2 == 0)
    episodes, rows, expected = _play(_env(root), root)
    metrics = mind2web_metrics(episodes, rows, expected)
    for split in EVAL_SPLITS:
        el = metrics[split]["metric_py"]["element_accuracy"]
        assert (el["correct"], el["n"]) == tuple(hand[split])
        # The paper's rule applies the same cut: a positive outside the pool is not even a valid ref.
        assert metrics[split]["step_accuracy"]["correct"] <= el["correct"]
    assert sum(h[0] for h in hand.values()) < sum(hand_project.values())  # the cut is real on the fixture
    p_eps, p_rows, p_expected = _play(Mind2WebReplayEnv(), root)
    project = mind2web_metrics(p_eps, p_rows, p_expected)
    assert {s: project[s]["metric_py"]["element_accuracy"]["correct"] for s in EVAL_SPLITS} == hand_project
    # A cut step: predicting the recorded positive is an invalid ref and scores 0 everywhere.
    cut = [r for r in rows if r["step"] % 2 == 0 and not r["element_correct"]]
    assert cut and all(not r["valid"] and r["op_f1"] == 0.0 and not r["correct"] for r in cut)


def test_positives_in_pool_per_step(root: Path) -> None:
    ranks = _raw_ranks(root)
    game = list_games("test_task", root)[1]
    task = load_task(game)
    want = tuple(ranks[sample_id(task.annotation_id, s.action_uid)][s.pos[0].backend_node_id] < 50 for s in task.steps)
    assert _env(root).positives_in_pool(game) == want and False in want
    assert Mind2WebReplayEnv().positives_in_pool(game) == (True,) * len(task.steps)


def test_top_k_is_the_cut(root: Path) -> None:
    ranks = _raw_ranks(root)
    small = load_candidate_ranks(root / SCORES_FILE, top_k=3)
    for sid, per in ranks.items():
        assert small.top[sid] == frozenset(n for n, r in per.items() if r < 3)


# --- safe formats and the converter -------------------------------------------------------


def _release_pickle(root: Path, path: Path) -> dict[str, dict[str, int]]:
    """A pickle shaped like the release's scores_all_data.pkl (numpy scalars, defaultdicts)."""
    ranks = _raw_ranks(root)
    scores: dict[str, dict[str, np.float32]] = collections.defaultdict(dict)
    out_ranks: dict[str, dict[str, np.int64]] = collections.defaultdict(dict)
    for sid, per in ranks.items():
        for node, r in per.items():
            scores[sid][node] = np.float32(1.0 - r / 80)
            out_ranks[sid][node] = np.int64(r)
    path.write_bytes(pickle.dumps({"scores": scores, "ranks": out_ranks}))
    return ranks


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json"])
def test_converter_round_trips_the_release_pickle(root: Path, tmp_path: Path, suffix: str) -> None:
    ranks = _release_pickle(root, tmp_path / "scores_all_data.pkl")
    out = tmp_path / f"scores{suffix}"
    assert main([str(tmp_path / "scores_all_data.pkl"), str(out)]) == 0
    got = load_candidate_ranks(out)
    assert got.top == load_candidate_ranks(root / SCORES_FILE).top
    assert set(got.top) == set(ranks)


def test_converter_refuses_code_in_the_pickle(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):  # what a hostile "scores" file would carry
            return (open, (str(marker), "w"))

    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"ranks": {"a_b": {"1": Evil()}}}))
    with pytest.raises(Mind2WebDataError, match=r"names io\.open, .*refused"):
        convert(tmp_path / "evil.pkl", tmp_path / "out.parquet")
    assert not marker.exists() and not (tmp_path / "out.parquet").exists()
    assert main([str(tmp_path / "evil.pkl"), str(tmp_path / "out.jsonl")]) == 1
    (tmp_path / "empty.pkl").write_bytes(pickle.dumps({"scores": {}, "ranks": {}}))
    with pytest.raises(Mind2WebDataError, match=r"empty\.pkl ranks no step \('ranks' is empty\)"):
        convert(tmp_path / "empty.pkl", tmp_path / "empty.parquet")
    assert not (tmp_path / "empty.parquet").exists()  # it wrote a file of 0 steps and said to use it


def test_pickles_are_refused_with_the_converter_named(root: Path, tmp_path: Path) -> None:
    from memprism_ray.config import load_config

    with pytest.raises(ValueError, match=r"is a pickle.*convert_scores"):
        load_config("configs/mind2web_smoke.yaml", ["--mind2web.candidate_scores", "scores_all_data.pkl"])
    # A pickle under a safe name is recognised by its first byte, before any parser sees it.
    _release_pickle(root, tmp_path / "renamed.json")
    with pytest.raises(Mind2WebDataError, match="is a pickle") as err:
        resolve_scores_path("renamed.json", tmp_path)
    assert CONVERTER in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(Mind2WebDataError, match="unknown format"):
        resolve_scores_path("scores.csv", tmp_path)
    with pytest.raises(Mind2WebDataError, match="does not exist"):
        resolve_scores_path("missing.parquet", tmp_path)
    assert resolve_scores_path(SCORES_FILE, root) == root / SCORES_FILE  # relative: under the data root


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"sample_id": "a_b", "ranks": {"1": 2.5}}', "must be an integer"),
        ('{"sample_id": "a_b", "ranks": {"1": -1}}', "must be an integer >= 0"),
        ('{"sample_id": "", "ranks": {"1": 0}}', "'sample_id' must be a non-empty string"),
        ('{"sample_id": "a_b", "ranks": [0]}', "'ranks' must be an object"),
        ("not json", "not JSON"),
    ],
)
def test_bad_rank_files_are_one_line_errors(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / f"bad{abs(hash(text))}.jsonl"
    path.write_text(text + "\n")
    with pytest.raises(Mind2WebDataError, match=reason) as err:
        load_candidate_ranks(path)
    assert "\n" not in str(err.value)


def test_parquet_columns_are_checked(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sample_id": ["a_b"], "rank": [0]}), tmp_path / "x.parquet")
    with pytest.raises(Mind2WebDataError, match="missing column"):
        load_candidate_ranks(tmp_path / "x.parquet")
    pq.write_table(pa.table({"sample_id": ["a_b"], "backend_node_id": ["1"], "rank": [0.5]}), tmp_path / "y.parquet")
    with pytest.raises(Mind2WebDataError, match="must be integers"):
        load_candidate_ranks(tmp_path / "y.parquet")
    write_scores({"a_b": {"1": 0, "2": 70}}, {}, tmp_path / "z.parquet")
    assert load_candidate_ranks(tmp_path / "z.parquet").pool("a", "b") == frozenset({"1"})
