"""D1 SFT: the loss, learning a synthetic teacher, the cost term, schedule, presets and the
Parquet dataset."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from memprism_ray.adapter.sft import SFTConfig, SFTDataset, SFTTrainer, cosine_factor, sft_loss, train_sft
from memprism_ray.benchmark import sft_preset
from memprism_ray.router.features import RouterFeatures
from memprism_ray.router.model import RouterConfig, ViewPolicyModel
from memprism_ray.router.teacher import TeacherLabel
from memprism_ray.view_space import cost_vector

TINY = RouterConfig(d_model=32, n_heads=4, n_layers=1, ff_dim=64, planner_hidden=64, entity_hint_dim=8)


def synthetic(n: int = 96, seed: int = 0, sharp: float = 3.0) -> SFTDataset:
    """A teacher whose q depends on the features through a fixed random map."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 384)).astype(np.float32)
    goal = rng.normal(size=(n, 384)).astype(np.float32)
    window = rng.random((n, 128)).astype(np.float32)
    stats = rng.random((n, 8)).astype(np.float32)
    w = rng.normal(size=(384, 144)) / math.sqrt(384)
    logits = sharp * obs @ w
    q = np.exp(logits - logits.max(1, keepdims=True))
    q /= q.sum(1, keepdims=True)
    return SFTDataset(obs, goal, window, stats, q, [f"s{i}" for i in range(n)], {"teacher": "synthetic"})


def test_sft_loss_matches_formula() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 144, generator=g)
    q = torch.softmax(torch.randn(4, 144, generator=g) * 3, -1)
    q[0] = 0.0
    q[0, 5] = 1.0  # zero entries: 0 log 0 = 0
    cost = torch.tensor(cost_vector())
    loss, parts = sft_loss(logits, q, cost, 0.5)
    p = torch.softmax(logits.double(), -1)
    qd = q.double()
    kl = [sum(float(qd[i, a] * math.log(qd[i, a] / p[i, a])) for a in range(144) if qd[i, a] > 0) for i in range(4)]
    ec = [float((p[i] * cost.double()).sum()) for i in range(4)]
    assert loss.item() == pytest.approx(np.mean(kl) + 0.5 * np.mean(ec), rel=1e-5)
    assert parts["kl"].item() == pytest.approx(np.mean(kl), rel=1e-5)
    assert math.isfinite(loss.item())


def test_sft_learns_a_synthetic_teacher() -> None:
    data = synthetic(n=64)
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY)
    config = SFTConfig(epochs=12, lr=1e-2, batch_size=32, lambda_cost=0.0)
    trainer = SFTTrainer(model, data, config)
    start = trainer.evaluate()
    hint = [p.detach().clone() for p in model.frozen_parameters()]
    enc = [p.detach().clone() for p in model.parameter_groups()["encoder"]]
    seen: list[float] = []
    result = train_sft(model, data, config, trainer=trainer, on_epoch=lambda tr, m: seen.append(m["loss"]))
    end = trainer.evaluate()
    assert result["epochs"] == 12 and result["steps"] == 12 * 2 and len(seen) == 12
    assert end["kl"] < 0.8 * start["kl"], (start, end)
    assert all(b < a for a, b in itertools.pairwise(seen)), seen  # every epoch improves
    assert all(torch.equal(a, b) for a, b in zip(hint, model.frozen_parameters(), strict=False))
    assert any(not torch.equal(a, b) for a, b in zip(enc, model.parameter_groups()["encoder"], strict=False))


def test_cost_term_pushes_mass_to_cheap_views() -> None:
    data = synthetic(n=64, sharp=0.0)  # uniform teacher: only the cost term can break ties
    costs = {}
    for lam in (0.0, 2.0):
        torch.manual_seed(1)
        model = ViewPolicyModel(TINY)
        trainer = SFTTrainer(model, data, SFTConfig(epochs=6, lr=3e-3, batch_size=32, lambda_cost=lam))
        train_sft(model, data, trainer.config, trainer=trainer)
        costs[lam] = trainer.evaluate()["cost"]
    assert costs[2.0] < costs[0.0] - 0.05, costs


def test_cosine_schedule_reaches_min_ratio() -> None:
    assert cosine_factor(0, 10, 0.01) == 1.0
    assert cosine_factor(5, 10, 0.01) == pytest.approx(0.505)
    assert cosine_factor(10, 10, 0.01) == pytest.approx(0.01)
    data = synthetic(n=40)
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY)
    trainer = SFTTrainer(model, data, SFTConfig(epochs=3, lr=1e-3, batch_size=16))
    train_sft(model, data, trainer.config, trainer=trainer)
    assert trainer.step == trainer.total_steps == 9
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-5)


