"""Router: decision-conditioned view routing (paper: "Router"; appendix A.2, D.4).

Torch-backed names are imported on first use so that ``memprism_ray.router.features`` stays light.
"""

from __future__ import annotations

from typing import Any

from memprism_ray.router.features import (
    EventWindowSummarizer,
    FeatureExtractor,
    RouterFeatures,
    canonical_action,
    global_stats,
)

_LAZY = {
    name: f"memprism_ray.router.{module}"
    for module, names in (
        ("encoder", ("TextEncoder", "EncoderConfig", "HashingEncoder")),
        ("model", ("ViewPolicyModel", "RouterConfig", "factor_marginals")),
        ("sampling", ("RouterSampler", "sample_views", "view_log_probs")),
        ("teacher", ("TeacherLabel", "LLMViewTeacher", "LLMTeacherConfig", "CounterfactualTeacher")),
        ("teacher", ("CounterfactualConfig", "DecisionState", "decision_states")),
    )
    for name in names
}

__all__ = [
    "EventWindowSummarizer",
    "FeatureExtractor",
    "RouterFeatures",
    "canonical_action",
    "global_stats",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memprism_ray.router' has no attribute {name!r}")
