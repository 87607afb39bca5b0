"""What the scripted CPU stand-ins of the frozen VLM share (docs/architecture.md "The scripted
policy"; paper eq. task-policy): a softmax over scored actions sampled with a generator seeded by
``(seed, episode id, step)``, so draws are reproducible and a GRPO group's trajectories differ."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from typing import TypeVar

from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.policy.config import PolicyConfig

_StandIn = TypeVar("_StandIn", bound="TemperedStandIn")


def seeded_rng(seed: int, episode_id: str, step: int) -> random.Random:
    """The generator of one decision: a function of ``(seed, episode id, step)`` only."""
    digest = hashlib.blake2b(f"{seed}|{episode_id}|{step}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def tempered_distribution(scores: Mapping[str, float], temperature: float) -> dict[str, float]:
    """``softmax(score / temperature)`` in sorted action order; at temperature 0, uniform over the best."""
    items = sorted(scores.items())
    top = max(s for _, s in items)
    if temperature == 0:
        best = [a for a, s in items if s == top]
        return {a: 1.0 / len(best) for a in best}
    weights = [math.exp((s - top) / temperature) for _, s in items]
    total = sum(weights)
    return {a: w / total for (a, _), w in zip(items, weights, strict=True)}


def view_texts(inp: PolicyInput) -> list[str]:
    """The view a stand-in reads in text form: ``view_text``, or in optical conditions the text
    rendering in ``meta["view_text"]`` (a reader with perfect OCR); none without a view."""
    view = inp.view_text if inp.view_text is not None else inp.meta.get("view_text")
    return [str(view)] if inp.view_mode != "none" and view else []


class TemperedStandIn:
    """What the stand-ins that sample at a temperature share: temperature, seed and the view read as text."""

    needs_view_text = True
    #: It never reads pixels: D1 labelling lays its pages out without painting them.
    needs_view_image = False

    def __init__(self, temperature: float = 1.0, seed: int = 0) -> None:
        if temperature < 0:
            raise ValueError(f"scripted policy temperature must be >= 0, got {temperature}")
        self.temperature = float(temperature)
        self.seed = int(seed)

    @classmethod
    def from_config(cls: type[_StandIn], config: PolicyConfig) -> _StandIn:
        """From ``policy.scripted`` (keys checked by PolicyConfig): its temperature and seed."""
        return cls(**{k: v for k, v in config.scripted.items() if k in ("temperature", "seed")})

    def act_one(self, inp: PolicyInput) -> PolicyOutput:
        raise NotImplementedError

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput]:
        return [self.act_one(inp) for inp in inputs]
