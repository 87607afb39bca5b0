"""What every job script does first: parse ``--config FILE`` plus dotted overrides and check
that the job can do what the config asks (the benchmark then resolves its data:
:meth:`memprism_ray.benchmark.Benchmark.prepare`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from memprism_ray.benchmark.job_spec import JobSpec, check_job
from memprism_ray.cluster.placement import check_uploaded
from memprism_ray.config import ExperimentConfig, load_config
from memprism_ray.config_tree import describe


def parse_job_args(
    description: str,
    argv: Sequence[str] | None = None,
    *,
    job: JobSpec | None = None,
    evaluation: bool = False,
    resumable: bool = True,
) -> tuple[argparse.Namespace, ExperimentConfig]:
    """``--config FILE [--resume auto|PATH] [--section.key VALUE ...]`` -> (args, config).

    With ``job`` (the benchmark's :class:`JobSpec`), also :func:`check_job`: everything is rejected
    here, before Ray starts or D1 runs. ``evaluation``: the evaluation jobs' ``--checkpoint``
    (the Router to evaluate) and ``--out`` (the report directory). A job that is not
    ``resumable`` refuses ``--resume`` rather than ignore it."""
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
    if evaluation:  # `~`: this node's home, as in run.out_dir (`ray job submit` quotes its arguments)
        args.checkpoint = os.path.expanduser(args.checkpoint)
        args.out = os.path.expanduser(args.out)
    if args.help_config:
        print_config_help()
        sys.exit(0)
    overrides = list(rest)
    if args.resume is not None:
        overrides += ["--run.resume", args.resume]
    try:
        cfg = load_config(args.config, overrides)
        for what, value in (
            ("init_checkpoint", cfg.init_checkpoint),
            ("--checkpoint", getattr(args, "checkpoint", "")),
            ("--resume", "" if cfg.run.resume == "auto" else cfg.run.resume),
        ):
            check_uploaded(value, what)
        # Asked on the command line, not a run's own config.yaml (a resumed run's says auto).
        asked = args.resume is not None or any(a.split("=")[0] == "--run.resume" for a in rest)
        if asked and not resumable:
            raise ValueError(
                "--resume continues a GRPO run and this job has none: D1 reuses the stages it finished by "
                "itself, an evaluation writes a new report directory"
            )
        if job is not None:
            check_job(job, cfg)
    except ValueError as exc:
        parser.error(str(exc))
    return args, cfg


def print_config_help() -> None:
    """``--help-config``: every setting of the config tree, its default and help."""
    for name, default, help_ in describe(ExperimentConfig):
        print(f"--{name:<40} {default:<28} {help_}")
