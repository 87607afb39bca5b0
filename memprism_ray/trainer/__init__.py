"""The controller: :func:`fit` runs one training job on any benchmark; :func:`evaluate_job` and
:func:`d1_job` are the evaluation and D1 entry points."""

from __future__ import annotations

from memprism_ray.trainer.fit import d1_job, evaluate_job, fit, grpo_job

__all__ = ["d1_job", "evaluate_job", "fit", "grpo_job"]
