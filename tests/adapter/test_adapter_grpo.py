"""D2 grouped GRPO: the advantage rule, the loss against an independent implementation of the
paper's equations, the step table read into a batch, the update (planner-only updates, failed
trajectories) and presets."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from memprism_ray.adapter.grpo_update import (
    GRPOBatch,
    GRPOConfig,
    GRPOUpdater,
    group_advantages,
    group_summary,
    grpo_loss,
)
from memprism_ray.agent import rows_to_arrow
from memprism_ray.benchmark import grpo_preset
from memprism_ray.router.model import RouterConfig, ViewPolicyModel
from memprism_ray.router.sampling import sample_views

TINY = RouterConfig(d_model=32, n_heads=4, n_layers=1, ff_dim=64, planner_hidden=64, entity_hint_dim=8)


# --- advantages ---------------------------------------------------------------------------
def test_group_advantages_rule() -> None:
    returns = [1, 0, 1, 0, 1, 1, 1, 1, 0, 99, 1, 0, 0, 5, 0.0, 1e-7]
    groups = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 5, 5]
    failed = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    eps = 1e-6
    adv = group_advantages(returns, groups, failed, eps)
    assert adv.dtype == torch.float32 and adv.shape == (16,)
    np.testing.assert_allclose(adv[:4], [0.5 / (0.5 + eps), -0.5 / (0.5 + eps)] * 2, rtol=1e-6)
    assert (adv[4:7] == 0).all()  # zero std
    np.testing.assert_allclose(adv[7:9], [1.0, -1.0], rtol=1e-5)  # the failed 99 is not a sibling
    assert adv[9] == 0  # failed
    # population std: returns (1, 0, 0) -> std sqrt(2/9); the sample std would give 1.1547
    pop = math.sqrt(2 / 9)
    np.testing.assert_allclose(
        adv[10:13], [(2 / 3) / (pop + eps), (-1 / 3) / (pop + eps), (-1 / 3) / (pop + eps)], rtol=1e-6
    )
    assert adv[13] == 0  # a single trajectory
    assert (adv[14:] == 0).all()  # std 5e-8 <= eps
    summary = group_summary(returns, groups, failed, eps)
    assert summary["num_groups"] == 6 and summary["zero_std_group_frac"] == pytest.approx(3 / 6)


def test_group_advantages_all_failed_group_and_errors() -> None:
    adv = group_advantages([float("nan"), float("nan"), 1.0, 0.0], [7, 7, 8, 8], [True, True, False, False])
    assert adv.tolist()[:2] == [0.0, 0.0] and adv[2] > 0 > adv[3]
    summary = group_summary([float("nan"), float("nan"), 1.0, 0.0], [7, 7, 8, 8], [True, True, False, False])
    assert summary == {"num_groups": 1.0, "num_groups_all_failed": 1.0, "zero_std_group_frac": 0.0}
    with pytest.raises(ValueError, match="finite"):
        group_advantages([float("nan"), 1.0], [0, 0], [False, False])
    with pytest.raises(ValueError, match="lengths"):
        group_advantages([1.0, 0.0], [0], None)


# --- loss against an independent implementation ------------------------------------------------
def reference_loss(logits, actions, old_lp, adv, ref_logits, lo, hi, beta_kl, beta_h):
    """The paper's eq. grpo-loss written step by step in float64 from probabilities."""
    terms, kls, ents, clipped_active = [], [], [], 0
    for i in range(logits.shape[0]):
        p = torch.exp(logits[i]) / torch.exp(logits[i]).sum()
        pref = torch.exp(ref_logits[i]) / torch.exp(ref_logits[i]).sum()
        rho = p[actions[i]] / math.exp(old_lp[i])
        clipped = torch.clamp(rho, 1 - lo, 1 + hi)
        unclipped_term = rho * adv[i]
        clipped_term = clipped * adv[i]
        terms.append(torch.minimum(unclipped_term, clipped_term))
        clipped_active += int(clipped_term < unclipped_term)
        kls.append(sum(pref[a] * torch.log(pref[a] / p[a]) for a in range(144)))
        ents.append(-sum(p[a] * torch.log(p[a]) for a in range(144)))
    n = logits.shape[0]
    loss = -sum(terms) / n + beta_kl * sum(kls) / n - beta_h * sum(ents) / n
    return loss, clipped_active / n, sum(kls) / n, sum(ents) / n


