"""Grouped GRPO for the MemPrism Router on ALFWorld (paper "Adapter", outcome-guided
optimisation; Table A.4 "D1, ALFWorld" and "GRPO, ALFWorld"; docs/architecture.md).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_alfworld.py --config configs/local.yaml --run.out_dir '~/runs'
    python jobs/grpo_alfworld.py --config configs/local.yaml          # starts a local Ray
    python jobs/grpo_alfworld.py --config configs/local.yaml --resume auto

Games: an ALFWorld tree, or the embedded corpus generated from alfworld's layouts. Without
``init_checkpoint`` D1 builds the reference policy first (the handcoded expert and the task
policy's roll-ins -> counterfactual view labels -> supervised Router); then
``grpo.iterations`` of grouped GRPO on the rollout workers, and the final evaluation of
``eval.conditions`` on the same episodes, printed as one table against the trained Router.
The whole pipeline is :func:`memprism_ray.trainer.fit`.
"""

from __future__ import annotations

import sys

from memprism_ray.trainer import grpo_job


def main(argv: list[str] | None = None) -> int:
    return grpo_job("alfworld", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
