"""The controller: :func:`fit` runs one training job on any benchmark (run directory and
resume, D1, the Ray actors, GRPO iterations, the final evaluation), reading top to bottom;
:func:`evaluate_job` and :func:`d1_job` are the evaluation and D1 entry points. The Ray actors
it drives live in :mod:`memprism_ray.actors`; what differs per benchmark is a
:class:`~memprism_ray.benchmark.Benchmark`."""

from __future__ import annotations

from memprism_ray.trainer.fit import d1_job, evaluate_job, fit, grpo_job

__all__ = ["d1_job", "evaluate_job", "fit", "grpo_job"]
