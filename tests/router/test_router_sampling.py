"""The one Router sampler (router/sampling.py; paper eqs. view-policy and greedy-view, Table A.4
rollout temperature and Mind2Web top-p): greedy, tempered and nucleus choices and their
untruncated tempered log-probs, the ``pi_old`` of the GRPO ratio."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from memprism_ray.router.features import RouterFeatures
from memprism_ray.router.model import RouterConfig, ViewPolicyModel
from memprism_ray.router.sampling import RouterSampler, nucleus

TINY = RouterConfig(d_model=32, n_heads=4, n_layers=1, ff_dim=64, planner_hidden=64, entity_hint_dim=8)


def inputs(b: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, d, generator=g) for d in (384, 384, 128, 8))


class FixedLogits(nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits.clone(), requires_grad=False)

    def forward(self, obs: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(obs.shape[0], -1)


def test_nucleus_keeps_the_smallest_top_set() -> None:
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.9, 0.03, 0.02]])
    kept = nucleus(p, 0.85) > 0
    assert kept.tolist() == [[True, True, True, False], [False, True, False, False]]
    assert torch.equal(nucleus(p, 1.0), p)
    assert (nucleus(p, 1e-6) > 0).sum(dim=-1).tolist() == [1, 1]  # the top view always stays


def test_sampler_greedy_sample_temperature_top_p() -> None:
    logits = torch.full((144,), -5.0)
    logits[[3, 10, 77]] = torch.tensor([2.0, 1.5, 1.0])
    model = FixedLogits(logits)
    x = inputs(4000)
    idx, lp = RouterSampler(model, greedy=True).select(x)
    assert (idx == 3).all()
    assert lp[0].item() == pytest.approx(torch.log_softmax(logits, -1)[3].item(), abs=1e-6)
    idx, lp = RouterSampler(model, greedy=False, temperature=2.0, seed=0).select(x)
    scaled = torch.log_softmax(logits / 2.0, -1)
    torch.testing.assert_close(lp, scaled[idx])
    freq = torch.bincount(idx, minlength=144).double() / len(idx)
    assert (freq - scaled.exp().double()).abs().max() < 0.03
    again, _ = RouterSampler(model, greedy=False, temperature=2.0, seed=0).select(x)
    assert torch.equal(idx, again)
    p = torch.softmax(logits, -1)
    assert p[3] < 0.6 < p[3] + p[10]  # a nucleus of 0.6 keeps exactly views 3 and 10
    idx, lp = RouterSampler(model, greedy=False, top_p=0.6, seed=1).select(x)
    assert set(idx.tolist()) == {3, 10}
    torch.testing.assert_close(lp, torch.log_softmax(logits, -1)[idx])  # untruncated log-prob
    with pytest.raises(ValueError, match="top_p"):
        RouterSampler(model, greedy=False, top_p=0.0)


def test_sampler_accepts_router_features() -> None:
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY).eval()
    rng = np.random.default_rng(0)
    feats = RouterFeatures(
        rng.normal(size=(2, 384)), rng.normal(size=(2, 384)), rng.random((2, 128)), rng.random((2, 8))
    )
    idx, lp = RouterSampler(model, greedy=True).select(feats)
    expected = model(*feats.to_tensors()).argmax(-1)
    assert torch.equal(idx, expected) and lp.shape == (2,) and (lp <= 0).all()


def test_a_decision_runs_without_dropout_and_leaves_every_submodule_in_its_mode() -> None:
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY)
    model.set_mode(encoder_train=False, planner_train=True)  # a partly frozen Router
    before = {name: m.training for name, m in model.named_modules()}
    x = inputs(3)
    sampler = RouterSampler(model, greedy=True)
    first, second = sampler.logits(x), sampler.logits(x)
    torch.testing.assert_close(first, second)  # no dropout at decision time
    assert {name: m.training for name, m in model.named_modules()} == before
    model.eval()
    assert torch.equal(sampler.logits(x), first)
    assert not any(m.training for m in model.modules())
