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
    "TextEncoder": "memprism_ray.router.encoder",
    "EncoderConfig": "memprism_ray.router.encoder",
    "HashingEncoder": "memprism_ray.router.encoder",
    "ViewPolicyModel": "memprism_ray.router.model",
    "RouterConfig": "memprism_ray.router.model",
    "factor_marginals": "memprism_ray.router.model",
    "RouterSampler": "memprism_ray.router.sampling",
    "sample_views": "memprism_ray.router.sampling",
    "view_log_probs": "memprism_ray.router.sampling",
    "TeacherLabel": "memprism_ray.router.teacher",
    "LLMViewTeacher": "memprism_ray.router.teacher",
    "LLMTeacherConfig": "memprism_ray.router.teacher",
    "CounterfactualTeacher": "memprism_ray.router.teacher",
    "CounterfactualConfig": "memprism_ray.router.teacher",
    "DecisionState": "memprism_ray.router.teacher",
    "decision_states": "memprism_ray.router.teacher",
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
