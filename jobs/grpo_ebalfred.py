"""Grouped GRPO for the MemPrism Router on EB-ALFRED (paper "Adapter"; Table A.4 "D1,
ALFRED path" and "GRPO, ALFRED path": 30 steps, reward success + 0.2 x goal-condition
progress, no entropy bonus; docs/ebalfred.md).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_ebalfred.py --config configs/ebalfred_paper.yaml
    python jobs/grpo_ebalfred.py --config configs/ebalfred_smoke.yaml --init_checkpoint CKPT   # CPU

D1 labels the expert plans of the training episodes with the LLM view teacher; the pipeline
is :func:`memprism_ray.trainer.fit`.
"""

import sys
from functools import partial

from memprism_ray.trainer import grpo_job

main = partial(grpo_job, "ebalfred", __doc__.split("\n\n")[0])  # main(argv): the job's exit status

if __name__ == "__main__":
    sys.exit(main())
