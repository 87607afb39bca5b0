"""Environments behind one protocol (:mod:`memprism_ray.envs.base`), one package per benchmark."""

from __future__ import annotations

from typing import Any

from memprism_ray.envs.base import Env, GameRef, Observation, Transition

__all__ = ["AlfworldEnv", "Env", "GameRef", "Observation", "Transition", "ensure_default_corpus", "list_games"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the protocol must not load alfworld/textworld.
    if name in ("AlfworldEnv", "ensure_default_corpus", "list_games"):
        import memprism_ray.envs.alfworld as alfworld_pkg

        return getattr(alfworld_pkg, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
