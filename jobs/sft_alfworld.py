"""D1: supervised distillation of the Router from view-teacher labels (paper "Adapter",
eq. sft-loss; Table A.4 "D1, ALFWorld": AdamW 1e-4, wd 0.01, batch 256, grad-norm 1.0,
cosine to 0.01, seed 7, 50 epochs, lambda_cost 0.02).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/sft_alfworld.py --config configs/local.yaml --run.out_dir '~/runs'
    python jobs/sft_alfworld.py --config configs/local.yaml --sft.epochs 50

Reads ``<run>/d1/<key>/labels.parquet`` (``jobs/label_views.py``; built here first when absent)
and writes the D1 checkpoint ``<run>/d1/<key>/checkpoint`` (the reference policy of GRPO). The
update runs on a GPU when the cluster has one.
"""

from __future__ import annotations

import sys

from memprism_ray.trainer import d1_job


def main(argv: list[str] | None = None) -> int:
    return d1_job("alfworld", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
