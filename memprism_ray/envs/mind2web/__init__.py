"""Mind2Web under teacher-forced replay (paper "Benchmarks"; appendix D.2 "Mind2Web").

* :mod:`.data`: the official release read from a local path (``train``, ``test_task``,
  ``test_website``, ``test_domain``).
* :mod:`.snapshot`: builds the paper's page snapshot (cleaned_html near candidate ids,
  compact HTML snippets as fallback; format: :mod:`memprism_ray.formats.mind2web_snapshot`).
* :mod:`.env`: :class:`Mind2WebReplayEnv`, which scores the predicted action and advances
  with the recorded human action.
* :mod:`.fixture`: a small deterministic dataset in the official schema (tests, smoke runs).

See docs/mind2web.md.
"""

from __future__ import annotations

from memprism_ray.envs.mind2web.data import list_games
from memprism_ray.envs.mind2web.env import Mind2WebReplayEnv

__all__ = ["Mind2WebReplayEnv", "list_games"]
