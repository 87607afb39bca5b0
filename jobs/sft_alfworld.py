"""D1: supervised distillation of the Router from view-teacher labels (paper "Adapter",
eq. sft-loss; Table A.4 "D1, ALFWorld": AdamW 1e-4, wd 0.01, batch 256, grad-norm 1.0,
cosine to 0.01, seed 7, 50 epochs, lambda_cost 0.02).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/sft_alfworld.py --config configs/local.yaml
    python jobs/sft_alfworld.py --config configs/local.yaml --sft.epochs 50

Reads ``<run>/d1/<key>/labels.parquet`` (``jobs/label_views.py``; built here first when absent)
and writes the D1 checkpoint ``<run>/d1/<key>/checkpoint`` (the reference policy of GRPO). The
update runs on a GPU when the cluster has one.
"""

from __future__ import annotations

import sys

from memprism_ray.actors.d1 import run_d1
from memprism_ray.actors.placement import init_ray
from memprism_ray.envs.alfworld import list_games
from memprism_ray.pipeline.jobs import parse_job_args, resolve_corpus
from memprism_ray.pipeline.run_dir import d1_dir


def say(msg: str) -> None:
    print(f"[sft] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    _, cfg = parse_job_args(__doc__.split("\n\n")[0], argv)
    init_ray(cfg.run.ray_address, cfg.run.num_cpus)
    cfg = resolve_corpus(cfg, say)
    games = list_games(cfg.corpus.train_split, cfg.corpus.data_root)
    ckpt = run_d1(cfg, games, d1_dir(cfg.run.dir, cfg), say)
    say(f"D1 checkpoint: {ckpt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
