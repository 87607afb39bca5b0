"""EB-ALFRED through EmbodiedBench on AI2-THOR (paper "Benchmarks"; issue 13).

* :mod:`.data`: the six subsets, game references, ALFRED training annotations.
* :mod:`.training`: the ALFRED training list EmbodiedBench's env can play.
* :mod:`.skills` / :mod:`.examples`: the skill list (EmbodiedBench's and the scene-filtered
  one the prompt shows) and the in-context examples.
* :mod:`.env`: :class:`EbAlfredEnv` on a controller with ``EBAlfEnv``'s interface.
* :mod:`.fixture` / :mod:`.fake`: the recorded-transcript fixture and its replaying
  controller, for tests without the simulator.

AI2-THOR and EmbodiedBench are imported only by ``env.make_embodiedbench_controller``.
"""

from __future__ import annotations

from memprism_ray.envs.ebalfred.data import SUBSETS, list_games
from memprism_ray.envs.ebalfred.env import EbAlfredConfig, EbAlfredEnv

__all__ = ["SUBSETS", "EbAlfredConfig", "EbAlfredEnv", "list_games"]
