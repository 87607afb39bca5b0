"""What every job script does first: parse ``--config FILE`` plus dotted overrides, and
resolve the games (an ALFWorld data root, or the embedded corpus built on first use)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memprism_ray.config import ExperimentConfig, load_config
from memprism_ray.config_tree import describe


def parse_job_args(description: str, argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, ExperimentConfig]:
    """``--config FILE [--resume auto|PATH] [--section.key VALUE ...]`` -> (args, config)."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog="Any other --section.key VALUE overrides one setting of the config tree (see --help-config).",
    )
    parser.add_argument("--config", default=None, help="YAML preset (configs/local.yaml, configs/alfworld_paper.yaml)")
    parser.add_argument("--resume", default=None, help="'auto' (latest checkpoint of the run) or a checkpoint path")
    parser.add_argument("--help-config", action="store_true", help="list every setting with its default and exit")
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
    except ValueError as exc:
        parser.error(str(exc))
    return args, cfg


def resolve_corpus(cfg: ExperimentConfig, log: Any = print) -> ExperimentConfig:
    """The config with ``corpus.data_root`` set to a real ALFWorld tree.

    ``corpus.data_root`` or ``$ALFWORLD_DATA`` when set; otherwise the embedded corpus of
    ALFWorld-style games generated from the layouts shipped in the ``alfworld`` package,
    built on first use and cached.
    """
    root = cfg.corpus.data_root or _official_root()
    if not root:
        from memprism_ray.envs.alfworld import ensure_default_corpus

        c = cfg.corpus
        name = f"alfworld-corpus-s{c.seed}-t{c.train_games}-e{c.eval_games}"
        cache = Path(c.cache_dir) / name if c.cache_dir else None
        log(
            f"games: embedded corpus ({cfg.corpus.train_games} train, {cfg.corpus.eval_games} per eval split, "
            f"seed {cfg.corpus.seed}); built on first use"
        )
        root = str(
            ensure_default_corpus(cache, train=cfg.corpus.train_games, eval=cfg.corpus.eval_games, seed=cfg.corpus.seed)
        )
    log(f"games: {root}")
    from memprism_ray.envs.alfworld.data import resolve_data_root

    root = str(resolve_data_root(root))  # checked: a clear error if it holds no games
    return dataclasses.replace(cfg, corpus=dataclasses.replace(cfg.corpus, data_root=root))


def _official_root() -> str:
    """``$ALFWORLD_DATA`` unless it is alfworld's own empty placeholder folder."""
    env = os.environ.get("ALFWORLD_DATA", "")
    if not env:
        return ""
    from memprism_ray.envs.alfworld.data import _is_alfworld_placeholder

    path = Path(os.path.expandvars(env)).expanduser()
    return "" if _is_alfworld_placeholder(path) else str(path)
