"""D1 end to end: a recorded reference trajectory -> decision states -> counterfactual labels
-> Router features -> Parquet -> SFT; the trained Router prefers the view the policy needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from memprism_ray.adapter.sft import (
    NoDecisionLabelled,
    SFTConfig,
    SFTDataset,
    SFTTrainer,
    label_decisions,
    train_sft,
)
from memprism_ray.recorder import EventStream, RawEvent, StateDelta
from memprism_ray.router.encoder import HashingEncoder
from memprism_ray.router.features import FeatureExtractor
from memprism_ray.router.model import RouterConfig, ViewPolicyModel, factor_marginals
from memprism_ray.router.teacher import (
    CounterfactualConfig,
    CounterfactualTeacher,
    DecisionState,
    TeacherResponseError,
    decision_states,
)
from memprism_ray.view_space import ViewAction

TINY = RouterConfig(d_model=32, n_heads=4, n_layers=1, ff_dim=64, planner_hidden=64, entity_hint_dim=8)


def expert_stream() -> EventStream:
    s = EventStream({"goal": "put a clean mug in cabinet", "task_id": "t1"})
    steps = [
        ("go to countertop 1", "countertop 1", [("agent.location", "countertop 1")], False),
        ("take mug 1 from countertop 1", "mug 1", [("agent.holding", "mug 1")], False),
        ("go to sinkbasin 1", "sinkbasin 1", [("agent.location", "sinkbasin 1")], False),
        ("clean mug 1 with sinkbasin 1", "mug 1", [("mug 1.state", "clean")], False),
        ("go to cabinet 1", "cabinet 1", [("agent.location", "cabinet 1")], False),
        ("open cabinet 1", "cabinet 1", [], True),
        ("open cabinet 1", "cabinet 1", [("cabinet 1.state", "open")], False),
        ("put mug 1 in/on cabinet 1", "mug 1", [("mug 1.location", "cabinet 1")], False),
    ]
    for i, (action, entity, delta, failed) in enumerate(steps):
        s.record(
            RawEvent(f"Step {i}: you look around near {entity}.", action, "OK"),
            entity=entity,
            act=action.split()[0],
            delta=[StateDelta(k, v) for k, v in delta],
            failed=failed,
        )
    return s


def needs_entity_state(state: DecisionState, view: ViewAction) -> str:
    """A frozen policy stand-in: it reproduces the expert only from a full-history EntityState view."""
    if view.tau == "EntityState" and view.window == "all":
        return state.reference_action if isinstance(state.reference_action, str) else "?"
    return "look"


def test_decision_states_follow_the_stream() -> None:
    s = expert_stream()
    states = decision_states(s)
    assert len(states) == 8 and states[0].history == () and states[3].history == s.records[:3]
    assert states[3].observation == s[3].raw.o_pre and states[3].reference_action == s[3].raw.action
    assert states[3].sample_id == "t1#4" and states[3].goal == "put a clean mug in cabinet"
    with pytest.raises(ValueError, match="goal"):
        decision_states(EventStream())


def test_counterfactual_labels_train_the_router(tmp_path: Path) -> None:
    states = decision_states(expert_stream())
    teacher = CounterfactualTeacher(needs_entity_state, CounterfactualConfig(cost_temperature=0.2))
    failing = {3}

    def label(state: DecisionState):
        if state.step in failing:
            raise TeacherResponseError("endpoint down")
        return teacher.label(state, state.reference_action)

    data, counts = label_decisions(states, FeatureExtractor(HashingEncoder()), label, batch_size=3, meta={"t": 1})
    assert counts == {"decisions": 8, "labelled": 7, "teacher_error": 1, "fallback_skipped": 0}
    assert "t1#3" not in data.sample_ids and data.meta["t"] == 1
    good = [a.index for a in map(ViewAction.from_index, range(144)) if a.tau == "EntityState" and a.window == "all"]
    np.testing.assert_allclose(data.q[:, good].sum(1), 1.0, rtol=1e-5)
    pq.write_table(data.to_arrow(), tmp_path / "d1.parquet")
    data = SFTDataset.read_parquet(tmp_path / "d1.parquet")

    torch.manual_seed(0)
    model = ViewPolicyModel(TINY)
    config = SFTConfig(epochs=30, lr=1e-2, batch_size=8, lambda_cost=0.02)
    train_sft(model, data, config, trainer=SFTTrainer(model, data, config))
    with torch.no_grad():
        marg = factor_marginals(model.eval()(*data.features.to_tensors()))
    assert (marg["tau"][:, 2] > 0.8).all(), marg["tau"]  # EntityState
    assert (marg["window"][:, 2] > 0.8).all(), marg["window"]  # all


def test_fallback_labels_are_skipped_unless_kept() -> None:
    states = decision_states(expert_stream())[:2]
    teacher = CounterfactualTeacher(lambda s, v: "look", CounterfactualConfig(candidates=(0, 1, 2)))
    fx = FeatureExtractor(HashingEncoder())
    with pytest.raises(NoDecisionLabelled, match="no decision could be labelled") as none:
        label_decisions(states, fx, lambda s: teacher.label(s, s.reference_action))
    assert none.value.counts == {"decisions": 2, "labelled": 0, "teacher_error": 0, "fallback_skipped": 2}
    data, counts = label_decisions(states, fx, lambda s: teacher.label(s, s.reference_action), keep_fallback=True)
    assert counts["labelled"] == 2 and len(data) == 2


def test_d1_data_records_each_decisions_own_structural_cost(tmp_path: Path) -> None:
    # eq. sft-loss: C^_t(a) is the cost at decision t; with one event recorded every window
    # covers the same event, later the full window covers more than the short one.
    from memprism_ray.view_space import decision_cost_vector

    states = decision_states(expert_stream())
    teacher = CounterfactualTeacher(needs_entity_state, CounterfactualConfig(cost_temperature=0.2))
    fx = FeatureExtractor(HashingEncoder())
    data, _ = label_decisions(states, fx, lambda s: teacher.label(s, s.reference_action))
    by_id = {sid: i for i, sid in enumerate(data.sample_ids)}
    for st in states:
        want = decision_cost_vector([r.event.outcome for r in st.history])
        np.testing.assert_allclose(data.cost[by_id[st.sample_id]], want, rtol=0, atol=1e-7)
    short = ViewAction("TemporalTrace", "recent_short", "all", "coarse").index
    full = ViewAction("TemporalTrace", "all", "all", "coarse").index
    first, last = data.cost[by_id[states[1].sample_id]], data.cost[by_id[states[-1].sample_id]]
    assert first[short] == first[full]
    assert last[full] > last[short]
    pq.write_table(data.to_arrow(), tmp_path / "d1.parquet")
    back = SFTDataset.read_parquet(tmp_path / "d1.parquet")
    np.testing.assert_array_equal(back.cost, data.cost)
    np.testing.assert_array_equal(back.subset([2, 0]).cost, data.cost[[2, 0]])


def two_situation_policy(state: DecisionState, view: ViewAction) -> str:
    """Two situations need two different views: moving (``go``/``open``) needs where things
    are (EntityState over all history); handling an object (``take``/``clean``/``put``) needs
    what the last actions did (TemporalTrace, recent_short). Anything else: a wrong action."""
    ref = state.reference_action if isinstance(state.reference_action, str) else "?"
    moving = ref.split()[0] in ("go", "open")
    if moving and view.tau == "EntityState" and view.window == "all":
        return ref
    if not moving and view.tau == "TemporalTrace" and view.window == "recent_short":
        return ref
    return "look"


def test_router_marginal_is_not_one_hot_when_two_views_are_right_in_different_situations() -> None:
    """Issue 11: after D1 the greedy Router picks EntityState when moving and TemporalTrace
    when handling objects, so its view marginal over the decisions is not one-hot. Decisions
    where every view gives the reference action carry no label (uninformative, skipped): the
    old teacher (T_c = 0.1, every view matching) labelled them with the cost prior alone,
    one cheapest view, which is what collapsed the Router."""
    from memprism_ray.eval.report import marginal_entropy

    states = decision_states(expert_stream())
    teacher = CounterfactualTeacher(two_situation_policy)
    fx = FeatureExtractor(HashingEncoder())
    data, counts = label_decisions(states, fx, lambda s: teacher.label(s, s.reference_action))
    assert counts["labelled"] == 8 and counts["fallback_skipped"] == 0
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY)
    config = SFTConfig(epochs=40, lr=1e-2, batch_size=8, lambda_cost=0.02)
    train_sft(model, data, config, trainer=SFTTrainer(model, data, config))
    with torch.no_grad():
        chosen = model.eval()(*data.features.to_tensors()).argmax(-1).tolist()
    taus = [ViewAction.from_index(i).tau for i in chosen]
    moving = [s.reference_action.split()[0] in ("go", "open") for s in states]
    assert all(t == "EntityState" for t, m in zip(taus, moving, strict=True) if m), taus
    assert all(t == "TemporalTrace" for t, m in zip(taus, moving, strict=True) if not m), taus
    counts_by_view = np.bincount(chosen, minlength=144)
    assert marginal_entropy(counts_by_view) > 0.5

    # Every view agrees: the new teacher marks the state uninformative; the old rule gives
    # the cost prior's cheapest view nearly all the mass.
    agree = CounterfactualTeacher(lambda s, v: s.reference_action)
    lab = agree.label(states[0], states[0].reference_action)
    assert lab.stats["uninformative"] and lab.stats["fallback"]
    old = CounterfactualTeacher(
        lambda s, v: s.reference_action, CounterfactualConfig(cost_temperature=0.1, rule="proportional", min_spread=0)
    ).label(states[0], states[0].reference_action)
    cheapest = old.distribution.reshape(-1)
    assert not old.stats["fallback"] and marginal_entropy(cheapest) < marginal_entropy(np.ones(144)) - 1.0
