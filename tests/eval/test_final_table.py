"""The final evaluation table of a training run (issue 11, item 3): every condition on the
same episodes against the trained Router, the fixed views' spread, the Router's view
marginal entropy; and the training-success plot."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from memprism_ray.eval.report import final_table_markdown, marginal_entropy, plot_training_success, view_marginals
from memprism_ray.view_space import NUM_ACTIONS, ViewAction

CONDITIONS = [
    "memprism", "freq_random", "no_memory", "full_history", "recent4",
    "fixed:TemporalTrace", "fixed:ActionEffect", "fixed:EntityState", "fixed:DependencyChain",
]  # fmt: skip
N = 40


def _wins(sr: float, seed: int) -> dict[str, bool]:
    rng = np.random.default_rng(seed)
    return {f"ep{i}": bool(rng.random() < sr) for i in range(N)}


def _report(name: str, wins: dict[str, bool], marginal: list[float]) -> dict:
    k = sum(wins.values())
    return {
        "condition": name,
        "successes": k,
        "n": N,
        "sr": k / N,
        "wilson95": [0.1, 0.9],
        "efficiency": {"prompt_tokens_mean": 100.0, "visual_tokens_mean": 50.0, "mean_steps": 20.0,
                       "tokenizer": "all-MiniLM-L6-v2 WordPiece (bert-base-uncased vocab) [fallback: x]"},
        "view_selection": {"decisions_with_view": 10, "view_marginal": marginal},
    }  # fmt: skip


def test_final_table_has_every_condition_paired_differences_and_entropy() -> None:
    wins = {c: _wins(0.3 + 0.05 * i, i) for i, c in enumerate(CONDITIONS)}
    wins["fixed:TemporalTrace"] = {k: True for k in wins["memprism"]}
    wins["fixed:DependencyChain"] = {k: False for k in wins["memprism"]}
    marginal = [0.0] * NUM_ACTIONS
    marginal[3], marginal[50], marginal[100] = 0.5, 0.25, 0.25
    reports = [_report(c, wins[c], marginal if c == "memprism" else [0.0] * NUM_ACTIONS) for c in CONDITIONS]
    table, figs = final_table_markdown(reports, wins, n_boot=500)
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| condition")]
    assert [r.split(" | ")[0][2:] for r in rows] == CONDITIONS
    assert set(figs["vs_router"]) == set(CONDITIONS) - {"memprism"}
    c = figs["vs_router"]["fixed:DependencyChain"]
    router_sr = sum(wins["memprism"].values()) / N
    assert c["diff"] == pytest.approx(router_sr) and c["ci95"][0] > 0 and c["n_common"] == N
    spread = figs["fixed_spread"]
    assert spread["best"] == "fixed:TemporalTrace" and spread["worst"] == "fixed:DependencyChain"
    assert spread["diff"] == pytest.approx(1.0) and spread["ci95"] == [1.0, 1.0]
    assert figs["router_entropy_nats"] == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    assert figs["router_distinct_views"] == 3
    assert "entropy 1.04 nats" in table and "fallback" in table
    with pytest.raises(ValueError, match="memprism"):
        final_table_markdown(reports[1:], wins)


def test_marginal_entropy_and_view_marginals() -> None:
    assert marginal_entropy([0, 0, 7]) == 0.0 and marginal_entropy([]) == 0.0
    assert marginal_entropy(np.ones(NUM_ACTIONS)) == pytest.approx(math.log(NUM_ACTIONS))
    rows = [{"view_index": ViewAction.from_index(i % 2).index} for i in range(10)] + [{"view_index": -1}]
    vm = view_marginals(rows)
    assert vm["decisions_with_view"] == 10 and vm["entropy_nats"] == pytest.approx(math.log(2))


def test_training_plot_is_a_png(tmp_path: Path) -> None:
    its = [{"step": i + 1, "success_rate": 0.1 * i, "zero_std_group_frac": 0.5} for i in range(6)]
    path = plot_training_success(its, tmp_path / "training_success.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The replayed spans are shaded: the same curve with grpo.replay_first draws another image.
    shaded = plot_training_success(its, tmp_path / "replayed.png", replay_first=2)
    assert shaded.read_bytes() != path.read_bytes()
