"""The benchmarks MemPrism is evaluated on (paper "Benchmarks"), behind one interface:
:class:`Benchmark` (``base.py``), implemented by ``alfworld.py``, ``ebalfred.py`` and
``mind2web.py``. ``get_benchmark(cfg.corpus.benchmark)`` is how the trainer, the actors and
the jobs reach one; implementations are imported only when asked for, so reading this table
loads no simulator or dataset.
"""

from __future__ import annotations

import importlib

from memprism_ray.benchmark.base import Benchmark, BenchmarkConfigError, DataTree, EvalPlan

#: name -> ``module:class`` of its :class:`Benchmark`.
BENCHMARKS: dict[str, str] = {
    "alfworld": "memprism_ray.benchmark.alfworld:Alfworld",
    "ebalfred": "memprism_ray.benchmark.ebalfred:EbAlfred",
    "mind2web": "memprism_ray.benchmark.mind2web:Mind2Web",
}


def get_benchmark(name: str) -> Benchmark:
    """The benchmark ``name``; a ``ValueError`` naming the known ones otherwise."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(sorted(BENCHMARKS))}")
    module, _, cls = BENCHMARKS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkConfigError", "DataTree", "EvalPlan", "get_benchmark"]
