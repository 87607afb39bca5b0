"""Environments behind one protocol (:mod:`memprism_ray.envs.base`); each benchmark's env lives
in its own folder (``memprism_ray/benchmark/<name>/``)."""

from __future__ import annotations

from memprism_ray.envs.base import Env, GameRef, Observation, Transition

__all__ = ["Env", "GameRef", "Observation", "Transition"]
