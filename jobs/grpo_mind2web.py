"""Grouped GRPO for the MemPrism Router on Mind2Web under teacher-forced replay (paper
"Adapter"; appendix "Training dataset setup"; Table A.4 "D1, Mind2Web" and "GRPO, Mind2Web";
docs/mind2web.md).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_mind2web.py --config configs/mind2web_paper.yaml --run.out_dir '~/runs'
    python jobs/grpo_mind2web.py --config configs/mind2web_smoke.yaml      # CPU, the fixture

D1 labels the human trajectories of the training split with the view teacher; a
trajectory's return is its decisions' mean 1[action correct]; the final evaluation reports
the Mind2Web metrics per test split. The pipeline is :func:`memprism_ray.trainer.fit`.
"""

from __future__ import annotations

import sys

from memprism_ray.trainer import grpo_job


def main(argv: list[str] | None = None) -> int:
    return grpo_job("mind2web", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
