"""The Router selector samples within the nucleus (Table A.4 "GRPO, Mind2Web": top-p 0.85) and
records the full tempered log-prob (the nucleus itself: tests/router/test_router_sampling.py)."""

from __future__ import annotations

import pytest
import torch

from memprism_ray.baselines.conditions import RouterSelector


class _Fixed(torch.nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(xs[0].shape[0], -1)


class _Feats:
    def to_tensors(self, device: object) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(400, 1),)


def test_router_samples_only_inside_the_nucleus() -> None:
    logits = torch.zeros((1, 144))
    logits[0, :3] = torch.tensor([5.0, 4.5, 4.0])  # 68% of the mass on views 0-2, 32% in a long tail
    model = _Fixed(logits)
    contexts = [None] * 400
    tail = RouterSelector(model, greedy=False, top_p=1.0, seed=0).select(contexts, _Feats())
    top = RouterSelector(model, greedy=False, top_p=0.6, seed=0).select(contexts, _Feats())
    assert {d.index for d in top} <= {0, 1, 2} and len({d.index for d in tail}) > 3
    full = torch.log_softmax(logits, -1)[0]
    assert all(d.logprob == pytest.approx(float(full[d.index])) for d in top)  # full tempered log-prob
    with pytest.raises(ValueError, match="top_p"):
        RouterSelector(model, top_p=0.0)
