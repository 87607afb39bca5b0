"""Composer: relational view construction (paper "Composer: Relational View Construction",
appendix D.3). ``select`` merges scope, goal-term restore and recent context; the four
compilers build typed structures at three granularities; ``compose`` does both."""

from memprism_ray.composer.compilers import (
    COMPILERS,
    DEPENDENCY_CAPS,
    compile_dependency,
    compile_effect,
    compile_state,
    compile_temporal,
    compile_view,
)
from memprism_ray.composer.compose import compose
from memprism_ray.composer.records import DeltaView, EventView, event_view
from memprism_ray.composer.select import ComposerConfig, Reason, SelectedEvent, Selection, select
from memprism_ray.composer.structures import (
    ActionEffect,
    ChainLink,
    DependencyChain,
    EffectGroup,
    EntityRow,
    EntityState,
    LinkKind,
    StateChain,
    StateValue,
    TemporalTrace,
    TraceEntry,
    TraceGap,
    TraceRun,
    View,
    ViewBody,
)
from memprism_ray.composer.terms import goal_terms, text_terms

__all__ = [
    "COMPILERS",
    "DEPENDENCY_CAPS",
    "ActionEffect",
    "ChainLink",
    "ComposerConfig",
    "DeltaView",
    "DependencyChain",
    "EffectGroup",
    "EntityRow",
    "EntityState",
    "EventView",
    "LinkKind",
    "Reason",
    "SelectedEvent",
    "Selection",
    "StateChain",
    "StateValue",
    "TemporalTrace",
    "TraceEntry",
    "TraceGap",
    "TraceRun",
    "View",
    "ViewBody",
    "compile_dependency",
    "compile_effect",
    "compile_state",
    "compile_temporal",
    "compile_view",
    "compose",
    "event_view",
    "goal_terms",
    "select",
    "text_terms",
]
