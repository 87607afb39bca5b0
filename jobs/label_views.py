"""View-teacher labels over expert trajectories, the D1 data (paper "Adapter", eq.
view-teacher; appendix A.3 "Cold-start distillation").

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/label_views.py --config configs/local.yaml --run.out_dir '~/runs'
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

from memprism_ray.trainer import d1_job


def main(argv: list[str] | None = None) -> int:
    return d1_job("alfworld", __doc__.split("\n\n")[0], argv, train=False)


if __name__ == "__main__":
    sys.exit(main())
