"""ViewPolicyModel (A.2): shapes, parameter counts, groups and marginals (view selection: test_router_sampling.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from memprism_ray.router.model import (
    RouterConfig,
    ViewPolicyModel,
    factor_marginals,
    parameter_group_of,
    sinusoidal_positions,
)
from memprism_ray.view_space import ALL_ACTIONS, FILTERS, GAMMAS, TAUS, WINDOWS

TINY = RouterConfig(d_model=32, n_heads=4, n_layers=1, ff_dim=64, planner_hidden=64, entity_hint_dim=8)


def inputs(b: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, d, generator=g) for d in (384, 384, 128, 8))


def linear(i: int, o: int) -> int:
    return i * o + o


def test_parameter_counts_match_appendix_a2() -> None:
    torch.manual_seed(0)
    model = ViewPolicyModel()
    d, ff, h = 512, 1024, 1024
    layer = linear(d, 3 * d) + linear(d, d) + linear(d, ff) + linear(ff, d) + 2 * 2 * d
    encoder = (
        2 * linear(384, d)
        + linear(128, d)
        + linear(8, d)  # four projections
        + d  # [CLS]
        + 4 * layer  # four pre-norm layers
        + 2 * linear(d, d)
        + 2 * d  # 512-512-512 MLP + LayerNorm
    )
    planner = 3 * (2 * d + linear(d, h) + linear(h, d)) + 2 * d + linear(d, 144)
    counts = model.parameter_counts()
    assert counts == {
        "encoder": encoder,
        "planner": planner,
        "entity_hint": linear(d, 64),
        "total": encoder + planner + linear(d, 64),
    }
    layers = model.transformer.layers
    assert len(layers) == 4
    assert all(layer.norm_first and layer.self_attn.num_heads == 8 for layer in layers)
    assert all(
        layer.activation is torch.nn.functional.gelu or isinstance(layer.activation, nn.GELU) for layer in layers
    )
    assert all(layer.linear1.out_features == 1024 and layer.dropout.p == 0.1 for layer in layers)


def test_parameter_groups_partition_and_frozen_head() -> None:
    model = ViewPolicyModel(TINY)
    groups = model.parameter_groups()
    assert set(groups) == {"encoder", "planner"}
    ids = [id(p) for g in groups.values() for p in g] + [id(p) for p in model.frozen_parameters()]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert not any(p.requires_grad for p in model.frozen_parameters())
    for name, _ in model.named_parameters():
        group = parameter_group_of(name)
        owner = {id(p): g for g, ps in groups.items() for p in ps}
        param = dict(model.named_parameters())[name]
        assert owner.get(id(param), "entity_hint") == group
    # D1 gradients reach every encoder and planner tensor, never the hint head
    model(*inputs(3)).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for g in groups.values() for p in g)
    assert all(p.grad is None for p in model.frozen_parameters())


def test_forward_shapes_and_input_errors() -> None:
    model = ViewPolicyModel(TINY).eval()
    logits = model(*inputs(5))
    assert logits.shape == (5, 144)
    z = model.encode(*inputs(5))
    assert z.shape == (5, 32)
    torch.testing.assert_close(model.planner_logits(z), logits)
    assert model.entity_hint(z).shape == (5, 8)
    obs, goal, window, stats = inputs(2)
    with pytest.raises(ValueError, match="window must be"):
        model(obs, goal, window[:, :100], stats)
    with pytest.raises(ValueError, match="shared B"):
        model(obs, goal[:1], window, stats)


def test_config_rejects_bad_combinations() -> None:
    with pytest.raises(ValueError, match="divisible"):
        RouterConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="144"):
        RouterConfig(num_actions=143)
    with pytest.raises(ValueError, match="dropout"):
        RouterConfig(dropout=1.0)
    with pytest.raises(ValueError, match="unknown RouterConfig"):
        RouterConfig.from_dict({"d_model": 64, "width": 3})


def test_sinusoidal_positions_and_cls_matter() -> None:
    pe = sinusoidal_positions(5, 8)
    assert pe[0, 0] == 0 and pe[0, 1] == 1
    assert pe[1, 0].item() == pytest.approx(math.sin(1.0)) and pe[1, 1].item() == pytest.approx(math.cos(1.0))
    assert pe[3, 2].item() == pytest.approx(math.sin(3 / 10000 ** (2 / 8)))
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY).eval()
    x = inputs(2)
    before = model(*x)
    with torch.no_grad():
        model.cls.add_(1.0)
    assert not torch.allclose(before, model(*x))


def test_dropout_only_in_train_mode_and_set_mode() -> None:
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY)
    x = inputs(4)
    model.eval()
    torch.testing.assert_close(model(*x), model(*x))
    model.set_mode(encoder_train=False, planner_train=True)
    assert not model.transformer.training and model.planner.training and model.joint_head.training
    z = model.encode(*x)
    assert not torch.equal(model.planner_logits(z), model.planner_logits(z))  # planner dropout is live
    model.set_mode(encoder_train=False, planner_train=False)
    torch.testing.assert_close(model.planner_logits(z), model.planner_logits(z))


def test_factor_marginals_against_brute_force() -> None:
    logits = torch.randn(3, 144, generator=torch.Generator().manual_seed(1))
    marg = factor_marginals(logits)
    p = torch.softmax(logits.double(), -1)
    for factor, options in (("tau", TAUS), ("window", WINDOWS), ("filter", FILTERS), ("gamma", GAMMAS)):
        expected = torch.zeros(3, len(options), dtype=torch.float64)
        for a in ALL_ACTIONS:
            expected[:, options.index(getattr(a, factor))] += p[:, a.index]
        torch.testing.assert_close(marg[factor].double(), expected, atol=1e-6, rtol=1e-5)
    wf = torch.zeros(3, 12, dtype=torch.float64)
    for a in ALL_ACTIONS:
        wf[:, WINDOWS.index(a.window) * 4 + FILTERS.index(a.filter)] += p[:, a.index]
    torch.testing.assert_close(marg["window_filter"].double(), wf, atol=1e-6, rtol=1e-5)