@pytest.mark.parametrize("lo, hi", [(0.2, 0.2), (0.1, 0.15)])
def test_grpo_loss_matches_the_paper_equations(lo: float, hi: float) -> None:
    g = torch.Generator().manual_seed(3)
    n = 24
    logits = torch.randn(n, 144, generator=g, dtype=torch.float64)
    ref_logits = logits + 0.3 * torch.randn(n, 144, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 144, (n,), generator=g)
    true_lp = torch.log_softmax(logits, -1).gather(-1, actions[:, None]).squeeze(-1)
    # old log-probs that put ratios below, inside and above the clip range
    old_lp = true_lp + torch.linspace(-0.5, 0.5, n, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    ours_logits = logits.clone().requires_grad_(True)
    loss, stats = grpo_loss(
        ours_logits.float(),
        actions,
        old_lp.float(),
        adv.float(),
        ref_logits.float(),
        clip_eps_low=lo,
        clip_eps_high=hi,
        beta_kl=0.2,
        beta_entropy=0.003,
    )
    loss.backward()
    ref_in = logits.clone().requires_grad_(True)
    expected, clip_frac, kl, ent = reference_loss(ref_in, actions, old_lp.tolist(), adv, ref_logits, lo, hi, 0.2, 0.003)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    torch.testing.assert_close(ours_logits.grad, ref_in.grad, atol=1e-6, rtol=1e-4)
    assert stats["clip_frac"].item() == pytest.approx(clip_frac) and 0 < clip_frac < 1
    assert stats["kl"].item() == pytest.approx(kl.item(), rel=1e-5)
    assert stats["entropy"].item() == pytest.approx(ent.item(), rel=1e-5)


def test_grpo_loss_symmetric_default_and_no_ref() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 144, generator=g)
    actions = torch.randint(0, 144, (5,), generator=g)
    old = torch.log_softmax(logits, -1).gather(-1, actions[:, None]).squeeze(-1)
    adv = torch.randn(5, generator=g)
    loss, stats = grpo_loss(logits, actions, old, adv, None)
    # at the rollout policy every ratio is 1: the loss is -mean(A)
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert stats["clip_frac"].item() == 0 and stats["ratio_mean"].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="reference logits"):
        grpo_loss(logits, actions, old, adv, None, beta_kl=0.1)


# --- batches -----------------------------------------------------------------------------------
def make_batch(
    groups: int = 2, size: int = 4, steps: int = 3, seed: int = 0, failed: tuple[int, ...] = ()
) -> GRPOBatch:
    g = torch.Generator().manual_seed(seed)
    n_traj = groups * size
    s = n_traj * steps
    traj = torch.arange(n_traj).repeat_interleave(steps)
    rets = torch.randint(0, 2, (n_traj,), generator=g).float()
    fail = torch.zeros(n_traj, dtype=torch.bool)
    fail[list(failed)] = True
    return GRPOBatch(
        obs=torch.randn(s, 384, generator=g),
        goal=torch.randn(s, 384, generator=g),
        window=torch.rand(s, 128, generator=g),
        stats=torch.rand(s, 8, generator=g),
        action=torch.randint(0, 144, (s,), generator=g),
        old_logprob=-torch.rand(s, generator=g) * 5 - 0.1,
        traj_id=traj,
        group_id=traj // size,
        traj_return=rets[traj],
        failed=fail[traj],
    )


def step_rows(batch: GRPOBatch) -> list[list[dict]]:
    """``batch`` as the rollout workers' step rows (agent step rows plus the rollout's
    ``group_id``, ``traj_return`` and ``failed``), one list per group, string ids."""
    groups: dict[int, list[dict]] = {}
    for i in range(len(batch)):
        gid, tid = int(batch.group_id[i]), int(batch.traj_id[i])
        groups.setdefault(gid, []).append(
            {
                "episode_id": f"task-{gid}/traj-{tid}",
                "step": i,
                "view_index": int(batch.action[i]),
                "view_logprob": float(batch.old_logprob[i]),
                "action": "look",
                "group_id": f"task-{gid}",
                "traj_return": float(batch.traj_return[i]),
                "failed": bool(batch.failed[i]),
                **{f"feat_{name}": getattr(batch, name)[i].numpy() for name in ("obs", "goal", "window", "stats")},
            }
        )
    return list(groups.values())


