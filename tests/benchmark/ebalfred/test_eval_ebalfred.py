"""The EB-ALFRED report: per-subset SR with Wilson intervals and the average SR."""

from __future__ import annotations

import pytest

from memprism_ray.benchmark.ebalfred.report import report_markdown, subset_report
from memprism_ray.eval.stats import wilson_interval


def _ep(eid: str, game: str, won: bool, progress: float = 0.0, status: str = "ok") -> dict:
    return {
        "episode_id": eid,
        "game_id": game,
        "won": won,
        "progress": progress,
        "reward": won + 0.2 * progress,
        "status": status,
    }


def test_per_subset_and_average_sr() -> None:
    eps = [
        _ep("a", "base/0", True, 1.0),
        _ep("b", "base/1", False, 0.5),
        _ep("c", "base/2", True, 1.0),
        _ep("d", "long_horizon/0", False, 0.0),
        _ep("e", "long_horizon/1", True, 1.0),
        _ep("f", "spatial/0", True, 1.0, status="failed"),  # crashed: a failure, still counted
    ]
    rep = subset_report(eps)
    assert list(rep["subsets"]) == ["base", "spatial", "long_horizon"]  # the paper's order
    base = rep["subsets"]["base"]
    assert (base["successes"], base["n"], base["sr"]) == (2, 3, pytest.approx(2 / 3))
    assert (base["wilson_low"], base["wilson_high"]) == pytest.approx(wilson_interval(2, 3))
    assert base["mean_progress"] == pytest.approx(2.5 / 3)
    assert base["mean_reward"] == pytest.approx((1.2 + 0.1 + 1.2) / 3)
    assert rep["subsets"]["spatial"]["successes"] == 0
    assert rep["average_sr"] == pytest.approx((2 / 3 + 0.0 + 0.5) / 3)  # mean of subset SRs
    assert (rep["pooled"]["successes"], rep["pooled"]["n"]) == (3, 6)
    assert rep["failed_episodes"] == ["f"]


def test_markdown() -> None:
    rep = subset_report([_ep("a", "base/0", True, 1.0), _ep("b", "visual_appearance/0", False, 0.5)])
    md = report_markdown(rep, "memprism")
    assert "| Condition | Base | Visual | Avg |" in md
    assert "| memprism | 100.0 | 0.0 | 50.0 |" in md


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        subset_report([])
    with pytest.raises(ValueError, match="appears twice"):
        subset_report([_ep("a", "base/0", True), _ep("a", "base/1", True)])
    with pytest.raises(ValueError, match="valid subsets"):
        subset_report([_ep("a", "unseen/0", True)])


def test_decisions_and_invalid_actions_per_subset() -> None:
    """Issue 41 item 2: per subset, the decisions by what the env did with them and the invalid
    actions as EmbodiedBench's evaluator counts them (summed, and per episode)."""
    a = _ep("a", "base/0", True) | {"rejected": 2, "executed_outside_list": 1, "executed": 7, "invalid_actions": 4}
    b = _ep("b", "base/1", False) | {"rejected": 0, "executed_outside_list": 3, "executed": 27, "invalid_actions": 5}
    rep = subset_report([a, b, _ep("c", "spatial/0", False)])
    base = rep["subsets"]["base"]
    assert base["decisions"] == {"rejected": 2, "executed_outside_list": 4, "executed": 34, "invalid_actions": 9}
    assert base["mean_invalid_actions"] == pytest.approx(4.5)
    assert rep["subsets"]["spatial"]["decisions"]["invalid_actions"] == 0
    md = report_markdown(rep)
    assert "| Base | 2 | 4 | 34 | 9 | 4.50 |" in md and "| Spatial | 0 | 0 | 0 | 0 | 0.00 |" in md
