"""N random fault schedules against one short GRPO job on a local cluster (issue 40 item 8):
survived / N, trajectories lost, iterations replayed and seconds added.

A head of 0 CPUs and ``--nodes`` worker nodes of 1 CPU, each with disks of its own where this
machine allows it (root: an empty tmpfs per node over the cache and run folders, as
``tests/cluster`` does), run the ALFWorld job on a tiny embedded corpus (6 training games, 2
groups x 3 trajectories, 8 steps). One undisturbed run makes the D1 checkpoint and the final
weights to compare with; a second, from that D1 checkpoint, the time to compare with. Then each
schedule (:func:`memprism_ray.testing.chaos.random_schedule`, seeded: ``--seed + i``) kills a
rollout worker, an EnvWorker, a worker node and the Learner's node, each once, at random
points of a run from the same D1 checkpoint; a killed node is replaced by a fresh one.

A schedule survived when its job SUCCEEDED and its final weights equal the undisturbed run's,
bit for bit. Trajectories lost: those an iteration's update had to leave out (every group is
re-run or replayed, so 0 is the target); seconds added: the run's wall time over the
undisturbed one from the same checkpoint (median and range).

    .venv/bin/python benchmarks/bench_chaos.py [--schedules 20] [--seed 0] [--iterations 6]

The last stdout line is ``RESULT {json}``, recorded in ``benchmarks/results/bench_chaos.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import ROOT, write_result

from memprism_ray.adapter.checkpoint import WEIGHTS_FILE
from memprism_ray.config_tree import int_at_least
from memprism_ray.testing.chaos import ChaosMonkey, grpo_rows, random_schedule
from memprism_ray.testing.local_cluster import LocalCluster, can_isolate_disks

#: Node failures detected in about a second (Ray's default health checks take about 15 s).
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "300", "RAY_health_check_failure_threshold": "3"}
GROUPS, GROUP_SIZE = 2, 3


def job_args(corpus_cache: Path, runs: Path, name: str, iterations: int, *extra: str) -> list[str]:
    return [
        "--config", "configs/local.yaml",
        "--corpus.cache_dir", str(corpus_cache), "--corpus.train_games", "6", "--corpus.eval_games", "6",
        "--corpus.seed", "11", "--run.out_dir", str(runs), "--run.name", name, "--run.tensorboard", "false",
        "--run.call_timeout_s", "120", "--run.checkpoint_every", "1",
        "--agent.max_steps", "8", "--grpo.iterations", str(iterations),
        "--grpo.groups_per_iteration", str(GROUPS), "--grpo.group_size", str(GROUP_SIZE),
        "--grpo.update_batch_size", "16", "--grpo.replay_first", "0", "--rollout.env_slots_per_worker", "3",
        "--rollout.num_workers", "auto", "--eval.enabled", "false",
        *extra,
    ]  # fmt: skip


def weights(run: Path, iterations: int) -> str:
    path = run / "checkpoints" / f"iter_{iterations:04d}" / WEIGHTS_FILE
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schedules", type=int_at_least(1), default=20, help="random schedules to play")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="schedule i is random_schedule(seed + i)")
    p.add_argument("--iterations", type=int_at_least(1), default=6, help="GRPO iterations per run")
    p.add_argument("--nodes", type=int_at_least(1), default=2, help="worker nodes of 1 CPU")
    p.add_argument("--keep", action="store_true", help="keep the runs' folder (printed)")
    args = p.parse_args()
    # A SIGTERM (a timeout, a kill) unwinds through the finally below: the cluster is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    tmp = Path(tempfile.mkdtemp(prefix="memprism-chaos-"))
    cache, runs, corpus = tmp / "cache", tmp / "runs", tmp / "corpus"
    for d in (cache, runs, corpus):
        d.mkdir()
    why = can_isolate_disks()
    private = () if why else (cache, runs, corpus)
    print(f"chaos: worker nodes {'with disks of their own' if private else 'sharing this disk (' + why + ')'}")
    cluster = LocalCluster(tmp / "ray", env={"MEMPRISM_CACHE": str(cache), **FAST_HEALTH_CHECKS})
    env = {**os.environ, **cluster.driver_env(), "MEMPRISM_CACHE": str(cache), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}

    def add_node() -> Any:
        return cluster.add_node(1, private_dirs=private)

    def run(name: str, extra: list[str], faults: list | None = None) -> tuple[int, float, list[dict[str, Any]]]:
        log = tmp / f"{name}.log"
        t0 = time.monotonic()
        with log.open("w") as fh:
            job = subprocess.Popen(
                [sys.executable, "jobs/grpo_alfworld.py", *job_args(corpus, runs, name, args.iterations, *extra)],
                cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
            )  # fmt: skip
            done = ChaosMonkey(cluster, runs / name, add_node, log=print).play(faults or [], job)
            job.wait(timeout=1200)
        return job.returncode, time.monotonic() - t0, done

    records: list[dict[str, Any]] = []
    try:
        for _ in range(args.nodes):
            add_node()
        d1_args = ["--label.games", "1", "--label.rollin_games", "0", "--label.workers", "1", "--sft.epochs", "1"]
        status, _, _ = run("reference", d1_args)
        if status != 0:
            print(f"the undisturbed reference run failed (exit {status}); see {tmp / 'reference.log'}")
            return 1
        d1 = str(next((runs / "reference" / "d1").glob("*/checkpoint")))
        expected = weights(runs / "reference", args.iterations)
        status, base_s, _ = run("undisturbed", ["--init_checkpoint", d1])
        print(f"chaos: undisturbed run from D1 in {base_s:.0f} s (exit {status})")
        for i in range(args.schedules):
            for node in [n for n in cluster.nodes if not n.alive()]:
                cluster.nodes.remove(node)  # killed by the last schedule; replacements are up
            faults = random_schedule(args.seed + i, args.iterations)
            name = f"chaos-{i:02d}"
            status, seconds, done = run(name, ["--init_checkpoint", d1], faults)
            rows = grpo_rows(runs / name)
            played = sum(r["trajectories"] - r["failed_excluded"] for r in rows)
            record = {
                "schedule": i,
                "faults": done,
                "status": status,
                "same_weights": weights(runs / name, args.iterations) == expected,
                "trajectories_lost": args.iterations * GROUPS * GROUP_SIZE - played,
                "iterations_replayed": sum(r.get("iterations_replayed", 0) for r in rows),
                "learner_restarts": sum(r.get("learner_restarts", 0) for r in rows),
                "seconds_added": round(seconds - base_s, 1),
            }
            record["survived"] = status == 0 and record["same_weights"]
            records.append(record)
            shown = {k: v for k, v in record.items() if k != "faults"}
            print(f"chaos: schedule {i + 1}/{args.schedules}: {json.dumps(shown)}")
    finally:
        cluster.shutdown()
        if args.keep:
            print(f"chaos: runs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    added = [r["seconds_added"] for r in records]
    result = {
        "schedules": len(records),
        "survived": sum(r["survived"] for r in records),
        "trajectories_lost": sum(r["trajectories_lost"] for r in records),
        "iterations_replayed": sum(r["iterations_replayed"] for r in records),
        "learner_restarts": sum(r["learner_restarts"] for r in records),
        "faults_fired": sum(f["fired"] for r in records for f in r["faults"]),
        "faults_planned": sum(len(r["faults"]) for r in records),
        "seconds_added_median": statistics.median(added) if added else None,
        "seconds_added_range": [min(added), max(added)] if added else None,
        "undisturbed_seconds": round(base_s, 1),
        "iterations": args.iterations,
        "private_disks": bool(private),
        "runs": records,
    }
    print("RESULT " + json.dumps({k: v for k, v in result.items() if k != "runs"}))
    write_result("bench_chaos", result)
    return 0 if result["survived"] == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
