"""View selectors of every evaluation condition (paper "Experiment Setup" baselines and
"Where Does the Gain Come From?"): text-history baselines, fixed views at the paper's
fixed scope, Frequency-Matched Random, the Router (greedy / sampled) and the constrained
planners."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from memprism_ray.baselines import (
    CONDITIONS_HELP,
    FULL_HISTORY,
    DecisionContext,
    FixedView,
    FrequencyMatchedRandom,
    RouterSelector,
    TextHistory,
    ViewDecision,
    make_selector,
)
from memprism_ray.baselines.conditions import factor_mask, load_marginal
from memprism_ray.router.features import RouterFeatures
from memprism_ray.router.model import RouterConfig, ViewPolicyModel
from memprism_ray.view_space import ALL_ACTIONS, FACTORS, NUM_ACTIONS, TAUS, ViewAction

VALID_NAMES = (
    "no_memory", "full_history", "recent4", "fixed:", "fixed_text:", "memprism", "freq_random", "constrained:",
)  # fmt: skip


def _ctx(n: int, episode: str = "ep", goal: str = "put a mug in cabinet") -> list[DecisionContext]:
    return [DecisionContext(episode, step, goal, f"obs {step}", "pick_and_place_simple") for step in range(n)]


def _features(batch: int, seed: int = 0) -> RouterFeatures:
    rng = np.random.default_rng(seed)
    return RouterFeatures(
        obs=rng.standard_normal((batch, 384)).astype(np.float32),
        goal=rng.standard_normal((batch, 384)).astype(np.float32),
        window=rng.standard_normal((batch, 128)).astype(np.float32),
        stats=rng.random((batch, 8)).astype(np.float32),
    )


@pytest.fixture(scope="module")
def agent_router() -> ViewPolicyModel:
    torch.manual_seed(0)
    cfg = RouterConfig(d_model=32, n_heads=2, n_layers=1, ff_dim=64, planner_blocks=1, planner_hidden=64)
    return ViewPolicyModel(cfg)


class FixedLogits(torch.nn.Module):
    """A stand-in Router whose logits are the same known vector for every decision."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(logits.clone(), requires_grad=False)

    def forward(self, obs: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(obs.shape[0], -1)


# --------------------------------------------------------------------------- text history


@pytest.mark.parametrize(
    ("condition", "history"),
    [("no_memory", 0), ("full_history", FULL_HISTORY), ("recent4", 4), ("recent:7", 7), ("recent:1", 1)],
)
def test_text_history_conditions_show_no_view(condition: str, history: int) -> None:
    sel = make_selector(condition)
    assert isinstance(sel, TextHistory) and not sel.uses_features
    decisions = sel.select(_ctx(5), None)
    assert len(decisions) == 5
    for d in decisions:
        assert d.action is None and d.medium == "none" and d.history == history
        assert d.index == -1 and d.logprob == 0.0


@pytest.mark.parametrize("bad", ["recent:0", "recent:x", "recent:-2"])
def test_recent_k_needs_a_positive_k(bad: str) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        make_selector(bad)


# --------------------------------------------------------------------------- fixed views


@pytest.mark.parametrize("tau", TAUS)
@pytest.mark.parametrize("kind", ["fixed", "fixed_text"])
def test_fixed_views_use_the_papers_fixed_scope(tau: str, kind: str) -> None:
    sel = make_selector(f"{kind}:{tau}")
    assert isinstance(sel, FixedView) and sel.name == f"{kind}:{tau}"
    decisions = sel.select(_ctx(4), None)
    want = ViewAction(tau, "recent_long", "all", "medium")
    for d in decisions:
        assert d.action == want and d.index == want.index
        assert d.medium == ("text" if kind == "fixed_text" else "optical")
        assert d.history is None  # the agent's default short history
        assert d.logprob == 0.0


def test_fixed_view_accepts_legacy_aliases_and_rejects_unknown_types() -> None:
    assert make_selector("fixed:timeline").select(_ctx(1), None)[0].action.tau == "TemporalTrace"
    assert make_selector("fixed:state_table").name == "fixed:EntityState"
    with pytest.raises(ValueError, match="TemporalTrace"):
        make_selector("fixed:Histogram")


def test_a_fixed_view_can_name_its_whole_scope() -> None:
    sel = make_selector("fixed:EntityState/all/state_update/coarse")
    assert sel.name == "fixed:EntityState/all/state_update/coarse"
    assert sel.select(_ctx(2), None)[0].action == ViewAction("EntityState", "all", "state_update", "coarse")
    assert make_selector("fixed_text:TemporalTrace/recent_short/all/fine").select(_ctx(1), None)[0].medium == "text"
    with pytest.raises(ValueError, match="TAU/WINDOW/FILTER/GAMMA"):
        make_selector("fixed:EntityState/all/coarse")
    with pytest.raises(ValueError, match="window"):
        make_selector("fixed:EntityState/forever/all/coarse")


# --------------------------------------------------------------------------- frequency-matched random


def test_frequency_matched_random_reproduces_its_marginal() -> None:
    support = {3: 0.5, 40: 0.3, 100: 0.15, 143: 0.05}
    marginal = np.zeros(NUM_ACTIONS)
    for i, p in support.items():
        marginal[i] = p
    sel = FrequencyMatchedRandom(marginal * 7.0, seed=3)  # unnormalised input is normalised
    n_episodes, n_steps = 400, 50
    counts: dict[int, int] = {}
    for e in range(n_episodes):
        for d in sel.select(_ctx(n_steps, episode=f"e{e}"), None):
            counts[d.index] = counts.get(d.index, 0) + 1
            assert math.isclose(d.logprob, math.log(support[d.index]), rel_tol=1e-9)
            assert d.medium == "optical" and d.history is None
    n = n_episodes * n_steps
    assert set(counts) <= set(support)  # zero-probability views are never drawn
    chi2 = sum((counts.get(i, 0) - n * p) ** 2 / (n * p) for i, p in support.items())
    assert chi2 < 16.27, (chi2, counts)  # df=3, p=0.001


def test_frequency_matched_random_ignores_context_and_batch_order() -> None:
    sel = FrequencyMatchedRandom(np.ones(NUM_ACTIONS), seed=1)
    a = sel.select(_ctx(30, episode="ep-7", goal="put a clean mug in cabinet"), None)
    other = [DecisionContext("ep-7", c.step, "heat some egg", "You arrive at fridge 1.", "heat") for c in _ctx(30)]
    b = sel.select(other, None)
    assert [d.action for d in a] == [d.action for d in b]
    rev = sel.select(list(reversed(_ctx(30, episode="ep-7"))), None)
    assert [d.action for d in reversed(rev)] == [d.action for d in a]
    assert len({d.index for d in a}) > 10  # the draws do vary across steps
    again = FrequencyMatchedRandom(np.ones(NUM_ACTIONS), seed=1).select(_ctx(30, episode="ep-7"), None)
    assert [d.action for d in again] == [d.action for d in a]
    other_seed = FrequencyMatchedRandom(np.ones(NUM_ACTIONS), seed=2).select(_ctx(30, episode="ep-7"), None)
    assert [d.action for d in other_seed] != [d.action for d in a]


@pytest.mark.parametrize(
    "marginal",
    [np.ones(143), np.zeros(NUM_ACTIONS), np.full(NUM_ACTIONS, -1.0), np.full(NUM_ACTIONS, np.nan)],
)
def test_frequency_matched_random_rejects_bad_marginals(marginal: np.ndarray) -> None:
    with pytest.raises(ValueError, match="marginal"):
        FrequencyMatchedRandom(marginal)


def test_load_marginal_sources(tmp_path: Path) -> None:
    p = np.arange(NUM_ACTIONS, dtype=float)
    assert np.array_equal(load_marginal(list(p)), p)
    (tmp_path / "list.json").write_text(json.dumps(list(p)))
    assert np.array_equal(load_marginal(tmp_path / "list.json"), p)
    run = tmp_path / "eval_dir"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"condition": "memprism", "view_marginal": list(p)}))
    assert np.array_equal(load_marginal(run), p)
    assert np.array_equal(load_marginal(str(run / "report.json")), p)
    (tmp_path / "bad.json").write_text(json.dumps({"sr": 0.5}))
    with pytest.raises(ValueError, match="view_marginal"):
        load_marginal(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="does not exist"):
        load_marginal(tmp_path / "missing")
    for name, content, problem in [
        ("short.json", "[0.5, 0.5]", "needs 144 probabilities"),
        ("nested.json", json.dumps([[0.1] * NUM_ACTIONS]), "flat JSON list of numbers"),
        ("objects.json", json.dumps({"view_marginal": [{"a": 1}] * NUM_ACTIONS}), "flat JSON list of numbers"),
        ("text.json", "not json", "not valid JSON"),
    ]:
        (tmp_path / name).write_text(content)
        with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / name))}: .*{problem}"):
            load_marginal(tmp_path / name)
    with pytest.raises(ValueError, match="needs 144 probabilities"):
        load_marginal(np.ones((2, NUM_ACTIONS // 2)).tolist()[0])
    with pytest.raises(ValueError, match="flat JSON list of numbers"):
        load_marginal(np.ones((2, NUM_ACTIONS)))


def test_freq_random_condition_reads_an_evaluation_report(tmp_path: Path) -> None:
    from memprism_ray.eval.report import condition_report, write_json

    episodes = [{"episode_id": "e", "task_type": "t", "won": True, "steps": 2, "status": "ok"}]
    rows = [
        {"step": s, "view_index": 17, "view_medium": "optical", "prompt_tokens": 1, "visual_tokens": 1, "pixels": 1,
         "compose_ms": 0.0, "render_ms": 0.0, "policy_latency_ms": 0.0, "valid": True}
        for s in range(2)
    ]  # fmt: skip
    write_json(tmp_path / "report.json", condition_report("memprism", episodes, rows, tokenizer="words"))
    sel = make_selector("freq_random", marginal=tmp_path, seed=0)
    assert {d.index for d in sel.select(_ctx(20), None)} == {17}
    with pytest.raises(ValueError, match="needs a marginal"):
        make_selector("freq_random")


def test_a_whole_evaluation_gives_its_memprism_marginal(tmp_path: Path) -> None:
    """``--eval.marginal`` naming an evaluation's ``summary.json`` or ``--out`` folder was refused
    ("no 'view_marginal' entry ... run memprism eval first") though it held the memprism marginal."""
    p = np.arange(NUM_ACTIONS, dtype=float)
    out = tmp_path / "eval"
    out.mkdir()
    conditions = [{"condition": "no_memory", "view_selection": {"view_marginal": [1.0] * NUM_ACTIONS}},
                  {"condition": "memprism", "view_selection": {"view_marginal": list(p)}}]  # fmt: skip
    (out / "summary.json").write_text(json.dumps({"base": "no_memory", "conditions": conditions}))
    assert np.array_equal(load_marginal(out / "summary.json"), p)
    assert np.array_equal(load_marginal(out), p)
    (out / "summary.json").write_text(json.dumps({"conditions": conditions[:1]}))
    with pytest.raises(ValueError, match=r"an evaluation without the memprism condition; name the report\.json"):
        load_marginal(out)


# --------------------------------------------------------------------------- Router


def test_router_greedy_is_the_argmax(agent_router: ViewPolicyModel) -> None:
    feats = _features(6)
    sel = make_selector("memprism", router=agent_router)
    assert isinstance(sel, RouterSelector) and sel.uses_features
    decisions = sel.select(_ctx(6), feats)
    agent_router.eval()
    with torch.no_grad():
        logits = agent_router(*feats.to_tensors())
    logp = torch.log_softmax(logits, dim=-1)
    assert [d.index for d in decisions] == logits.argmax(dim=-1).tolist()
    for d, row in zip(decisions, logp, strict=False):
        assert d.medium == "optical" and d.logprob == pytest.approx(float(row[d.index]), abs=1e-5)
    assert make_selector("memprism_text", router=agent_router).select(_ctx(6), feats)[0].medium == "text"


def test_router_selection_restores_training_mode(agent_router: ViewPolicyModel) -> None:
    agent_router.train()
    first = RouterSelector(agent_router).select(_ctx(3), _features(3))
    assert agent_router.training  # eval() only for the decision
    second = RouterSelector(agent_router).select(_ctx(3), _features(3))
    assert [d.index for d in first] == [d.index for d in second]  # no dropout at decision time
    agent_router.eval()


def test_router_sampling_log_probs_and_frequencies() -> None:
    logits = torch.full((NUM_ACTIONS,), -30.0)
    logits[[5, 60, 99]] = torch.tensor([2.0, 1.0, 0.0])
    temperature = 0.7
    sel = RouterSelector(FixedLogits(logits), greedy=False, temperature=temperature, seed=11)
    probs = torch.softmax(logits / temperature, dim=-1)
    counts = {5: 0, 60: 0, 99: 0}
    n = 0
    for _ in range(40):
        for d in sel.select(_ctx(100), _features(100)):
            assert d.index in counts
            assert d.logprob == pytest.approx(math.log(float(probs[d.index])), abs=1e-5)
            counts[d.index] += 1
            n += 1
    chi2 = sum((c - n * float(probs[i])) ** 2 / (n * float(probs[i])) for i, c in counts.items())
    assert chi2 < 13.82, (chi2, counts)  # df=2, p=0.001
    # Seeded: the same seed replays the same draws; reseed restarts them.
    a = RouterSelector(FixedLogits(logits), greedy=False, temperature=temperature, seed=11)
    b = RouterSelector(FixedLogits(logits), greedy=False, temperature=temperature, seed=11)
    draws_a = [d.index for d in a.select(_ctx(50), _features(50))]
    assert draws_a == [d.index for d in b.select(_ctx(50), _features(50))]
    a.reseed(11)
    assert draws_a == [d.index for d in a.select(_ctx(50), _features(50))]


def test_router_needs_features_and_a_checkpoint(agent_router: ViewPolicyModel) -> None:
    with pytest.raises(ValueError, match="features"):
        RouterSelector(agent_router).select(_ctx(1), None)
    with pytest.raises(ValueError, match="checkpoint"):
        make_selector("memprism")
    with pytest.raises(ValueError, match="temperature"):
        RouterSelector(agent_router, temperature=0.0)


# --------------------------------------------------------------------------- constrained planners


@pytest.mark.parametrize(
    ("factor", "value", "canonical"),
    [("gamma", "fine", "fine"), ("tau", "TemporalTrace", "TemporalTrace"), ("tau", "timeline", "TemporalTrace"),
     ("window", "recent_long", "recent_long"), ("filter", "all", "all")],
)  # fmt: skip
def test_factor_masks_select_exactly_one_value(factor: str, value: str, canonical: str) -> None:
    mask = factor_mask(factor, value)
    n_values = {"tau": 4, "window": 3, "filter": 4, "gamma": 3}[factor]
    assert mask.shape == (NUM_ACTIONS,) and int(mask.sum()) == NUM_ACTIONS // n_values
    assert all((getattr(a, factor) == canonical) == bool(m) for a, m in zip(ALL_ACTIONS, mask, strict=False))


def test_constrained_planner_keeps_the_fixed_factor(agent_router: ViewPolicyModel) -> None:
    feats = _features(16, seed=4)
    agent_router.eval()
    with torch.no_grad():
        raw = agent_router(*feats.to_tensors()).float()
    for spec, factor, value in [("gamma=fine", "gamma", "fine"), ("tau=EntityState", "tau", "EntityState")]:
        mask = torch.as_tensor(factor_mask(factor, value))
        restricted = raw.masked_fill(~mask, float("-inf"))
        # The log-prob is under the restricted distribution (renormalised over the mask).
        logz = torch.logsumexp(restricted, dim=-1)
        greedy = make_selector(f"constrained:{spec}", router=agent_router)
        assert greedy.name == f"constrained:{spec}"
        decisions = greedy.select(_ctx(16), feats)
        assert [d.index for d in decisions] == restricted.argmax(-1).tolist()
        sampled = make_selector(f"constrained:{spec}", router=agent_router, greedy=False, seed=2)
        for d_list in (decisions, sampled.select(_ctx(16), feats)):
            for row, d in enumerate(d_list):
                assert getattr(d.action, factor) == value
                assert d.logprob == pytest.approx(float(raw[row, d.index] - logz[row]), abs=1e-4)
    # The other three factors remain the Router's choice: the constrained planner is not a fixed view.
    chosen = make_selector("constrained:gamma=fine", router=agent_router).select(_ctx(16), feats)
    free = raw.argmax(-1).tolist()
    for d, f in zip(chosen, free, strict=False):
        if ALL_ACTIONS[f].gamma == "fine":
            assert d.index == f


@pytest.mark.parametrize(
    ("spec", "message"),
    [("constrained:gamma", "FACTOR=VALUE"), ("constrained:size=big", "valid factors"),
     ("constrained:gamma=huge", "coarse")],
)  # fmt: skip
def test_constrained_spec_errors(agent_router: ViewPolicyModel, spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_selector(spec, router=agent_router)


# --------------------------------------------------------------------------- names and decisions


def test_unknown_condition_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError) as info:
        make_selector("fixd:EntityState")
    msg = str(info.value)
    assert "fixd:EntityState" in msg
    for name in VALID_NAMES:
        assert name in msg
    assert msg.endswith(CONDITIONS_HELP)


def test_view_decision_invariants() -> None:
    a = ALL_ACTIONS[10]
    assert ViewDecision(a, "optical").index == 10
    with pytest.raises(ValueError, match="medium"):
        ViewDecision(a, "hologram")
    with pytest.raises(ValueError, match="exactly when"):
        ViewDecision(None, "optical")
    with pytest.raises(ValueError, match="exactly when"):
        ViewDecision(a, "none")
    with pytest.raises(ValueError, match="history"):
        ViewDecision(None, "none", history=-2)
    assert set(FACTORS) == {"tau", "window", "filter", "gamma"}
