"""Which benchmarks exist (paper "Benchmarks"), by name, and the default one: the one table
the shared code reads instead of naming a benchmark. Entries are ``module:Class`` strings,
imported only when asked for, so this module sits below everything and imports nothing of
the package; :mod:`memprism_ray.benchmark` builds the :class:`~memprism_ray.benchmark.Benchmark`
objects, :mod:`memprism_ray.config` asks :func:`section_types` for the settings sections the
benchmarks declare.

A benchmark outside the package registers with :func:`register_benchmark`, which processes
started afterwards (Ray's workers) inherit through ``$MEMPRISM_BENCHMARKS``
(``name=module:Class``, comma-separated).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

#: The benchmark a job runs when ``corpus.benchmark`` is not given.
DEFAULT_BENCHMARK = "alfworld"

#: name -> ``module:Class`` of its Benchmark.
BENCHMARKS: dict[str, str] = {
    "alfworld": "memprism_ray.benchmark.alfworld.benchmark:Alfworld",
    "ebalfred": "memprism_ray.benchmark.ebalfred.benchmark:EbAlfred",
    "mind2web": "memprism_ray.benchmark.mind2web.benchmark:Mind2Web",
}

#: Benchmarks registered outside the package, inherited by child processes (:func:`register_benchmark`).
ENV_VAR = "MEMPRISM_BENCHMARKS"


def registered() -> dict[str, str]:
    """:data:`BENCHMARKS` and the ``$MEMPRISM_BENCHMARKS`` entries."""
    pairs = (item.split("=", 1) for item in os.environ.get(ENV_VAR, "").split(",") if "=" in item)
    return {**{k.strip(): v.strip() for k, v in pairs}, **BENCHMARKS}


def register_benchmark(name: str, target: str) -> None:
    """Register the benchmark ``name`` (``target``: ``module:Class``) here and in the processes
    started later (register before Ray starts; the module must be importable there)."""
    if not name or any(c in name for c in "=,.") or ":" not in target:
        raise ValueError(f"register_benchmark({name!r}, {target!r}): a plain name and 'module:Class'")
    entries = {**{k: v for k, v in registered().items() if k not in BENCHMARKS}, name: target}
    os.environ[ENV_VAR] = ",".join(f"{k}={v}" for k, v in entries.items())


def known_benchmarks() -> list[str]:
    """Every registered benchmark's name, sorted."""
    return sorted(registered())


def load(target: str, what: str) -> Any:
    """The object ``module:attr`` names; a ``ValueError`` saying ``what`` it was for otherwise."""
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what}: cannot load {target!r} ({type(exc).__name__}: {exc})") from None


def benchmark_class(name: str) -> Any:
    """The Benchmark class registered as ``name``; a ``ValueError`` naming the known ones otherwise."""
    entries = registered()
    if name not in entries:
        raise ValueError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(sorted(entries))}")
    return load(entries[name], f"benchmark {name!r}")


def section_types() -> dict[str, type | ValueError]:
    """name -> the settings section (a config dataclass) of every registered benchmark that
    declares one (its ``section``: ``module:Class``), in name order: the config tree's
    ``--<name>.<key>`` settings.

    A benchmark registered outside the package whose module this process cannot import (a
    script run from another directory inherits ``$MEMPRISM_BENCHMARKS`` too) maps to the
    error instead, raised where its section is used, so it does not break jobs that do not
    use it; the package's own benchmarks always load."""
    out: dict[str, type | ValueError] = {}
    for name in known_benchmarks():
        try:
            target = getattr(benchmark_class(name), "section", "")
            if target:
                out[name] = load(target, f"the settings section of benchmark {name!r}")
        except ValueError as exc:
            if name in BENCHMARKS:
                raise
            out[name] = exc
    return out
