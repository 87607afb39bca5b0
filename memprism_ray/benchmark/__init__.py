"""The benchmarks MemPrism is evaluated on (paper "Benchmarks"), behind one interface,
:class:`Benchmark`, reached with ``get_benchmark(cfg.corpus.benchmark)`` (imported only when
asked for). A benchmark is one module and one entry in the registry
(:data:`memprism_ray.registry.BENCHMARKS`); one outside the package registers with
:func:`register_benchmark`, which processes started afterwards (Ray's workers) inherit.
"""

from __future__ import annotations

from typing import Any

from memprism_ray.benchmark.base import Benchmark, BenchmarkConfigError, DataTree, EvalPlan
from memprism_ray.registry import BENCHMARKS, benchmark_class, known_benchmarks, register_benchmark


def get_benchmark(name: str) -> Benchmark:
    """The benchmark ``name``; a ``ValueError`` naming the known ones otherwise."""
    return benchmark_class(name)()


def _by_table_a4_row(row: str, what: str) -> Benchmark:
    benchmarks = [get_benchmark(n) for n in known_benchmarks()]
    for b in benchmarks:
        if b.table_a4_row == row:
            return b
    raise ValueError(f"unknown {what} preset {row!r}; valid: {', '.join(b.table_a4_row for b in benchmarks)}")


def sft_preset(row: str, **overrides: Any) -> Any:
    """The D1 settings of Table A.4 row ``row`` (a benchmark's :attr:`Benchmark.table_a4_row`:
    ``alfworld``, ``alfred``, ``mind2web``), with optional overrides."""
    return _by_table_a4_row(row, "SFT").sft_preset(**overrides)


def grpo_preset(row: str, **overrides: Any) -> Any:
    """The D2 settings of Table A.4 row ``row``, with optional overrides."""
    return _by_table_a4_row(row, "GRPO").grpo_preset(**overrides)


__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "BenchmarkConfigError",
    "DataTree",
    "EvalPlan",
    "get_benchmark",
    "grpo_preset",
    "known_benchmarks",
    "register_benchmark",
    "sft_preset",
]
