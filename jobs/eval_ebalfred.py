"""Distributed evaluation on EB-ALFRED (paper "Benchmarks": per-subset success rate and
average SR over Base, Common, Complex, Visual, Spatial, Long), any condition:

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/eval_ebalfred.py --config configs/ebalfred_paper.yaml --run.out_dir '~/runs' \
        --checkpoint '~/runs/ebalfred-paper/checkpoints/iter_0100'
    python jobs/eval_ebalfred.py --config configs/ebalfred_smoke.yaml     # CPU, fake controller

The EvalWorker actors of the ALFWorld evaluation play the episodes (env, rule Phi and
policy built from corpus.benchmark: ebalfred). Reports go to ``<run>/eval/`` (or
``--out``): each condition's standard report plus ``summary.md`` with SR per subset and the
average. Every planned episode is reported; when any failed the job exits with status 1.
"""

from __future__ import annotations

import sys

from memprism_ray.trainer import evaluate_job


def main(argv: list[str] | None = None) -> int:
    return evaluate_job("ebalfred", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
