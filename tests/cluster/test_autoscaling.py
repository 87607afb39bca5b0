"""Autoscaling from zero worker nodes (issue 34 item 5): a head of 0 CPUs and no worker node,
Ray's fake multi-node autoscaler allowed up to two 1-CPU nodes. The job's pending actors (D1's
tasks, the Learner, the rollout seats) are the demand it acts on; nothing falls back to the
head. Its nodes are processes of the head's monitor on this machine's disk (the fake provider
starts them itself), so this cluster has no private disks: the disk tests are
test_multinode_jobs.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_rig import ROOT, grpo_rows, placement

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_the_job_makes_the_autoscaler_add_nodes_from_zero(
    memprism_tiny_corpus: Path, actors_reference_ckpt: Path, tmp_path: Path
) -> None:
    from memprism_ray.testing.local_cluster import LocalCluster

    autoscale = {"cpu-1": {"resources": {"CPU": 1}, "max_workers": 2}}
    with LocalCluster(tmp_path / "ray", autoscale=autoscale) as cluster:
        env = {**os.environ, **cluster.driver_env(), "RAY_USAGE_STATS_ENABLED": "0"}
        args = [
            "--config", "configs/local.yaml", "--corpus.data_root", str(memprism_tiny_corpus),
            "--run.out_dir", str(tmp_path / "runs"), "--run.name", "autoscaled", "--run.tensorboard", "false",
            "--run.call_timeout_s", "120", "--init_checkpoint", str(actors_reference_ckpt),
            "--grpo.iterations", "1", "--grpo.groups_per_iteration", "2", "--grpo.group_size", "2",
            "--agent.max_steps", "6", "--rollout.num_workers", "auto",
            "--rollout.env_slots_per_worker", "2", "--eval.enabled", "false",
        ]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "jobs/grpo_alfworld.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
    run = tmp_path / "runs" / "autoscaled"
    where = placement(run)
    head = {n["node_id"] for n in where["nodes"] if n["resources"].get("CPU", 0) == 0}
    used = {a["node_id"] for a in where["actors"]}
    assert used and not used & head  # every actor on a node the autoscaler added
    assert "cluster {" in out and "'CPU'" not in out.split("cluster {", 1)[1].split("}", 1)[0]  # started with none
    assert grpo_rows(run)[0]["trajectories"] == 4
