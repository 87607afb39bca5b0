"""The benchmarks' own data on a cluster whose worker nodes cannot see the driver's disk
(issue 34 items 1-5): the EB-ALFRED and Mind2Web fixtures the driver builds are shipped to the
nodes; user data missing on the nodes is refused in one line naming the node, the path and the
fix. A module of its own beside test_multinode_jobs.py, so the two share the machine's cores
when the suite runs in parallel (each gets the package's cluster in its worker).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_rig import placement

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_user_data_missing_on_the_nodes_is_one_line(
    rig, memprism_tiny_corpus: Path, actors_reference_ckpt: Path, tmp_path: Path
) -> None:
    """``corpus.data_root`` given by the user exists on the driver only: the job refuses where
    the first actor starts, naming the node, the path and the fix; exit 1, no traceback."""
    rig.ensure_nodes(1)
    ref = actors_reference_ckpt
    args = [
        "--config", "configs/local.yaml", "--corpus.data_root", str(memprism_tiny_corpus),
        "--run.out_dir", str(rig.runs), "--run.name", "userdata", "--run.tensorboard", "false",
        "--run.call_timeout_s", "60", "--init_checkpoint", str(ref), "--grpo.groups_per_iteration", "1",
        "--grpo.group_size", "2", "--rollout.num_workers", "1", "--rollout.env_slots_per_worker", "2",
    ]  # fmt: skip
    status, out = rig.run_job("grpo_alfworld.py", args, tmp_path / "userdata.log")
    assert status == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("[grpo] error:")]
    assert len(errors) == 1, out[-3000:]
    assert f"corpus.data_root {memprism_tiny_corpus} does not exist on node " in errors[0]
    assert "mount it at this path on every node" in errors[0]
    assert "Traceback" not in out


def test_ebalfred_fixture_job_on_the_cluster(rig, actors_reference_ckpt: Path, tmp_path: Path) -> None:
    """The fixture is built in the driver's run directory; the nodes get it shipped."""
    rig.ensure_nodes(2)
    args = [
        "--config", "configs/ebalfred_smoke.yaml", "--ebalfred.controller", "fake",
        "--ebalfred.subsets", "base,long_horizon", "--ebalfred.episodes_per_subset", "2",
        "--run.out_dir", str(rig.runs), "--run.name", "ebalfred", "--run.tensorboard", "false",
        "--init_checkpoint", str(actors_reference_ckpt), "--grpo.iterations", "1",
        "--eval.conditions", "memprism,full_history",
    ]  # fmt: skip
    status, out = rig.run_job("grpo_ebalfred.py", args, tmp_path / "ebalfred.log")
    assert status == 0, out[-3000:]
    assert "node data: the EB-ALFRED fixture shipped to every node that lacks it" in out
    assert (rig.runs / "ebalfred" / "eval" / "summary.md").exists()
    assert {a["role"] for a in placement(rig.runs / "ebalfred")["actors"]} >= {"learner", "rollout-worker"}


def test_mind2web_fixture_job_on_the_cluster(rig, tmp_path: Path) -> None:
    """The fixture is generated in the driver's cache; D1, GRPO and the evaluation read it on the nodes."""
    rig.ensure_nodes(2)
    args = [
        "--config", "configs/mind2web_smoke.yaml", "--run.out_dir", str(rig.runs), "--run.name", "mind2web",
        "--grpo.iterations", "1",
    ]  # fmt: skip
    status, out = rig.run_job("grpo_mind2web.py", args, tmp_path / "mind2web.log")
    assert status == 0, out[-3000:]
    assert "node data: the generated Mind2Web fixture shipped to every node that lacks it" in out
    assert (rig.runs / "mind2web" / "eval" / "mind2web.md").exists()
