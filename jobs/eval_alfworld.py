"""Distributed evaluation of any condition on an ALFWorld split (paper appendix C), with
the same report as ``memprism eval``: Wilson intervals, per-type SR, efficiency, SR and
prompt tokens by trajectory length, view marginals, paired bootstrap differences.

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/eval_alfworld.py --config configs/local.yaml \
        --run.out_dir '~/runs' --checkpoint '~/runs/local/checkpoints/iter_0010' \
        --eval.conditions memprism,freq_random,fixed:TemporalTrace,full_history

Conditions: no_memory, full_history, recent4, fixed:TAU, fixed_text:TAU, memprism,
memprism_text, freq_random (after memprism: samples its measured view marginal),
constrained:FACTOR=VALUE. Reports go to ``<run>/eval/`` (or ``--out``). Every episode of
the plan is reported; when any failed (a broken game, a crashed episode or worker) they
count as failures and the job exits with status 1.
"""

from __future__ import annotations

import sys

from memprism_ray.trainer import evaluate_job


def main(argv: list[str] | None = None) -> int:
    return evaluate_job("alfworld", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
