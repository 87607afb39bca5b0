"""What every job script does first: parse ``--config FILE`` plus dotted overrides and check
that the job can do what the config asks (the benchmark then resolves its data:
:meth:`memprism_ray.benchmark.Benchmark.prepare`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memprism_ray.config import ExperimentConfig, load_config
from memprism_ray.config_tree import describe


@dataclass(frozen=True)
class JobSpec:
    """What one job can do, where the config tree accepts more (issue 10: a setting a job
    would silently ignore is an error at load time). A benchmark declares its jobs'
    (:meth:`memprism_ray.benchmark.Benchmark.job_spec`), beyond its own checks
    (:meth:`memprism_ray.benchmark.Benchmark.check`: the benchmark keys and ``grpo.reward``)."""

    name: str
    """the job, as its refusals name it (``grpo_alfworld``)"""
    supports: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """dotted config key -> the values this job implements"""
    runs_policy: bool = False
    """whether the job runs the task policy (then its backend must be able to run)"""


def _dotted(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_job(job: JobSpec, cfg: ExperimentConfig, environ: Mapping[str, str] | None = None) -> None:
    """Raise ``ValueError`` (one line: key, value, what is allowed) when ``job`` cannot do what
    ``cfg`` asks: a setting it does not implement, or a policy backend that cannot run here.

    The backend is checked only when the job's actors run on this machine (a local Ray);
    under ``ray job submit`` the driver may sit on a CPU head while the policy replicas run on
    GPU nodes that have vLLM."""
    for key, allowed in job.supports.items():
        value = _dotted(cfg, key)
        if value not in allowed:
            raise ValueError(
                f"{key}={value!r} is not supported by the {job.name} job; it supports: {', '.join(map(str, allowed))}"
            )
    environ = os.environ if environ is None else environ
    joins_cluster = cfg.run.ray_address == "auto" and bool(environ.get("RAY_ADDRESS"))
    if job.runs_policy and not joins_cluster:
        problem = cfg.policy.unavailable_here()
        if problem:
            raise ValueError(problem)


def parse_job_args(
    description: str, argv: Sequence[str] | None = None, *, job: JobSpec | None = None, evaluation: bool = False
) -> tuple[argparse.Namespace, ExperimentConfig]:
    """``--config FILE [--resume auto|PATH] [--section.key VALUE ...]`` -> (args, config).

    With ``job`` (the benchmark's :class:`JobSpec`), also :func:`check_job`: everything is rejected
    here, before Ray starts or D1 runs. ``evaluation``: the evaluation jobs' ``--checkpoint``
    (the Router to evaluate) and ``--out`` (the report directory)."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog="Any other --section.key VALUE overrides one setting of the config tree (see --help-config).",
    )
    parser.add_argument("--config", default=None, help="YAML preset (configs/local.yaml, configs/alfworld_paper.yaml)")
    parser.add_argument("--resume", default=None, help="'auto' (latest checkpoint of the run) or a checkpoint path")
    parser.add_argument("--help-config", action="store_true", help="list every setting with its default and exit")
    if evaluation:
        parser.add_argument("--checkpoint", default="", help="Router checkpoint directory (D1 or D2) to evaluate")
        parser.add_argument("--out", default="", help="report directory ('' : <run dir>/eval)")
    args, rest = parser.parse_known_args(argv)
    if args.help_config:
        for name, default, help_ in describe(ExperimentConfig):
            print(f"--{name:<40} {default:<28} {help_}")
        sys.exit(0)
    overrides = list(rest)
    if args.resume is not None:
        overrides += ["--run.resume", args.resume]
    try:
        cfg = load_config(args.config, overrides)
        if job is not None:
            check_job(job, cfg)
    except ValueError as exc:
        parser.error(str(exc))
    return args, cfg
