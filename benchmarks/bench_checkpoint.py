"""What a Learner checkpoint costs, against what losing the Learner costs (issue 40: "checkpoint
often enough by default that a loss costs at most a few iterations, and say the trade-off").

Times, over ``--rounds`` repetitions, the two halves of ``run.checkpoint_every``'s work at the
end of an iteration: the Learner's side (:func:`memprism_ray.actors.learner.checkpoint_files`:
save the Router and the GRPO optimizer state, hash the weights, read the files back) and the
driver's (:func:`memprism_ray.io_atomic.write_files` into the run directory), for the
embedded default's Router after one GRPO update (so the optimizer holds its state). With
``--run DIR`` (a finished run, e.g. ``runs/local`` of ``make run``) it reads the iterations'
wall time from ``metrics.jsonl`` and prints, per ``checkpoint_every`` K, the time added per
iteration (checkpoint seconds / K / iteration seconds) and the iterations a lost Learner
replays (at most K - 1 whole ones, plus the one it was playing).

    .venv/bin/python benchmarks/bench_checkpoint.py --run runs/local [--rounds 5]

The last stdout line is ``RESULT {json}``, recorded in ``benchmarks/results/bench_checkpoint.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _results import write_result
from bench_router_training import grpo_batch

from memprism_ray.actors.learner import checkpoint_files
from memprism_ray.adapter.grpo_update import GRPOConfig, GRPOUpdater
from memprism_ray.config_tree import int_at_least
from memprism_ray.io_atomic import write_files
from memprism_ray.router.model import RouterConfig, ViewPolicyModel


def iteration_seconds(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [float(r["iteration_seconds"]) for r in rows if r.get("kind") == "grpo"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int_at_least(1), default=5, help="repetitions")
    parser.add_argument(
        "--decisions", type=int_at_least(1), default=631, help="decisions of the update before (make run: ~630)"
    )
    parser.add_argument("--run", type=Path, default=None, help="a finished run whose iteration times to compare")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = ViewPolicyModel(RouterConfig())
    updater = GRPOUpdater(model, copy.deepcopy(model), GRPOConfig(device="cpu", update_batch_size=512))
    updater.update(grpo_batch(args.decisions, np.random.default_rng(0)))

    learner_s, driver_s, sizes = [], [], []
    out = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    try:
        for r in range(args.rounds):
            t0 = time.perf_counter()
            ck = checkpoint_files(model, updater, {"reference": "bench"})
            t1 = time.perf_counter()
            write_files(ck["files"], out / f"iter_{r:04d}")
            t2 = time.perf_counter()
            learner_s.append(t1 - t0)
            driver_s.append(t2 - t1)
            sizes.append(sum(len(b) for b in ck["files"].values()))
            print(
                f"round {r + 1}/{args.rounds}: learner {t1 - t0:.2f} s, driver {t2 - t1:.2f} s, "
                f"{sizes[-1] / 1e6:.1f} MB"
            )
    finally:
        shutil.rmtree(out, ignore_errors=True)
    total = [a + b for a, b in zip(learner_s, driver_s, strict=True)]
    result: dict[str, Any] = {
        "checkpoint_s_median": round(statistics.median(total), 3),
        "checkpoint_s_range": [round(min(total), 3), round(max(total), 3)],
        "learner_side_s_median": round(statistics.median(learner_s), 3),
        "driver_side_s_median": round(statistics.median(driver_s), 3),
        "checkpoint_mb": round(statistics.median(sizes) / 1e6, 1),
        "rounds": args.rounds,
    }
    if args.run is not None:
        its = iteration_seconds(args.run)
        it_s = statistics.median(its)
        result["run"] = str(args.run)
        result["iteration_s_median"] = round(it_s, 2)
        result["iteration_s_range"] = [round(min(its), 2), round(max(its), 2)]
        result["per_checkpoint_every"] = {
            k: {
                "added_per_iteration_pct": round(100 * result["checkpoint_s_median"] / k / it_s, 2),
                "replayed_at_most": k,
                "disk_mb_per_iteration": round(result["checkpoint_mb"] / k, 1),
            }
            for k in (1, 2, 5)
        }
        for k, v in result["per_checkpoint_every"].items():
            print(
                f"checkpoint_every {k}: +{v['added_per_iteration_pct']}% per iteration, a lost Learner replays at "
                f"most {k} iteration(s) of {it_s:.1f} s, {v['disk_mb_per_iteration']} MB of checkpoints per iteration"
            )
    print("RESULT " + json.dumps(result))
    write_result("bench_checkpoint", result)


if __name__ == "__main__":
    main()
