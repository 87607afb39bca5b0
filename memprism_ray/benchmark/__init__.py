"""The benchmarks MemPrism is evaluated on (paper "Benchmarks"), behind one interface,
:class:`Benchmark`, reached with ``get_benchmark(cfg.corpus.benchmark)`` (imported only when
asked for). A benchmark is one module and one entry in :data:`BENCHMARKS`; one outside the
package registers with :func:`register_benchmark`, which processes started afterwards (Ray's
workers) inherit through ``$MEMPRISM_BENCHMARKS`` (``name=module:Class``, comma-separated).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from memprism_ray.benchmark.base import Benchmark, BenchmarkConfigError, DataTree, EvalPlan

#: name -> ``module:class`` of its :class:`Benchmark`.
BENCHMARKS: dict[str, str] = {
    "alfworld": "memprism_ray.benchmark.alfworld:Alfworld",
    "ebalfred": "memprism_ray.benchmark.ebalfred:EbAlfred",
    "mind2web": "memprism_ray.benchmark.mind2web:Mind2Web",
}

#: Benchmarks registered outside the package, inherited by child processes (:func:`register_benchmark`).
ENV_VAR = "MEMPRISM_BENCHMARKS"


def _registered() -> dict[str, str]:
    """:data:`BENCHMARKS` and the ``$MEMPRISM_BENCHMARKS`` entries."""
    pairs = (item.split("=", 1) for item in os.environ.get(ENV_VAR, "").split(",") if "=" in item)
    return {**{k.strip(): v.strip() for k, v in pairs}, **BENCHMARKS}


def register_benchmark(name: str, target: str) -> None:
    """Register the benchmark ``name`` (``target``: ``module:Class``) here and in the processes
    started later (register before Ray starts; the module must be importable there)."""
    if not name or any(c in name for c in "=,") or ":" not in target:
        raise ValueError(f"register_benchmark({name!r}, {target!r}): a plain name and 'module:Class'")
    entries = {**{k: v for k, v in _registered().items() if k not in BENCHMARKS}, name: target}
    os.environ[ENV_VAR] = ",".join(f"{k}={v}" for k, v in entries.items())


def known_benchmarks() -> list[str]:
    """Every benchmark :func:`get_benchmark` finds, sorted."""
    return sorted(_registered())


def get_benchmark(name: str) -> Benchmark:
    """The benchmark ``name``; a ``ValueError`` naming the known ones otherwise."""
    registered = _registered()
    if name not in registered:
        raise ValueError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(sorted(registered))}")
    module, _, cls = registered[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


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
