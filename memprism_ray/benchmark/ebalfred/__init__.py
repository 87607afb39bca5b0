"""EB-ALFRED through EmbodiedBench on AI2-THOR (paper "Benchmarks"; issue 13; docs/ebalfred.md).
AI2-THOR and EmbodiedBench are imported only by ``env.make_embodiedbench_controller``."""

from __future__ import annotations

from memprism_ray.benchmark.ebalfred.data import SUBSETS, list_games
from memprism_ray.benchmark.ebalfred.env import EbAlfredConfig, EbAlfredEnv

__all__ = ["SUBSETS", "EbAlfredConfig", "EbAlfredEnv", "list_games"]
