"""What the scripted CPU stand-ins of the frozen VLM share (docs/architecture.md "The scripted
policy"; paper eq. task-policy): sampling from a softmax over scored actions with a generator
seeded by ``(seed, episode id, step)``, so draws are reproducible, no state is kept between
calls, and the trajectories of a GRPO group differ. Each benchmark's stand-in is its own
(``ScriptedPolicy`` for ALFWorld, ``Mind2WebScriptedPolicy``, the EB-ALFRED ``FixturePolicy``),
reached through its task contract."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping


def seeded_rng(seed: int, episode_id: str, step: int) -> random.Random:
    """The generator of one decision: a function of ``(seed, episode id, step)`` only."""
    digest = hashlib.blake2b(f"{seed}|{episode_id}|{step}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def tempered_distribution(scores: Mapping[str, float], temperature: float) -> dict[str, float]:
    """``softmax(score / temperature)`` over the actions in sorted order (the scripted
    stand-ins' sampling distribution); at temperature 0, uniform over the best-scored."""
    items = sorted(scores.items())
    top = max(s for _, s in items)
    if temperature == 0:
        best = [a for a, s in items if s == top]
        return {a: 1.0 / len(best) for a in best}
    weights = [math.exp((s - top) / temperature) for _, s in items]
    total = sum(weights)
    return {a: w / total for (a, _), w in zip(items, weights, strict=True)}
