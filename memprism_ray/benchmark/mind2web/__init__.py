"""Mind2Web under teacher-forced replay (paper "Benchmarks"; appendix D.2 "Mind2Web"; docs/mind2web.md)."""

from __future__ import annotations

from memprism_ray.benchmark.mind2web.data import list_games
from memprism_ray.benchmark.mind2web.env import Mind2WebReplayEnv

__all__ = ["Mind2WebReplayEnv", "list_games"]
