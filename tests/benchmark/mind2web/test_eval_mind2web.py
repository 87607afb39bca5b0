"""Mind2Web metrics (issue 12 item 3): step action accuracy and exact episode success per
split and overall, Wilson intervals, failed episodes' unplayed steps counted as wrong, and
paired comparisons between conditions on the same steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprism_ray.agent import EpisodeResult, EpisodeSpec
from memprism_ray.benchmark.mind2web import report as m2w
from memprism_ray.benchmark.mind2web.candidates import pool_info
from memprism_ray.envs.base import GameRef
from memprism_ray.eval.stats import wilson_interval

PROJECT_POOL = pool_info("", 50, 32)
MINDACT_POOL = pool_info("/data/scores_all_data.parquet", 50, 32)


def _ep(eid: str, split: str, won: bool, steps: int, status: str = "ok") -> dict:
    return {"episode_id": eid, "split": split, "won": won, "steps": steps, "status": status}


def _rows(eid: str, correct: list[bool], valid: list[bool] | None = None) -> list[dict]:
    valid = valid or [True] * len(correct)
    return [
        {"episode_id": eid, "step": t, "correct": c, "valid": v}
        for t, (c, v) in enumerate(zip(correct, valid, strict=True))
    ]


EPISODES = [
    _ep("a", "test_task", True, 2),
    _ep("b", "test_task", False, 3),
    _ep("c", "test_domain", False, 1, status="failed"),  # crashed after 1 of 4 steps
]
ROWS = _rows("a", [True, True]) + _rows("b", [True, False, False], [True, False, True]) + _rows("c", [True])
EXPECTED = {"a": 2, "b": 3, "c": 4}


def test_metrics_per_split_and_overall() -> None:
    m = m2w.mind2web_metrics(EPISODES, ROWS, EXPECTED)
    assert list(m) == ["test_task", "test_domain", "overall"]
    assert m["test_task"]["step_accuracy"] == {
        "correct": 3,
        "n": 5,
        "rate": 0.6,
        "wilson95": list(wilson_interval(3, 5)),
    }
    assert (m["test_task"]["episode_success"]["correct"], m["test_task"]["episode_success"]["n"]) == (1, 2)
    assert m["test_task"]["invalid_predictions"] == 1
    # The failed episode: 1 played correct step, 3 unplayed steps wrong; a failure, not a success.
    d = m["test_domain"]
    assert (d["step_accuracy"]["correct"], d["step_accuracy"]["n"]) == (1, 4)
    assert (d["episode_success"]["correct"], d["episode_success"]["n"], d["failed_episodes"]) == (0, 1, 1)
    o = m["overall"]
    assert (o["step_accuracy"]["correct"], o["step_accuracy"]["n"]) == (4, 9)
    assert (o["episode_success"]["correct"], o["episode_success"]["n"], o["steps_played"]) == (1, 3, 6)


def test_step_outcomes_fill_unplayed_steps() -> None:
    out = m2w.step_outcomes(EPISODES, ROWS, EXPECTED)
    assert out["c#0"] == 1 and out["c#3"] == 0 and len(out) == 9


def _result(eid: str, split: str, won: bool, steps: int) -> EpisodeResult:
    return EpisodeResult(EpisodeSpec(eid, GameRef(eid, Path("x.json"), "Travel", split)), won=won, steps=steps)


def test_summary_pairs_conditions_on_the_same_steps(tmp_path: Path) -> None:
    splits = ["test_task"] * 6 + ["test_website"] * 6
    eids = [f"e{i}" for i in range(12)]
    expected = dict.fromkeys(eids, 2)
    results_base = [_result(e, s, False, 2) for e, s in zip(eids, splits, strict=True)]
    results_good = [_result(e, s, True, 2) for e, s in zip(eids, splits, strict=True)]
    rows_base = [r for e in eids for r in _rows(e, [True, False])]
    rows_good = [r for e in eids for r in _rows(e, [True, True])]
    reports = [
        {"condition": "base", "failed_episodes": 0, "mind2web": m2w.mind2web_metrics(
            [r.summary() for r in results_base], rows_base, expected)},
        {"condition": "good", "failed_episodes": 0, "mind2web": m2w.mind2web_metrics(
            [r.summary() for r in results_good], rows_good, expected)},
    ]  # fmt: skip
    summary = m2w.write_summary(
        tmp_path,
        reports,
        {"base": results_base, "good": results_good},
        {"base": rows_base, "good": rows_good},
        expected,
        candidate_pool=PROJECT_POOL,
        seed=0,
    )
    assert summary["splits"] == ["test_task", "test_website"]
    p = summary["paired_vs_base"]["good"]["overall"]
    assert p["step_accuracy"]["diff"] == pytest.approx(0.5) and p["step_accuracy"]["n_common"] == 24
    assert p["episode_success"]["diff"] == pytest.approx(1.0) and p["episode_success"]["ci95"] == [1.0, 1.0]
    assert summary["paired_vs_base"]["base"]["test_task"]["step_accuracy"]["diff"] == 0.0
    md = (tmp_path / "mind2web.md").read_text()
    assert "| good | 100.00 (12/12;" in md and "+50.00" in md
    assert (
        json.loads((tmp_path / "mind2web.json").read_text())["metrics"]["base"]["overall"]["step_accuracy"]["n"] == 24
    )


# Mind2Web's own metrics (src/action_prediction/metric.py): per step the element correctness
# and the operation F1 the replay env scored; expected values computed by hand below.
OFFICIAL_EPISODES = [
    _ep("a", "test_task", False, 2),
    _ep("b", "test_task", False, 3),
    _ep("c", "test_domain", False, 1, status="failed"),  # 1 of 4 steps played
    _ep("d", "test_website", True, 1),
]
OFFICIAL_SCORES = {  # (element_correct, op_f1) per played step
    "a": [(True, 1.0), (True, 1 / 3)],  # e.g. TYPE "new  york" for "New York": F1 1/3
    "b": [(True, 1.0), (False, 1.0), (True, 0.5)],  # right op/value on a wrong element; SELECT for TYPE
    "c": [(True, 1.0)],
    "d": [(True, 1.0)],
}
OFFICIAL_ROWS = [
    {"episode_id": e, "step": t, "correct": el and f1 == 1.0, "valid": True, "element_correct": el, "op_f1": f1}
    for e, steps in OFFICIAL_SCORES.items()
    for t, (el, f1) in enumerate(steps)
]


def test_metric_py_metrics_per_split() -> None:
    m = m2w.mind2web_metrics(OFFICIAL_EPISODES, OFFICIAL_ROWS, {"a": 2, "b": 3, "c": 4, "d": 1})
    t = m["test_task"]["metric_py"]  # 5 steps: element 4/5, F1 (1 + 1/3 + 1 + 1 + 1/2)/5, success 2/5
    assert t["element_accuracy"] == {"correct": 4, "n": 5, "rate": 0.8, "wilson95": list(wilson_interval(4, 5))}
    assert t["operation_f1"] == {"mean": pytest.approx(23 / 30), "n": 5}
    assert (t["step_success"]["correct"], t["step_success"]["n"]) == (2, 5)
    # Per task, then over tasks: a (1, 2/3, 1/2), b (2/3, 5/6, 1/3).
    assert t["macro_element_accuracy"] == pytest.approx(5 / 6)
    assert t["macro_operation_f1"] == pytest.approx(3 / 4)
    assert t["macro_step_success"] == pytest.approx(5 / 12)
    assert (t["task_success"]["correct"], t["task_success"]["n"]) == (0, 2)
    d = m["test_domain"]["metric_py"]  # the failed episode's 3 unplayed steps score 0
    assert (d["element_accuracy"]["correct"], d["element_accuracy"]["n"]) == (1, 4)
    assert d["operation_f1"]["mean"] == pytest.approx(1 / 4) and d["macro_step_success"] == pytest.approx(1 / 4)
    w = m["test_website"]["metric_py"]
    assert w["step_success"]["rate"] == 1.0 and (w["task_success"]["correct"], w["task_success"]["n"]) == (1, 1)
    o = m["overall"]["metric_py"]  # 10 steps, 4 tasks
    assert (o["element_accuracy"]["correct"], o["step_success"]["correct"], o["step_success"]["n"]) == (6, 4, 10)
    assert o["operation_f1"]["mean"] == pytest.approx(7 / 12)
    assert o["macro_element_accuracy"] == pytest.approx(35 / 48)
    assert o["macro_operation_f1"] == pytest.approx(11 / 16)
    assert o["macro_step_success"] == pytest.approx(25 / 48)
    assert (o["task_success"]["correct"], o["task_success"]["n"]) == (1, 4)
    # The paper's metrics beside them, unchanged: b's step 2 is right by F1 but not by element.
    assert (m["test_task"]["step_accuracy"]["correct"], m["overall"]["step_accuracy"]["correct"]) == (2, 4)


def test_metric_py_metrics_are_in_the_reports(tmp_path: Path) -> None:
    metrics = m2w.mind2web_metrics(OFFICIAL_EPISODES, OFFICIAL_ROWS, {"a": 2, "b": 3, "c": 4, "d": 1})
    md = m2w.metrics_markdown(metrics, PROJECT_POOL)
    assert "## MindAct's metrics (Mind2Web src/action_prediction/metric.py)" in md
    assert "| test_task | 80.00 (4/5; [" in md and "| 76.67 | 40.00 (2/5;" in md
    results = [_result(e["episode_id"], e["split"], e["won"], e["steps"]) for e in OFFICIAL_EPISODES]
    summary = m2w.write_summary(
        tmp_path,
        [{"condition": "base", "failed_episodes": 0, "mind2web": metrics}],
        {"base": results},
        {"base": OFFICIAL_ROWS},
        {"a": 2, "b": 3, "c": 4, "d": 1},
        candidate_pool=PROJECT_POOL,
    )
    assert summary["metrics"]["base"]["overall"]["metric_py"]["step_success"]["n"] == 10
    assert "| base | 80.00 / 76.67 / 40.00 / 0.00 |" in (tmp_path / "mind2web.md").read_text()


def test_reports_name_the_candidate_pool(tmp_path: Path) -> None:
    """Issue 35 item 4: the project's pool is named and not called MindAct's protocol; MindAct's
    pool is named with its file and cut."""
    metrics = m2w.mind2web_metrics(OFFICIAL_EPISODES, OFFICIAL_ROWS, {"a": 2, "b": 3, "c": 4, "d": 1})
    project = m2w.metrics_markdown(metrics, PROJECT_POOL)
    assert "Candidate pool: project candidate pool: positives + 31 negatives, not MindAct's top-50 protocol" in project
    assert "not comparable with published Mind2Web results" in project
    mindact = m2w.metrics_markdown(metrics, MINDACT_POOL)
    assert "MindAct candidate pool: top 50 of the release's candidate ranks (scores_all_data.parquet)" in mindact
    assert "not MindAct" not in mindact
    results = [_result(e["episode_id"], e["split"], e["won"], e["steps"]) for e in OFFICIAL_EPISODES]
    for pool, sub in ((PROJECT_POOL, "p"), (MINDACT_POOL, "m")):
        out = tmp_path / sub
        out.mkdir()
        summary = m2w.write_summary(
            out,
            [{"condition": "base", "failed_episodes": 0, "mind2web": metrics}],
            {"base": results},
            {"base": OFFICIAL_ROWS},
            {"a": 2, "b": 3, "c": 4, "d": 1},
            candidate_pool=pool,
        )
        assert summary["candidate_pool"] == pool
        assert json.loads((out / "mind2web.json").read_text())["candidate_pool"]["protocol"] == pool["protocol"]
        assert pool["description"] in (out / "mind2web.md").read_text()


def test_positives_in_pool_is_reported_per_split() -> None:
    """The ceiling of element accuracy (metric.py's "Recall Cap"): steps whose positive is in the
    pool, over every recorded step, unplayed ones included."""
    in_pool = {"a": [True, False], "b": [True, True, False], "c": [False, True, True, True], "d": [True]}
    m = m2w.mind2web_metrics(OFFICIAL_EPISODES, OFFICIAL_ROWS, {"a": 2, "b": 3, "c": 4, "d": 1}, in_pool)
    assert (
        m["test_task"]["metric_py"]["positives_in_pool"]["correct"],
        m["test_task"]["metric_py"]["positives_in_pool"]["n"],
    ) == (3, 5)
    assert m["overall"]["metric_py"]["positives_in_pool"]["correct"] == 7
    assert "| 60.00 (3/5;" in m2w.metrics_markdown(m, MINDACT_POOL)
    assert (
        m2w.mind2web_metrics(OFFICIAL_EPISODES, OFFICIAL_ROWS, {"a": 2})["overall"]["metric_py"]["positives_in_pool"]
        is None
    )


def _hand_f1(pred: set[str], label: set[str]) -> float:
    """metric.py ``calculate_f1`` by hand: token sets, precision and recall."""
    if not pred and not label:
        return 1.0
    if not pred or not label:
        return 0.0
    tp = len(pred & label)
    if tp == 0:
        return 0.0
    p, r = tp / len(pred), tp / len(label)
    return 2 * p * r / (p + r)


def test_mindact_columns_agree_with_a_hand_computation_on_the_fixture(tmp_path: Path) -> None:
    """Issue 41 item 3 target: on the Mind2Web fixture with MindAct's top-50 pool (its stand-in
    ranks), every test step is predicted in one of five ways (exact; value lower-cased, a CLICK
    with a value; another ref; JSON without its closing brace, which the paper's parser rejects;
    a lower-case op), played through the replay env, and MindAct's element accuracy, op F1, step
    SR, task SR and their macro means per split equal a hand computation of metric.py's rules
    from the fixture's raw files (a step whose positive is ranked >= 50 scores 0; an output
    that does not parse scores the tokens it wrote: before, op F1 0)."""
    from memprism_ray.benchmark.mind2web import Mind2WebReplayEnv, list_games
    from memprism_ray.benchmark.mind2web.candidates import sample_id
    from memprism_ray.benchmark.mind2web.data import EVAL_SPLITS
    from memprism_ray.benchmark.mind2web.fixture import SCORES_FILE, build_fixture
    from memprism_ray.benchmark.mind2web.snapshot_format import ref_of

    root = build_fixture(tmp_path / "m2w", tasks_per_site=2, seed=3)
    ranks = {r["sample_id"]: r["ranks"] for r in map(json.loads, (root / SCORES_FILE).read_text().splitlines())}
    env = Mind2WebReplayEnv(candidate_scores=str(root / SCORES_FILE))
    episodes, rows, expected, hand = [], [], {}, {}
    k = 0
    for split in EVAL_SPLITS:
        for game in list_games(split, root):
            raw = next(t for t in json.loads(game.path.read_text()) if t["annotation_id"] == game.game_id)
            admissible = env.reset(game).admissible
            scores = []
            for t, act in enumerate(raw["actions"]):
                op, value = act["operation"]["op"], act["operation"]["value"]
                node = act["pos_candidates"][0]["backend_node_id"]
                target = ref_of(node)
                in_pool = ranks[sample_id(raw["annotation_id"], act["action_uid"])][node] < 50
                label = {op} | (set(value.split()) if op != "CLICK" else set())
                val = None if op == "CLICK" else value
                kind = k % 5
                k += 1
                if kind == 0:
                    out, pred, element = json.dumps({"op": op, "ref": target, "value": val}), label, in_pool
                elif kind == 1:
                    written = "go now" if op == "CLICK" else value.lower()
                    out = json.dumps({"op": op, "ref": target, "value": written})
                    pred, element = {op} | set(written.split()), in_pool
                elif kind == 2:
                    other = next(r for r in admissible if r != target)
                    out, pred, element = json.dumps({"op": op, "ref": other, "value": val}), label, False
                elif kind == 3:
                    out = f'<action>{{"op": "{op}", "ref": "{target}", "value": "{value}"</action>'
                    pred, element = {op} | set(value.split()), in_pool
                else:
                    out = json.dumps({"op": op.lower(), "ref": target, "value": val})
                    pred, element = set((val or "").split()), in_pool
                f1 = _hand_f1(pred, label) if in_pool else 0.0
                scores.append((element and in_pool, f1))
                tr = env.step(out)
                rows.append({"episode_id": game.game_id, "step": t, "correct": tr.meta["correct"],
                             "valid": tr.meta["error"] is None, "element_correct": tr.meta["element_correct"],
                             "op_f1": tr.meta["op_f1"]})  # fmt: skip
                admissible = tr.admissible
            episodes.append({"episode_id": game.game_id, "split": split, "won": tr.won, "status": "ok"})
            expected[game.game_id] = len(raw["actions"])
            hand.setdefault(split, []).append(scores)
    assert any(not r["valid"] and r["op_f1"] > 0 for r in rows)  # unparsed outputs score their tokens
    metrics = m2w.mind2web_metrics(episodes, rows, expected)
    hand["overall"] = [task for split in EVAL_SPLITS for task in hand[split]]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for split, tasks in hand.items():
        steps = [s for task in tasks for s in task]
        success = [el and f1 == 1.0 for el, f1 in steps]
        got = metrics[split]["metric_py"]
        assert (got["element_accuracy"]["correct"], got["element_accuracy"]["n"]) == (
            sum(el for el, _ in steps), len(steps))  # fmt: skip
        assert got["operation_f1"]["mean"] == pytest.approx(mean([f1 for _, f1 in steps]), abs=1e-12)
        assert (got["step_success"]["correct"], got["step_success"]["n"]) == (sum(success), len(steps))
        whole = sum(all(el and f1 == 1.0 for el, f1 in task) for task in tasks)
        assert (got["task_success"]["correct"], got["task_success"]["n"]) == (whole, len(tasks))
        assert got["macro_element_accuracy"] == pytest.approx(mean([mean([float(e) for e, _ in t]) for t in tasks]))
        assert got["macro_operation_f1"] == pytest.approx(mean([mean([f for _, f in t]) for t in tasks]))
        assert got["macro_step_success"] == pytest.approx(
            mean([mean([float(e and f == 1.0) for e, f in t]) for t in tasks]))  # fmt: skip
    o = metrics["overall"]["metric_py"]
    assert 0 < o["step_success"]["correct"] < o["element_accuracy"]["correct"] < o["element_accuracy"]["n"]


def test_every_figure_is_named_by_its_rule(tmp_path: Path) -> None:
    """Issue 41 item 3: each figure printed in the Mind2Web reports says whose rule it is (the
    paper's or MindAct's metric.py), the rules are printed with them and written in the JSON."""
    metrics = m2w.mind2web_metrics(OFFICIAL_EPISODES, OFFICIAL_ROWS, {"a": 2, "b": 3, "c": 4, "d": 1})
    md = m2w.metrics_markdown(metrics, MINDACT_POOL)
    headers = [line for line in md.splitlines() if line.startswith("| split |")]
    assert len(headers) == 2
    figures = [c.strip() for h in headers for c in h.strip("|").split("|")][1:]
    named = [c for c in figures if c.startswith(("paper ", "MindAct "))]
    assert set(figures) - set(named) == {"split", "invalid predictions (paper's parser)", "failed episodes"}
    for rule in m2w.RULES.values():
        assert rule in md
    results = [_result(e["episode_id"], e["split"], e["won"], e["steps"]) for e in OFFICIAL_EPISODES]
    m2w.write_summary(
        tmp_path, [{"condition": "base", "failed_episodes": 0, "mind2web": metrics}], {"base": results},
        {"base": OFFICIAL_ROWS}, {"a": 2, "b": 3, "c": 4, "d": 1}, candidate_pool=MINDACT_POOL,
    )  # fmt: skip
    summary = (tmp_path / "mind2web.md").read_text()
    for caption in ("Paper step accuracy %", "Paper episode success %", "MindAct element accuracy / MindAct op F1"):
        assert caption in summary
    assert "MindAct step SR / MindAct task SR" in summary and m2w.RULES["task_success"] in summary
    assert json.loads((tmp_path / "mind2web.json").read_text())["rules"] == m2w.RULES