def test_batch_validation_and_step_table_roundtrip() -> None:
    import pyarrow as pa

    batch = make_batch(failed=(1,))
    tables = [rows_to_arrow(rows) for rows in step_rows(batch)]
    back = GRPOBatch.from_step_tables([tables[0], None, pa.table({}), tables[1]])  # a group with no decisions
    for name in ("obs", "action", "old_logprob", "traj_id", "group_id", "traj_return", "failed"):
        assert torch.equal(getattr(back, name), getattr(batch, name)), name
    assert pa.types.is_fixed_size_list(tables[0].schema.field("feat_obs").type)
    assert tables[0].schema.field("feat_obs").type.list_size == 384
    assert back.trajectories()["traj_id"].numel() == 8  # string episode ids factorised
    with pytest.raises(ValueError, match="no decisions"):
        GRPOBatch.from_step_tables([None])
    narrow = tables[0].set_column(tables[0].column_names.index("feat_window"), "feat_window", tables[0]["feat_stats"])
    with pytest.raises(ValueError, match="feat_window' has width 8, expected 128"):
        GRPOBatch.from_step_tables([narrow])
    bad = make_batch()
    bad.traj_return[0] = 1 - bad.traj_return[0]
    with pytest.raises(ValueError, match="trajectory 0 disagree on traj_return"):
        bad.trajectories()
    with pytest.raises(ValueError, match="view indices"):
        GRPOBatch(**{**batch.__dict__, "action": batch.action + 144})
    with pytest.raises(ValueError, match="log-probabilities"):
        GRPOBatch(**{**batch.__dict__, "old_logprob": batch.old_logprob.abs()})
    with pytest.raises(ValueError, match="window must be"):
        GRPOBatch(**{**batch.__dict__, "window": batch.window[:, :10]})


# --- trainer ---------------------------------------------------------------------------------
def build(config: GRPOConfig, seed: int = 0) -> tuple[ViewPolicyModel, ViewPolicyModel, GRPOUpdater]:
    torch.manual_seed(seed)
    model = ViewPolicyModel(TINY)
    ref = copy.deepcopy(model)
    return model, ref, GRPOUpdater(model, ref, config)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_update_trains_planner_only_and_reports_stats() -> None:
    model, ref, trainer = build(GRPOConfig(lr=1e-3, update_batch_size=8))
    before, ref_before = snapshot(model), snapshot(ref)
    stats = trainer.update(make_batch(failed=(5,)))
    for key in ("loss", "kl", "entropy", "clip_frac", "zero_std_group_frac", "num_steps", "num_failed_excluded"):
        assert key in stats and math.isfinite(stats[key])
    assert stats["num_steps"] == 21 and stats["num_failed_excluded"] == 1 and stats["num_failed_steps_excluded"] == 3
    assert stats["num_minibatches"] == 3 and stats["iteration"] == 1
    after = snapshot(model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(("planner.", "planner_norm.", "joint_head.")) for k in changed)
    assert any(k.startswith("joint_head.") for k in changed) and any(k.startswith("planner.0") for k in changed)
    assert all(torch.equal(ref_before[k], v) for k, v in snapshot(ref).items())


def test_reference_reuses_the_frozen_encoders_z_only_while_the_encoders_are_equal(monkeypatch) -> None:
    batch = make_batch(seed=2)
    results = {}
    for path in ("shared", "full"):
        model, ref, trainer = build(GRPOConfig(lr=1e-3, update_batch_size=8, beta_kl=0.5), seed=3)
        with torch.no_grad():  # the model's planner has moved away from the reference's: KL > 0
            model.joint_head.weight.add_(0.05)
        assert trainer.ref_shares_encoder()
        if path == "full":
            monkeypatch.setattr(trainer, "ref_shares_encoder", lambda: False)
        results[path] = (trainer.update(batch), snapshot(model))
    (shared, w_shared), (full, w_full) = results["shared"], results["full"]
    assert shared["kl"] > 1e-4
    assert math.isclose(shared["kl"], full["kl"], rel_tol=1e-5)
    assert math.isclose(shared["loss"], full["loss"], rel_tol=1e-5)
    assert all(torch.allclose(w_shared[k], w_full[k], atol=1e-6) for k in w_shared)

    # A reference whose encoder differs (e.g. a D2 run resumed onto another D1) runs its own.
    _, ref, trainer = build(GRPOConfig(), seed=3)
    with torch.no_grad():
        ref.parameter_groups()["encoder"][1].add_(1e-3)
    assert not trainer.ref_shares_encoder()
    used = []
    monkeypatch.setattr(ref, "forward", lambda *x: used.append(len(x)) or ViewPolicyModel.forward(ref, *x))
    trainer.update(batch)
    assert used == [4]


