"""Grouped GRPO for the MemPrism Router on ALFWorld (paper "Adapter", outcome-guided
optimisation; Table A.4 "D1, ALFWorld" and "GRPO, ALFWorld"; docs/architecture.md).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_alfworld.py --config configs/local.yaml
    python jobs/grpo_alfworld.py --config configs/local.yaml          # starts a local Ray
    python jobs/grpo_alfworld.py --config configs/local.yaml --resume auto

Games: an ALFWorld tree, or the embedded corpus generated from alfworld's layouts. D1 (unless
``init_checkpoint``), GRPO and the final evaluation: :func:`memprism_ray.trainer.fit`.
"""

import sys
from functools import partial

from memprism_ray.trainer import grpo_job

main = partial(grpo_job, "alfworld", __doc__.split("\n\n")[0])  # main(argv): the job's exit status

if __name__ == "__main__":
    sys.exit(main())
