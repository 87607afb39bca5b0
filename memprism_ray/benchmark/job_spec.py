"""What one job of a benchmark can do, where the config tree accepts more (issue 10: a setting
a job would silently ignore is an error at load time): the :class:`JobSpec` a benchmark declares
(:meth:`memprism_ray.benchmark.Benchmark.job_spec`) and :func:`check_job`, which the job's
argument parsing (:func:`memprism_ray.trainer.job_args.parse_job_args`) and ``memprism eval`` run
before Ray starts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memprism_ray.config import ExperimentConfig, joins_cluster
from memprism_ray.config_tree import get_path


@dataclass(frozen=True)
class JobSpec:
    """What one job can do, beyond its benchmark's own checks (:meth:`Benchmark.check`)."""

    name: str  # the job, as its refusals name it (``grpo_alfworld``)
    supports: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # dotted key -> values it implements


def check_job(job: JobSpec, cfg: ExperimentConfig, environ: Mapping[str, str] = os.environ) -> None:
    """Raise ``ValueError`` when ``job`` cannot do what ``cfg`` asks: a setting it does not
    implement, or a policy backend that cannot run here (checked only on a local Ray: under
    ``ray job submit`` the policy replicas may run on GPU nodes that have vLLM)."""
    for key, allowed in job.supports.items():
        value = get_path(cfg, key)
        if value not in allowed:
            raise ValueError(
                f"{key}={value!r} is not supported by the {job.name} job; it supports: {', '.join(map(str, allowed))}"
            )
    # Every job runs the task policy (D1 labels, rollouts, the evaluation), so its backend must run.
    if not joins_cluster(cfg.run.ray_address, environ):
        problem = cfg.policy.unavailable_here()
        if problem:
            raise ValueError(problem)
