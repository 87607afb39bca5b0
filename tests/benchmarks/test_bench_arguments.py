"""Every count a benchmark script takes is checked by argparse (``memprism_ray.config_tree.int_at_least``):
``--reps 0``, ``--rounds 0`` or ``--episodes 0`` ended in a ``KeyError``, ``StatisticsError`` or
``ZeroDivisionError`` traceback after the set-up had run."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memprism_ray.config_tree import int_at_least

ROOT = Path(__file__).resolve().parents[2]


def test_int_at_least_names_the_bound_and_the_value() -> None:
    assert int_at_least(1)("3") == 3 and int_at_least(0)("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected an integer >= 1, got 0$"):
        int_at_least(1)("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected an integer, got 'x'$"):
        int_at_least(1)("x")


def test_no_benchmark_script_takes_an_unchecked_integer() -> None:
    unchecked = [
        f"{path.name}: {m.group(0)}"
        for path in sorted((ROOT / "benchmarks").glob("bench_*.py"))
        for m in re.finditer(r'"--[a-z0-9-]+",\s*type=int\b', path.read_text())
    ]
    assert unchecked == []


@pytest.mark.parametrize(("script", "option"), [("bench_views.py", "--reps"), ("bench_view_bytes.py", "--episodes")])
def test_a_count_of_zero_is_a_usage_error(script: str, option: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), option, "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip().splitlines()[-1] == f"{script}: error: argument {option}: expected an integer >= 1, got 0"
    )
