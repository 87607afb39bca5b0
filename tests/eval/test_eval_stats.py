"""Wilson interval and paired bootstrap (appendix C) against known values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memprism_ray.eval.stats import paired_bootstrap_diff, success_summary, wilson_interval


def wilson_by_quadratic(k: int, n: int, z: float) -> tuple[float, float]:
    """Independent form: the roots in p of (k/n - p)^2 = z^2 p (1 - p) / n."""
    ph = k / n
    a = 1 + z * z / n
    b = -(2 * ph + z * z / n)
    c = ph * ph
    disc = math.sqrt(max(0.0, b * b - 4 * a * c))
    return (-b - disc) / (2 * a), (-b + disc) / (2 * a)


def test_wilson_known_values() -> None:
    low, high = wilson_interval(14, 140)
    assert low == pytest.approx(0.060506, abs=1e-6) and high == pytest.approx(0.160860, abs=1e-6)
    # Closed forms at the edges: upper(0/n) = z^2 / (n + z^2), lower(n/n) = n / (n + z^2).
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.277533, abs=1e-5))
    assert wilson_interval(10, 10) == (pytest.approx(0.722467, abs=1e-5), 1.0)
    assert wilson_interval(0, 1) == (0.0, pytest.approx(0.793457, abs=1e-5))
    assert wilson_interval(5, 10) == pytest.approx((0.236590, 0.763410), abs=1e-5)


@pytest.mark.parametrize(("k", "n"), [(1, 140), (70, 140), (139, 140), (3, 7), (123, 3827)])
@pytest.mark.parametrize("z", [1.0, 1.96, 2.576])
def test_wilson_agrees_with_the_quadratic_form(k: int, n: int, z: float) -> None:
    assert wilson_interval(k, n, z) == pytest.approx(wilson_by_quadratic(k, n, z), abs=1e-12)


def test_wilson_edges_and_errors() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(1, 2)
    assert lo < 0.5 < hi and hi - 0.5 == pytest.approx(0.5 - lo)  # symmetric at p = 1/2
    # Ten times the data narrows the interval, by a bit less than sqrt(10) at small n.
    ratio = (wilson_interval(5, 10)[1] - wilson_interval(5, 10)[0]) / (
        wilson_interval(50, 100)[1] - wilson_interval(50, 100)[0]
    )
    assert 2.5 < ratio < math.sqrt(10)
    for bad in [(-1, 10), (11, 10), (1, -1)]:
        with pytest.raises(ValueError, match="successes <= n"):
            wilson_interval(*bad)
    with pytest.raises(ValueError, match="must be an int"):
        wilson_interval(1.5, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="z must be positive"):
        wilson_interval(1, 10, z=0)


def test_bootstrap_degenerate_cases() -> None:
    ids = [f"valid_unseen/g{i}#0" for i in range(40)]
    same = {e: i % 2 for i, e in enumerate(ids)}
    assert paired_bootstrap_diff(same, same, n_boot=500) == (0.0, 0.0, 0.0, 40)
    ones = dict.fromkeys(ids, 1)
    zeros = dict.fromkeys(ids, 0)
    assert paired_bootstrap_diff(ones, zeros, n_boot=500) == (1.0, 1.0, 1.0, 40)
    assert paired_bootstrap_diff(zeros, ones, n_boot=500) == (-1.0, -1.0, -1.0, 40)
    # Only common ids count; extra ids on either side are ignored.
    a = {**ones, "valid_unseen/extra#0": 0}
    b = {**zeros, "valid_unseen/other#0": 1}
    assert paired_bootstrap_diff(a, b, n_boot=200)[3] == 40
    with pytest.raises(ValueError, match="no common episode ids"):
        paired_bootstrap_diff({"a": 1}, {"b": 1})
    with pytest.raises(ValueError, match="must be 0/1"):
        paired_bootstrap_diff({"a": 2}, {"a": 1})
    with pytest.raises(ValueError, match="n_boot"):
        paired_bootstrap_diff(ones, zeros, n_boot=0)


def test_bootstrap_pairing_is_preserved() -> None:
    # Discordant pairs only at 10 of 100 episodes, all favouring a: a paired resample can
    # never show b ahead, while an unpaired one would (both SRs are ~50%).
    rng = np.random.default_rng(1)
    base = rng.integers(0, 2, size=100)
    a = {f"s/g{i}#0": int(v) for i, v in enumerate(base)}
    b = dict(a)
    flipped = [k for k, v in a.items() if v == 1][:10]
    for k in flipped:
        b[k] = 0
    diff, low, high, n = paired_bootstrap_diff(a, b, n_boot=4000, seed=3)
    assert diff == pytest.approx(0.10) and n == 100
    assert 0.0 <= low < 0.10 < high <= 0.2


def test_bootstrap_is_seeded_and_matches_the_normal_approximation() -> None:
    rng = np.random.default_rng(0)
    a = {f"s/g{i}#0": int(v) for i, v in enumerate(rng.random(400) < 0.6)}
    b = {f"s/g{i}#0": int(v) for i, v in enumerate(rng.random(400) < 0.5)}
    r1 = paired_bootstrap_diff(a, b, n_boot=5000, seed=7)
    assert r1 == paired_bootstrap_diff(dict(reversed(list(a.items()))), b, n_boot=5000, seed=7)  # order-free
    assert r1 != paired_bootstrap_diff(a, b, n_boot=5000, seed=8)
    d = np.array([a[k] - b[k] for k in a], dtype=float)
    se = d.std(ddof=0) / math.sqrt(d.size)
    diff, low, high, _ = r1
    assert diff == pytest.approx(d.mean())
    assert low == pytest.approx(diff - 1.96 * se, abs=0.012)
    assert high == pytest.approx(diff + 1.96 * se, abs=0.012)
    narrow = paired_bootstrap_diff(a, b, n_boot=5000, seed=7, confidence=0.5)
    assert low < narrow[1] < narrow[2] < high


def test_success_summary() -> None:
    s = success_summary({f"s/g{i}#0": i < 14 for i in range(140)})
    assert s["successes"] == 14 and s["n"] == 140 and s["sr"] == pytest.approx(0.1)
    assert (s["wilson_low"], s["wilson_high"]) == wilson_interval(14, 140)
