"""View selectors for every evaluation condition (the Router and the baselines)."""

from memprism_ray.baselines.base import FULL_HISTORY, DecisionContext, ViewDecision, ViewSelector
from memprism_ray.baselines.conditions import (
    CONDITIONS_HELP,
    FixedView,
    FrequencyMatchedRandom,
    RouterSelector,
    TextHistory,
    make_selector,
)

__all__ = [
    "CONDITIONS_HELP",
    "FULL_HISTORY",
    "DecisionContext",
    "FixedView",
    "FrequencyMatchedRandom",
    "RouterSelector",
    "TextHistory",
    "ViewDecision",
    "ViewSelector",
    "make_selector",
]
