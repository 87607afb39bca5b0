"""Distributed Mind2Web evaluation under teacher-forced replay (paper "Benchmarks": step
action accuracy and exact episode success on Test-Task, Test-Website and Test-Domain;
docs/mind2web.md).

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/eval_mind2web.py --config configs/mind2web_paper.yaml \
        --run.out_dir '~/runs' --checkpoint '~/runs/mind2web-paper/checkpoints/iter_0150' \
        --eval.conditions memprism,full_history
    python jobs/eval_mind2web.py --config configs/mind2web_smoke.yaml --eval.conditions no_memory,full_history

Every condition plays the same ordered plan (each task of each split of
``mind2web.eval_splits`` once). The policy predicts one action per recorded human step; the
step is scored and replay advances with the human action. Reports go to ``<run>/eval/`` (or
``--out``): per condition ``report.md`` (generic efficiency and view statistics plus the
Mind2Web table) and ``mind2web.md`` (conditions side by side per split, Wilson intervals,
paired differences against the first condition). When any episode failed the job exits 1.
"""

from __future__ import annotations

import sys

from memprism_ray.trainer import evaluate_job


def main(argv: list[str] | None = None) -> int:
    return evaluate_job("mind2web", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
