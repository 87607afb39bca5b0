"""Composer: relational view construction (paper "Composer: Relational View Construction",
appendix D.3). ``select`` merges scope, goal-term restore and recent context; the four
compilers (``composer.compilers``) build the typed structures of ``composer.structures`` at
three granularities; ``compose`` does both."""

from memprism_ray.composer.compose import compose
from memprism_ray.composer.select import ComposerConfig, Reason, SelectedEvent, Selection, select
from memprism_ray.composer.structures import View
from memprism_ray.composer.terms import goal_terms, text_terms

__all__ = [
    "ComposerConfig",
    "Reason",
    "SelectedEvent",
    "Selection",
    "View",
    "compose",
    "goal_terms",
    "select",
    "text_terms",
]