def test_presets_follow_table_a4() -> None:
    for name, (epochs, lam, bf16) in {
        "alfworld": (50, 0.02, True),
        "alfred": (20, 0.0, False),
        "mind2web": (50, 0.02, True),
    }.items():
        c = sft_preset(name)
        assert (c.epochs, c.lambda_cost, c.bf16, c.preset_name) == (epochs, lam, bf16, name)
        assert (c.lr, c.weight_decay, c.batch_size, c.grad_norm, c.seed) == (1e-4, 0.01, 256, 1.0, 7)
        assert (c.schedule, c.min_lr_ratio) == ("cosine", 0.01)
    assert sft_preset("alfred", epochs=2).epochs == 2
    with pytest.raises(ValueError, match="unknown SFT preset"):
        sft_preset("webarena")
    with pytest.raises(ValueError, match="schedule"):
        SFTConfig(schedule="linear")


def test_dataset_parquet_roundtrip_and_validation(tmp_path: Path) -> None:
    data = synthetic(n=5)
    path = tmp_path / "d1.parquet"
    import pyarrow.parquet as pq

    pq.write_table(data.to_arrow(), path)  # as D1 writes labels.parquet
    schema = pq.read_schema(path)
    import pyarrow as pa

    for name, width in (("q", 144), ("stats", 8), ("obs", 384)):
        t = schema.field(name).type
        assert pa.types.is_fixed_size_list(t) and t.list_size == width and t.value_type == pa.float32()
    back = SFTDataset.read_parquet(path)
    for name in ("obs", "goal", "window", "stats", "q"):
        np.testing.assert_array_equal(getattr(back, name), getattr(data, name))
    assert back.sample_ids == data.sample_ids and back.meta == {"teacher": "synthetic"}
    bad_q = data.q.copy()
    bad_q[2] *= 0.5
    with pytest.raises(ValueError, match="q row 2 sums to"):
        SFTDataset(data.obs, data.goal, data.window, data.stats, bad_q)
    with pytest.raises(ValueError, match="window must have shape"):
        SFTDataset(data.obs, data.goal, data.window[:, :9], data.stats, data.q)
    with pytest.raises(ValueError, match="not a memprism-sft-dataset"):
        SFTDataset.from_arrow(pq.read_table(path).replace_schema_metadata({}))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match=r"junk\.parquet: cannot read as Parquet"):
        SFTDataset.read_parquet(tmp_path / "junk.parquet")


def test_dataset_from_examples_and_subset() -> None:
    rng = np.random.default_rng(1)
    q = np.zeros(144)
    q[[4, 9]] = [0.25, 0.75]
    examples = [
        (RouterFeatures(rng.normal(size=384), rng.normal(size=384), rng.random(128), rng.random(8)), TeacherLabel(q))
        for _ in range(3)
    ]
    data = SFTDataset.from_examples(examples, sample_ids=["a", "b", "c"])
    assert len(data) == 3 and data.q[1, 9] == pytest.approx(0.75)
    sub = data.subset([2, 0])
    assert sub.sample_ids == ["c", "a"]
    np.testing.assert_array_equal(sub.obs[0], data.obs[2])


def test_sft_loss_takes_a_cost_per_decision() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 144, generator=g)
    q = torch.softmax(torch.randn(3, 144, generator=g), -1)
    rows = torch.rand(3, 144, generator=g)
    loss, parts = sft_loss(logits, q, rows, 1.0)
    p = torch.softmax(logits.double(), -1)
    assert parts["cost"].item() == pytest.approx(float((p * rows.double()).sum(-1).mean()), rel=1e-5)
    same, _ = sft_loss(logits, q, rows[0], 1.0)  # one vector for every row differs from per-row costs
    assert not math.isclose(loss.item(), same.item(), rel_tol=1e-4)


def test_dataset_cost_defaults_to_the_fixed_cost_and_is_validated() -> None:
    data = synthetic(n=4)
    np.testing.assert_allclose(data.cost, np.tile(np.asarray(cost_vector(), np.float32), (4, 1)))
    with pytest.raises(ValueError, match=r"SFTDataset.cost must have shape \[4, 144\]"):
        SFTDataset(data.obs, data.goal, data.window, data.stats, data.q, cost=np.zeros((3, 144)))
    with pytest.raises(ValueError, match="finite and >= 0"):
        SFTDataset(data.obs, data.goal, data.window, data.stats, data.q, cost=-np.ones((4, 144)))
