"""ALFWorld on the real TextWorld PDDL engine, offline (issue 3). Heavy imports (alfworld,
textworld, fast-downward) happen when a submodule is used."""

from __future__ import annotations

from typing import Any

__all__ = [
    "SPLITS",
    "TASK_TYPES",
    "AlfworldEnv",
    "CorpusConfig",
    "build_corpus",
    "collect_expert_trajectories",
    "ensure_default_corpus",
    "list_games",
]

_LAZY = {
    "SPLITS": "memprism_ray.benchmark.alfworld.data",
    "list_games": "memprism_ray.benchmark.alfworld.data",
    "TASK_TYPES": "memprism_ray.benchmark.alfworld.generator",
    "AlfworldEnv": "memprism_ray.benchmark.alfworld.env",
    "CorpusConfig": "memprism_ray.benchmark.alfworld.corpus",
    "build_corpus": "memprism_ray.benchmark.alfworld.corpus",
    "ensure_default_corpus": "memprism_ray.benchmark.alfworld.corpus",
    "collect_expert_trajectories": "memprism_ray.benchmark.alfworld.expert_data",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
