"""View-teacher labels over expert trajectories, the D1 data (paper "Adapter", eq.
view-teacher; appendix A.3 "Cold-start distillation").

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/label_views.py --config configs/local.yaml
    python jobs/label_views.py --config configs/local.yaml --label.games 32

Plays ALFWorld's handcoded expert on ``label.games`` training games, lets the task policy play
``label.rollin_games`` more itself (roll-ins, as the GRPO job's D1 does) and labels every
decision state with the counterfactual view teacher (the frozen task policy shown each of
the 144 views), spread over Ray tasks. Writes ``<run>/d1/<key>/expert_trajectories.parquet`` and
``<run>/d1/<key>/labels.parquet`` (Router features + 144-way soft labels); stages already done
are reused.
"""

from __future__ import annotations

import sys

from memprism_ray.actors.d1 import build_d1_data
from memprism_ray.actors.placement import init_ray
from memprism_ray.envs.alfworld import list_games
from memprism_ray.pipeline.jobs import parse_job_args, resolve_corpus
from memprism_ray.pipeline.run_dir import d1_dir as d1_dir_for


def say(msg: str) -> None:
    print(f"[label] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    _, cfg = parse_job_args(__doc__.split("\n\n")[0], argv)
    init_ray(cfg.run.ray_address, cfg.run.num_cpus)
    cfg = resolve_corpus(cfg, say)
    d1_dir = d1_dir_for(cfg.run.dir, cfg)  # keyed by the config sections that make D1 (as in the GRPO job)
    # All training games: the first label.games are the expert's, the next label.rollin_games the roll-ins'.
    games = list_games(cfg.corpus.train_split, cfg.corpus.data_root)
    labels = build_d1_data(cfg, games, d1_dir, say)
    say(f"done: {labels}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