def test_failed_trajectories_do_not_touch_the_update() -> None:
    batch = make_batch(seed=4, failed=(2, 6))
    # corrupt everything the failed trajectories carry
    mask = batch.failed
    batch.obs[mask] = 1e3
    batch.action[mask] = 0
    batch.traj_return[mask] = float("nan")
    keep = ~mask
    pruned = GRPOBatch(**{k: v[keep] for k, v in batch.__dict__.items()})
    model_a, _, trainer_a = build(GRPOConfig(lr=1e-3, update_batch_size=8), seed=1)
    stats_a = trainer_a.update(batch)
    model_b, _, trainer_b = build(GRPOConfig(lr=1e-3, update_batch_size=8), seed=1)
    stats_b = trainer_b.update(pruned)
    for k, v in model_a.state_dict().items():
        assert torch.equal(v, model_b.state_dict()[k]), k
    assert stats_a["loss"] == stats_b["loss"] and stats_a["num_failed_excluded"] == 2


def test_all_failed_iteration_makes_no_update() -> None:
    model, _, trainer = build(GRPOConfig())
    before = snapshot(model)
    stats = trainer.update(make_batch(groups=1, size=2, failed=(0, 1)))
    assert stats["num_steps"] == 0 and stats["num_minibatches"] == 0
    assert all(torch.equal(before[k], v) for k, v in snapshot(model).items())


def test_grpo_raises_the_probability_of_rewarded_views() -> None:
    config = GRPOConfig(lr=3e-3, beta_kl=0.0, beta_entropy=0.0, update_batch_size=64, planner_train_mode=False)
    model, _ref, trainer = build(config, seed=2)
    g = torch.Generator().manual_seed(0)
    obs, goal = torch.randn(1, 384, generator=g), torch.randn(1, 384, generator=g)
    window, stats = torch.rand(1, 128, generator=g), torch.rand(1, 8, generator=g)
    x = tuple(t.expand(64, -1) for t in (obs, goal, window, stats))
    target = 17  # rewarded: any view whose tau is TemporalTrace and window recent_short (indices 0..11) or 17

    def p_good() -> float:
        with torch.no_grad():
            p = torch.softmax(model.eval()(*(t[:1] for t in x)), -1)[0]
        return float(p[:12].sum() + p[target])

    start = p_good()
    for _ in range(12):
        with torch.no_grad():
            idx, lp = sample_views(model.eval()(*x), greedy=False, generator=g)
        reward = ((idx < 12) | (idx == target)).float()
        trainer.update(
            GRPOBatch(*x, idx, lp, torch.arange(64), torch.arange(64) // 16, reward, torch.zeros(64, dtype=torch.bool))
        )
    assert p_good() > start + 0.2, (start, p_good())


def test_config_presets_follow_table_a4() -> None:
    alf = grpo_preset("alfworld")
    assert (alf.lr, alf.weight_decay, alf.clip_eps, alf.beta_kl, alf.beta_entropy) == (3e-6, 0.0, 0.2, 0.2, 0.003)
    assert (alf.update_batch_size, alf.update_epochs, alf.grad_norm, alf.rollout_temperature) == (512, 1, 1.0, 1.0)
    assert (alf.iterations, alf.groups_per_iteration, alf.group_size) == (100, 8, 16)
    assert alf.eps_low == alf.eps_high == 0.2 and alf.lr_schedule == "constant"
    alfred = grpo_preset("alfred")
    assert (alfred.progress_reward_coef, alfred.beta_entropy, alfred.beta_kl) == (0.2, 0.0, 0.2)
    m2w = grpo_preset("mind2web", device="cpu")
    assert (m2w.lr, m2w.eps_low, m2w.eps_high, m2w.beta_kl, m2w.top_p) == (1e-6, 0.1, 0.15, 0.01, 0.85)
    assert (m2w.iterations, m2w.groups_per_iteration, m2w.group_size, m2w.reward) == (150, 8, 16, "action_correct")
    with pytest.raises(ValueError, match="both clip_eps_low and clip_eps_high"):
        GRPOConfig(clip_eps_low=0.1)
    for key in ("beta_kl", "beta_entropy", "weight_decay", "progress_reward_coef"):  # each passed its range check
        with pytest.raises(ValueError, match=f"GRPOConfig.{key} must be a finite number, got nan"):
            GRPOConfig(**{key: float("nan")})
    with pytest.raises(ValueError, match="unknown GRPO preset"):
        grpo_preset("webshop")
    with pytest.raises(ValueError, match="reference model"):
        GRPOUpdater(ViewPolicyModel(TINY), None, GRPOConfig())
