"""Grouped GRPO for the MemPrism Router on Mind2Web under teacher-forced replay (paper
"Adapter"; appendix "Training dataset setup"; Table A.4 "D1, Mind2Web" and "GRPO, Mind2Web";
docs/mind2web.md).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/grpo_mind2web.py --config configs/mind2web_paper.yaml
    python jobs/grpo_mind2web.py --config configs/mind2web_smoke.yaml      # CPU, the fixture

A trajectory's return is its decisions' mean 1[action correct]; the pipeline is
:func:`memprism_ray.trainer.fit`.
"""

import sys
from functools import partial

from memprism_ray.trainer import grpo_job

main = partial(grpo_job, "mind2web", __doc__.split("\n\n")[0])  # main(argv): the job's exit status

if __name__ == "__main__":
    sys.exit(main())
