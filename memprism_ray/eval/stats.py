"""Evaluation statistics (paper appendix C, "Common controlled protocol"): every archived
result carries its raw success count and denominator with a Wilson 95% interval, and
conditions evaluated on the same ordered tasks get a paired bootstrap interval for their
success-rate difference, resampling the common episode ids with within-episode pairing kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

#: Resamples drawn per chunk, bounding memory at chunk * n_common indices.
_BOOT_CHUNK = 2048


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of ``successes / n`` (95% at ``z=1.96``; ``n == 0``: ``(0.0, 1.0)``)."""
    for name, value in (("successes", successes), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"wilson_interval: {name} must be an int, got {value!r}")
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got successes={successes}, n={n}")
    if not z > 0:
        raise ValueError(f"wilson_interval: z must be positive, got {z}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # At p = 0 or 1 the bound is exactly 0 or 1; clamp rounding noise.
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def _binary(values: Mapping[Any, Any], name: str) -> dict[Any, int]:
    out = {}
    for key, v in values.items():
        numeric = isinstance(v, (bool, np.bool_, int, np.integer, float, np.floating))
        if numeric and v in (0, 1):
            out[key] = int(v)
        else:
            raise ValueError(f"paired_bootstrap_diff: {name}[{key!r}] must be 0/1 (or bool), got {v!r}")
    return out


def paired_bootstrap_diff(
    a: Mapping[str, int | bool],
    b: Mapping[str, int | bool],
    n_boot: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float, int]:
    """Paired bootstrap interval of ``SR(a) - SR(b)`` over the episode ids both contain (each id's
    pair of outcomes resampled together): ``(observed diff, low, high, n_common)``, seeded."""
    if n_boot < 1:
        raise ValueError(f"paired_bootstrap_diff: n_boot must be >= 1, got {n_boot}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"paired_bootstrap_diff: confidence must be in (0, 1), got {confidence}")
    a01, b01 = _binary(a, "a"), _binary(b, "b")
    common = sorted(set(a01) & set(b01), key=str)
    if not common:
        raise ValueError(
            f"paired_bootstrap_diff: no common episode ids ({len(a01)} in a, {len(b01)} in b); "
            "were both conditions run on the same episode list?"
        )
    d = np.array([a01[k] - b01[k] for k in common], dtype=np.float64)
    n = d.size
    diff = float(d.mean())
    rng = np.random.Generator(np.random.PCG64(seed))
    boots = np.empty(n_boot, dtype=np.float64)
    for start in range(0, n_boot, _BOOT_CHUNK):
        stop = min(n_boot, start + _BOOT_CHUNK)
        idx = rng.integers(0, n, size=(stop - start, n))
        boots[start:stop] = d[idx].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(boots, [tail, 1.0 - tail])
    return diff, float(low), float(high), n


def success_summary(outcomes: Mapping[str, int | bool], z: float = 1.96) -> dict[str, Any]:
    """Raw count, denominator, SR and Wilson interval of per-episode 0/1 outcomes."""
    values = _binary(outcomes, "outcomes")
    k, n = sum(values.values()), len(values)
    low, high = wilson_interval(k, n, z)
    return {"successes": k, "n": n, "sr": k / n if n else 0.0, "wilson_low": low, "wilson_high": high, "z": z}
