"""The one Router view sampler (paper: "Router", eqs. view-policy and greedy-view; "Adapter",
eq. ratio; Table A.4: rollout temperature, Mind2Web top-p 0.85).

The argmax at evaluation; in a GRPO rollout a draw from ``softmax(l_t / T)`` within the
top-``p`` nucleus (one seeded ``torch.Generator``). The recorded log-prob is :func:`view_log_probs`
under the full tempered distribution, never the truncated one, the same function as the
learner's ratio, so at the rollout weights every ratio is exactly 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from memprism_ray.view_space import NUM_ACTIONS

if TYPE_CHECKING:
    from memprism_ray.router.features import RouterFeatures


def view_log_probs(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / T)`` in float32 over the last axis: the rollout policy whose
    log-prob a decision records and the GRPO ratio recomputes."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def nucleus(probs: Tensor, top_p: float) -> Tensor:
    """Top-p truncation of each row of ``probs`` (Table A.4 Mind2Web: top-p 0.85), not renormalised:
    ``torch.multinomial`` draws in proportion to the weights."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of the views ranked above each one
    keep_sorted = before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return probs * keep


def sample_views(
    logits: Tensor,
    *,
    greedy: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """One view per row of ``logits`` [B, 144]: ``(indices int64 [B], log-probs float32 [B])``."""
    logp = view_log_probs(logits, temperature)
    if greedy:
        idx = logp.argmax(dim=-1)
    else:
        idx = torch.multinomial(nucleus(logp.exp(), top_p), 1, generator=generator).squeeze(-1)
    return idx, logp.gather(-1, idx.unsqueeze(-1)).squeeze(-1)


class RouterSampler:
    """The Router's choice for a batch of decisions, under an optional mask over the 144 actions (the
    constrained planners), with one seeded ``torch.Generator``: a fixed decision order reproduces."""

    def __init__(
        self,
        model: nn.Module,
        *,
        greedy: bool = True,
        temperature: float = 1.0,
        top_p: float = 1.0,
        mask: np.ndarray | None = None,
        seed: int = 0,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"Router temperature must be > 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"Router top_p must be in (0, 1], got {top_p}")
        if mask is not None and (mask.shape != (NUM_ACTIONS,) or not mask.any()):
            raise ValueError("Router mask must be a boolean vector of 144 entries with at least one True")
        self.model = model
        self.greedy = greedy
        self.temperature = temperature
        self.top_p = float(top_p)
        self.mask = None if mask is None else torch.as_tensor(mask, dtype=torch.bool)
        self.generator = torch.Generator().manual_seed(seed)

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def logits(self, features: RouterFeatures | tuple[Tensor, ...]) -> Tensor:
        """The masked joint logits [B, 144] on the CPU. The model runs in eval mode (no
        dropout at decision time) and is put back in the mode it was in."""
        device = next(self.model.parameters()).device
        inputs = tuple(t.to(device) for t in features) if isinstance(features, tuple) else features.to_tensors(device)
        # Only the submodules in training mode are switched, and exactly those switched back (a
        # model in eval mode, as a served Router is, costs nothing here; eval()/train() walked
        # every submodule per call: 3,000 calls per 20 views, 1.1 ms of a 7.5 ms library view,
        # cProfile of Memory.view, issue 43), so a mixed mode (set_mode) is kept as it was.
        training = [m for m in self.model.modules() if m.training]
        for m in training:
            m.training = False
        try:
            with torch.no_grad():
                logits = self.model(*inputs).float().cpu()
        finally:
            for m in training:
                m.training = True
        if self.mask is not None:
            logits = logits.masked_fill(~self.mask, float("-inf"))
        return logits

    def select(self, features: RouterFeatures | tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """``(view indices [B], their log-probs [B])`` for one batch of decisions."""
        return sample_views(
            self.logits(features),
            greedy=self.greedy,
            temperature=self.temperature,
            top_p=self.top_p,
            generator=self.generator,
        )
