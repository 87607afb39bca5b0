"""Distributed evaluation on EB-ALFRED (paper "Benchmarks": per-subset success rate and
average SR over Base, Common, Complex, Visual, Spatial, Long), any condition:

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/eval_ebalfred.py --config configs/ebalfred_paper.yaml \
        --checkpoint runs/ebalfred-paper/checkpoints/iter_0100
    python jobs/eval_ebalfred.py --config configs/ebalfred_smoke.yaml     # CPU, fake controller

Reports go to ``<run>/eval/`` (or ``--out``): each condition's report plus ``summary.md``
with SR per subset and the average. When any planned episode failed the job exits with status 1.
"""

import sys
from functools import partial

from memprism_ray.trainer import evaluate_job

main = partial(evaluate_job, "ebalfred", __doc__.split("\n\n")[0])  # main(argv): the job's exit status

if __name__ == "__main__":
    sys.exit(main())
