"""Evaluation reports on hand-built episodes and step rows with known answers (paper
appendix C "Common controlled protocol", "Long-Horizon Behavior", C.6 view-selection
distributions)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from memprism_ray.eval import report as rpt
from memprism_ray.view_space import NUM_ACTIONS, ViewAction

A = ViewAction("TemporalTrace", "recent_long", "all", "medium")
B = ViewAction("EntityState", "all", "exception", "fine")


def _ep(eid: str, task: str, won: bool, steps: int, status: str = "ok", error: str = "reset: Injected: down") -> dict:
    error = None if status == "ok" else error
    return {"episode_id": eid, "game_id": f"g-{eid}", "task_type": task, "split": "eval", "won": won,
            "reward": float(won), "steps": steps, "status": status, "error": error}  # fmt: skip


EPISODES = [
    _ep("e1", "pick_and_place_simple", True, 4),
    _ep("e2", "pick_and_place_simple", False, 50),
    _ep("e3", "pick_clean_then_place_in_recep", True, 12),
    _ep("e4", "pick_clean_then_place_in_recep", True, 27),
    _ep("e5", "pick_heat_then_place_in_recep", False, 50),
    _ep("e6", "pick_heat_then_place_in_recep", True, 3, status="failed"),  # counted as a failure
    _ep("e7", "look_at_obj_in_light", True, 5),
]


def _row(step: int, view: ViewAction | None, medium: str, *, tokens: float, visual: int = 0, pixels: int = 0,
         compose: float = 0.0, render: float = 0.0, cached: bool = False, policy: float = 1.0,
         valid: bool = True) -> dict:  # fmt: skip
    return {
        "episode_id": "e1", "step": step, "view_index": -1 if view is None else view.index,
        "view_medium": medium, "prompt_tokens": tokens, "visual_tokens": visual, "pixels": pixels,
        "compose_ms": compose, "render_ms": render, "view_cached": cached, "policy_latency_ms": policy,
        "valid": valid,
    }  # fmt: skip


# Ten decisions at steps 0..9 with prompt tokens 0, 10, ..., 90.
ROWS = [
    _row(0, A, "optical", tokens=0, visual=100, pixels=1000, compose=1.0, render=3.0, policy=2.0),
    _row(1, A, "optical", tokens=10, visual=200, pixels=2000, compose=1.0, render=5.0, policy=4.0),
    _row(2, A, "optical", tokens=20, visual=300, pixels=3000, compose=1.0, render=7.0, cached=True, policy=6.0),
    _row(3, B, "text", tokens=30, compose=2.0, render=10.0, policy=8.0, valid=False),
    _row(4, None, "none", tokens=40, policy=10.0),
    _row(5, None, "none", tokens=50, policy=12.0),
    _row(6, None, "none", tokens=60, policy=14.0, valid=False),
    _row(7, None, "none", tokens=70, policy=16.0),
    _row(8, None, "none", tokens=80, policy=18.0),
    _row(9, None, "none", tokens=90, policy=20.0),
]


@pytest.fixture(scope="module")
def agent_report() -> dict:
    return rpt.condition_report("fixed:TemporalTrace", EPISODES, ROWS, tokenizer="words", stored_bytes=1234)


def test_success_count_denominator_and_wilson(agent_report: dict) -> None:
    r = agent_report
    # The failed episode stays in the denominator as a failure (issue 10), though it "won".
    assert (r["successes"], r["n"], r["failed_episodes"]) == (4, 7, 1)
    assert r["sr"] == pytest.approx(4 / 7)
    assert r["wilson95"] == pytest.approx([0.2505, 0.8418], abs=5e-4)  # Wilson 95% for 4/7
    assert r["failure_reasons"] == {"reset": 1}
    assert r["failed"] == [{"episode_id": "e6", "error": "reset: Injected: down"}]


def test_per_task_type_success(agent_report: dict) -> None:
    per = agent_report["per_task_type"]
    assert list(per) == sorted(per)
    assert {t: (v["successes"], v["n"]) for t, v in per.items()} == {
        "look_at_obj_in_light": (1, 1),
        "pick_and_place_simple": (1, 2),
        "pick_clean_then_place_in_recep": (2, 2),
        "pick_heat_then_place_in_recep": (0, 2),  # the failed episode is a failure
    }
    assert per["pick_and_place_simple"]["sr"] == 0.5
    assert per["pick_and_place_simple"]["wilson95"] == pytest.approx([0.0945, 0.9055], abs=5e-4)
    assert per["pick_heat_then_place_in_recep"]["wilson95"] == pytest.approx([0.0, 0.6576], abs=5e-4)


def test_sr_and_tokens_by_length_threshold(agent_report: dict) -> None:
    by = {b["threshold"]: b for b in agent_report["by_length"]}
    assert list(by) == [5, 10, 15, 20, 25, 30, 35, 40, 45, 50]
    # Won within at most L steps, over all 7 episodes (cumulative, ends at the final SR).
    wins = {5: 2, 10: 2, 15: 3, 20: 3, 25: 3, 30: 4, 35: 4, 40: 4, 45: 4, 50: 4}
    assert {L: round(b["sr"] * 7) for L, b in by.items()} == wins
    assert by[50]["sr"] == agent_report["sr"]
    # Mean prompt tokens of decisions 1..L (zero-based steps < L).
    assert by[5]["prompt_tokens_mean"] == pytest.approx(20.0)
    assert by[10]["prompt_tokens_mean"] == pytest.approx(45.0)
    assert by[50]["prompt_tokens_mean"] == pytest.approx(45.0)


def test_thresholds_end_at_the_step_limit() -> None:
    eps = [_ep("a", "t", True, 12), _ep("b", "t", False, 12)]
    rows = [_row(s, None, "none", tokens=s) for s in range(12)]
    rep = rpt.condition_report("c", eps, rows, tokenizer="words", max_steps=12)
    assert [b["threshold"] for b in rep["by_length"]] == [5, 10, 12]
    assert [b["sr"] for b in rep["by_length"]] == [0.0, 0.0, 0.5]
    short = rpt.condition_report("c", eps, rows, tokenizer="words", max_steps=3)
    assert [b["threshold"] for b in short["by_length"]] == [3]


def test_efficiency(agent_report: dict) -> None:
    e = agent_report["efficiency"]
    assert e["tokenizer"] == "words" and e["decisions"] == 10 and e["stored_bytes"] == 1234
    assert e["prompt_tokens_mean"] == pytest.approx(45.0) and e["prompt_tokens_max"] == 90
    assert e["visual_tokens_mean"] == pytest.approx(60.0)
    assert e["pixels_mean"] == pytest.approx(2000.0)  # optical decisions only
    assert e["compose_render_ms_mean"] == pytest.approx((4 + 6 + 8 + 12) / 4)  # decisions with a view
    assert e["compose_render_ms_p50_uncached"] == pytest.approx(6.0)  # 4, 6, 12 (the cached one is out)
    assert e["policy_ms_mean"] == pytest.approx(11.0)
    assert e["invalid_actions"] == 2 and e["invalid_action_rate"] == pytest.approx(0.2)
    assert e["mean_steps"] == pytest.approx((4 + 50 + 12 + 27 + 50 + 5) / 6)


def test_view_marginals(agent_report: dict) -> None:
    vs = agent_report["view_selection"]
    assert vs["decisions_with_view"] == 4
    assert vs["tau"] == {"TemporalTrace": 75.0, "ActionEffect": 0.0, "EntityState": 25.0, "DependencyChain": 0.0}
    assert vs["gamma"] == {"coarse": 0.0, "medium": 75.0, "fine": 25.0}
    assert len(vs["window_filter"]) == 12 and sum(vs["window_filter"].values()) == pytest.approx(100.0)
    assert vs["window_filter"]["recent_long / all"] == 75.0 and vs["window_filter"]["all / exception"] == 25.0
    joint = np.asarray(vs["view_marginal"])
    assert joint.shape == (NUM_ACTIONS,) and joint.sum() == pytest.approx(1.0)
    assert joint[A.index] == 0.75 and joint[B.index] == 0.25


def test_empty_and_all_failed_runs() -> None:
    failed = [_ep("a", "t", False, 0, status="failed")]
    rep = rpt.condition_report("c", failed, [], tokenizer="words")
    assert (rep["successes"], rep["n"], rep["sr"], rep["failed_episodes"]) == (0, 1, 0.0, 1)
    assert rep["wilson95"] == pytest.approx([0.0, 0.7935], abs=5e-4)  # one failure, not "no information"
    empty = rpt.condition_report("c", [], [], tokenizer="words")
    assert (empty["n"], empty["wilson95"]) == (0, [0.0, 1.0])  # no information, not certainty
    assert rep["efficiency"]["prompt_tokens_mean"] is None and rep["efficiency"]["invalid_action_rate"] == 0.0
    assert rep["view_selection"]["view_marginal"] == [0.0] * NUM_ACTIONS
    rpt.condition_markdown(rep)  # renders without numbers to show


def test_paired_comparison_sign_and_pairing() -> None:
    a = {"e1": False, "e2": False, "e3": True, "only_a": True}
    b = {"e1": True, "e2": True, "e3": True, "only_b": False}
    up = rpt.paired_comparison(a, b, n_boot=2000, seed=1)
    assert up["n_common"] == 3 and up["diff"] == pytest.approx(2 / 3)  # SR(b) - SR(a)
    assert up["ci95"][0] <= up["diff"] <= up["ci95"][1] and up["ci95"][1] <= 1.0
    down = rpt.paired_comparison(b, a, n_boot=2000, seed=1)
    assert down["diff"] == pytest.approx(-2 / 3)
    assert down["ci95"] == pytest.approx([-up["ci95"][1], -up["ci95"][0]])
    assert rpt.paired_comparison(a, b, n_boot=2000, seed=1) == up  # seeded
    same = rpt.paired_comparison(a, a, n_boot=500)
    assert same["diff"] == 0.0 and same["ci95"] == [0.0, 0.0]
    assert rpt.paired_comparison({"x": True}, {"y": True}) == {"diff": None, "ci95": None, "n_common": 0}


def test_markdown_reports(agent_report: dict) -> None:
    md = rpt.condition_markdown(agent_report)
    assert md.startswith("# Evaluation: fixed:TemporalTrace")
    assert "**4 / 7** = 57.14%" in md and "Wilson 95% [25.0, 84.2]" in md
    assert "failed episodes (counted as failures): 1 (1 reset)" in md
    assert "Failed episodes:\n\n- `e6`: reset: Injected: down" in md
    assert "| pick_clean_then_place_in_recep | 2 | 2 | 100.0 |" in md
    assert "| 30 | 57.1 | 45.0 |" in md and "| 5 | 28.6 | 20.0 |" in md
    assert "| invalid actions | 2 (20.00%) |" in md and "| TemporalTrace | 75.00 |" in md
    other = dict(agent_report, condition="no_memory", successes=1, sr=1 / 7, failed_episodes=0, failed=[])
    cmp = {"no_memory": rpt.paired_comparison({"e1": True}, {"e1": False}, n_boot=100)}
    summary = rpt.summary_markdown([agent_report, other], cmp, base="fixed:TemporalTrace")
    lines = summary.splitlines()
    assert "diff vs fixed:TemporalTrace" in lines[2]
    base_row = next(line for line in lines if line.startswith("| fixed:TemporalTrace |"))
    assert base_row.endswith("| - |") and "| 4 / 7 | 57.1 | [25.0, 84.2] | 1 |" in base_row
    assert "- fixed:TemporalTrace: 1 of 7 (1 reset); see its report.md" in lines
    assert not any(line.startswith("- no_memory") for line in lines)
    other_row = next(line for line in lines if line.startswith("| no_memory |"))
    assert "-100.0 [-100.0, -100.0]" in other_row
    none = rpt.summary_markdown([agent_report, other], {"no_memory": {"diff": None, "ci95": None, "n_common": 0}},
                                base="fixed:TemporalTrace")  # fmt: skip
    assert "no common episodes" in none


def test_failure_reasons_and_message() -> None:
    eps = [_ep("a", "t", True, 3), _ep("b", "t", False, 0, "failed", "broken game: game.tw-pddl is not valid JSON"),
           _ep("c", "t", False, 0, "failed", "broken game: traj_data.json unreadable"),
           _ep("d", "t", False, 2, "failed", "policy: ResultCountError: task policy returned 1 result(s)"),
           _ep("e", "t", False, 0, "failed", None)]  # fmt: skip
    rep = rpt.condition_report("c", eps, [], tokenizer="words")
    assert rep["failure_reasons"] == {"broken game": 2, "policy": 1, "unknown": 1}
    assert (rep["successes"], rep["n"]) == (1, 5)
    ok = rpt.condition_report("ok", eps[:1], [], tokenizer="words")
    assert rpt.failure_message({"conditions": [ok]}) is None
    assert rpt.failure_message({"conditions": [ok, rep]}) == (
        "4 episode(s) failed and count as failures: c: 4 of 5 (2 broken game, 1 policy, 1 unknown)"
    )
    many = rpt.condition_report("m", [_ep(f"x{i}", "t", False, 0, "failed") for i in range(25)], [], tokenizer="w")
    md = rpt.condition_markdown(many)
    assert md.count("- `x") == 20 and "... and 5 more (report.json, episodes.parquet)" in md


def test_plots_are_written(agent_report: dict, tmp_path: Path) -> None:
    paths = rpt.plot_condition(agent_report, tmp_path)
    assert [p.name for p in paths] == ["sr_tokens_by_length.png", "view_marginals.png"]
    for p in paths:
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size[0] > 300
    no_view = rpt.condition_report("no_memory", EPISODES, ROWS[4:], tokenizer="words")
    out = tmp_path / "nv"
    out.mkdir()
    assert [p.name for p in rpt.plot_condition(no_view, out)] == ["sr_tokens_by_length.png"]


def test_write_json_handles_numpy_actions_and_paths(tmp_path: Path) -> None:
    data = {"a": np.float32(0.5), "b": np.int64(3), "c": np.arange(3), "d": A, "e": tmp_path}
    rpt.write_json(tmp_path / "r.json", data)
    back = json.loads((tmp_path / "r.json").read_text())
    assert back == {"a": 0.5, "b": 3, "c": [0, 1, 2], "d": A.to_dict(), "e": str(tmp_path)}
    with pytest.raises(TypeError, match="set"):
        rpt.write_json(tmp_path / "bad.json", {"x": {1, 2}})


def test_the_step_curve_counts_the_steps_the_limit_counts() -> None:
    """Issue 35: an EB-ALFRED episode won on its 30th simulator step after 9 invalid outputs took
    39 decisions; the curve's last point (the 30-step limit) still counts it, so the curve ends
    at the final SR. Episodes recorded before env_steps existed are read by their decisions."""
    from memprism_ray.eval.report import condition_report

    won_late = {"episode_id": "a", "won": True, "status": "ok", "steps": 39, "env_steps": 30, "task_type": "base"}
    old = {"episode_id": "b", "won": True, "status": "ok", "steps": 12, "task_type": "base"}
    lost = {"episode_id": "c", "won": False, "status": "ok", "steps": 30, "env_steps": 30, "task_type": "base"}
    rep = condition_report("memprism", [won_late, old, lost], [], tokenizer="words", max_steps=30)
    curve = {p["threshold"]: p["sr"] for p in rep["by_length"]}
    assert curve[30] == rep["sr"] == 2 / 3
    assert curve[20] == 1 / 3  # the late win is not within 20 steps; the old record's 12 decisions are


def test_an_unreadable_progress_record_is_said_not_skipped(tmp_path: Path) -> None:
    """A continued evaluation whose ``progress.json`` could not be read played every condition
    again without a word; now a line names the file and why."""
    from memprism_ray.eval.report import PROGRESS, read_progress, write_progress

    said: list[str] = []
    assert read_progress(tmp_path, said.append) == {} and said == []  # none recorded: nothing to say
    write_progress(tmp_path, {"no_memory": {"sr": 0.5}})
    assert read_progress(tmp_path, said.append) == {"no_memory": {"sr": 0.5}} and said == []
    (tmp_path / PROGRESS).write_text('{"reports": {"no_mem')
    assert read_progress(tmp_path, said.append) == {}
    assert said == [
        f"eval: {tmp_path / PROGRESS} unreadable (JSONDecodeError: Unterminated string starting at: line 1 column 14 "
        "(char 13)): the conditions it recorded are played again"
    ]


def test_an_llm_phi_falling_back_to_the_rules_is_counted_and_said() -> None:
    """The step rows' ``phi_fallback`` (an LLM Phi's failed extraction, recorded by the rules)
    was nowhere in a report: an evaluation whose Phi endpoint failed read as an LLM-Phi one."""
    from memprism_ray.trainer.evaluate import phi_fallback_note

    episodes = [{"episode_id": "e", "task_type": "t", "won": False, "steps": 3, "status": "ok"}]
    rows = [
        {"step": s, "view_index": -1, "view_medium": "none", "prompt_tokens": 1, "visual_tokens": 0, "pixels": 0,
         "compose_ms": 0.0, "render_ms": 0.0, "policy_latency_ms": 0.0, "valid": True, "phi_fallback": why}
        for s, why in enumerate([None, "request failed: LLMUnavailable: down\nmore", "invalid answer: x"])
    ]  # fmt: skip
    rep = rpt.condition_report("c", episodes, rows, tokenizer="words")
    assert rep["efficiency"]["phi_fallbacks"] == 2
    assert (
        "| Phi extractions by the rules after an LLM failure | 2 (first: request failed: LLMUnavailable: down) |"
        in (rpt.condition_markdown(rep))
    )
    assert phi_fallback_note(rep) == (
        "; 2 Phi extraction(s) by the rules after an LLM failure (first: request failed: LLMUnavailable: down)"
    )
    quiet = rpt.condition_report("c", episodes, [{**r, "phi_fallback": None} for r in rows], tokenizer="words")
    assert phi_fallback_note(quiet) == "" and "Phi extractions" not in rpt.condition_markdown(quiet)
