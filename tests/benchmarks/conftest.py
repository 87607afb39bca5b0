"""The benchmark scripts import their helper as ``_results`` (``benchmarks/`` is ``sys.path[0]``
when a script runs); tests import the scripts from files, so put that folder on the path, and
send every record a test writes to a temporary folder instead of ``benchmarks/results/``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))


@pytest.fixture(autouse=True)
def bench_results_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where this test's benchmark records go (``$MEMPRISM_BENCH_RESULTS``)."""
    out = tmp_path / "bench-results"
    monkeypatch.setenv("MEMPRISM_BENCH_RESULTS", str(out))
    return out
