"""Grouped GRPO for the MemPrism Router on EB-ALFRED (paper "Adapter"; Table A.4 "D1,
ALFRED path" and "GRPO, ALFRED path": 30 steps, reward success + 0.2 x goal-condition
progress, no entropy bonus; docs/ebalfred.md).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_ebalfred.py --config configs/ebalfred_paper.yaml --run.out_dir '~/runs'
    python jobs/grpo_ebalfred.py --config configs/ebalfred_smoke.yaml --init_checkpoint CKPT   # CPU

D1 plays the expert plans of the training episodes (their ALFRED annotations, or the
fixture's recorded plans) and labels them with the LLM view teacher; the final evaluation
reports SR per subset and the average. The pipeline is :func:`memprism_ray.trainer.fit`.
"""

from __future__ import annotations

import sys

from memprism_ray.trainer import grpo_job


def main(argv: list[str] | None = None) -> int:
    return grpo_job("ebalfred", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
