"""The real jobs on a cluster whose worker nodes cannot see the driver's cache or run directory
(issue 34 items 1-5): the ALFWorld job from D1 to the final evaluation on the embedded corpus;
the same training with a worker node killed mid-iteration (nothing lost), the elastic fleet
shrinking and growing, and the Learner's node killed then resumed, ending on the same weights
as the undisturbed run; the EB-ALFRED and Mind2Web fixtures; user data missing on the nodes
refused in one line naming the node, the path and the fix.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cluster_rig import grpo_rows, placement, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

#: Two before the Learner's node is lost, six after the resume: room for a node to join and be used.
ITERATIONS = 8


def _alfworld(rig, test_cache: Path, name: str, *extra: str) -> list[str]:
    """A small ALFWorld job on the embedded corpus (the tests' tiny corpus, which the driver
    finds already built in ``test_cache``; the nodes see that folder empty)."""
    return [
        "--config", "configs/local.yaml",
        "--corpus.cache_dir", str(test_cache), "--corpus.train_games", "6", "--corpus.eval_games", "6",
        "--corpus.seed", "11",
        "--run.out_dir", str(rig.runs), "--run.name", name, "--run.tensorboard", "false",
        "--run.call_timeout_s", "120", "--run.checkpoint_every", "1",
        "--agent.max_steps", "8", "--grpo.max_steps", "8", "--grpo.iterations", str(ITERATIONS),
        "--grpo.groups_per_iteration", "2", "--grpo.group_size", "3", "--grpo.update_batch_size", "16",
        "--grpo.replay_first", "0", "--rollout.env_slots_per_worker", "3",
        *extra,
    ]  # fmt: skip


def _weights(ckpt: Path) -> str:
    from memprism_ray.adapter.checkpoint import WEIGHTS_FILE

    return hashlib.sha256((ckpt / WEIGHTS_FILE).read_bytes()).hexdigest()


def _ensure_nodes(rig, n: int) -> None:
    alive = [node for node in rig.cluster.nodes if node.alive()]
    for _ in range(n - len(alive)):
        rig.add_node()


@pytest.fixture(scope="module")
def undisturbed(rig, memprism_test_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    """The ALFWorld job from D1 to the evaluation, nothing disturbed: two fixed rollout workers."""
    _ensure_nodes(rig, 2)
    log = tmp_path_factory.mktemp("logs") / "undisturbed.log"
    args = _alfworld(
        rig, memprism_test_cache, "undisturbed",
        "--rollout.num_workers", "2", "--label.games", "1", "--label.rollin_games", "0", "--label.workers", "1",
        "--sft.epochs", "1", "--eval.episodes", "4", "--eval.conditions", "memprism,freq_random",
        "--eval.workers", "2", "--eval.slots", "2",
    )  # fmt: skip
    status, out = rig.run_job("grpo_alfworld.py", args, log)
    return status, out, rig.runs / "undisturbed"


def test_alfworld_job_succeeds_on_nodes_without_the_drivers_disk(undisturbed) -> None:
    status, out, run = undisturbed
    assert status == 0, out[-3000:]
    assert "node data: the embedded ALFWorld corpus shipped to every node that lacks it" in out
    where = placement(run)
    alive = {n["node_id"] for n in where["nodes"] if n["alive"] and n["resources"].get("CPU", 0) > 0}
    roles: dict[str, set[str]] = {}
    for a in where["actors"]:
        roles.setdefault(a["role"], set()).add(a["node_id"])
    # Every actor ran on a worker node (the head has no CPU), the fleet and the evaluation
    # spread over both of them: none could read the driver's corpus or run directory.
    assert roles["rollout-worker"] == alive and roles["eval-worker"] == alive and len(alive) == 2
    assert roles["learner"] <= alive
    assert (run / "checkpoints" / f"iter_{ITERATIONS:04d}").is_dir()
    assert (run / "eval" / "final_table.md").exists()
    d1 = next((run / "d1").glob("*/checkpoint"))
    assert (d1 / "config.json").exists()  # D1's tasks ran on the nodes, the driver wrote the files
    assert [r["trajectories"] for r in grpo_rows(run)] == [6] * ITERATIONS


def test_node_losses_lose_nothing_and_resume_reaches_the_same_weights(
    rig, undisturbed, memprism_test_cache: Path, tmp_path: Path
) -> None:
    """With ``rollout.num_workers auto``: a worker node killed mid-iteration with no spare room
    (the fleet shrinks, every group is still played), then the Learner's node (one line, exit
    1); ``--resume auto`` on a fresh node, where a node added while it runs grows the fleet back.
    The final weights are the undisturbed run's, bit for bit: the lost groups replayed their
    seeds."""
    _, _, reference = undisturbed
    d1 = next((reference / "d1").glob("*/checkpoint"))
    _ensure_nodes(rig, 2)
    args = _alfworld(
        rig, memprism_test_cache, "disturbed", "--rollout.num_workers", "auto", "--init_checkpoint", str(d1),
        "--eval.enabled", "false",
    )  # fmt: skip
    run = rig.runs / "disturbed"
    job = rig.start_job("grpo_alfworld.py", args, tmp_path / "disturbed.log")
    try:
        # Both seats started (one per node: SPREAD); kill the node of a rollout worker that is
        # not the Learner's. Its seat cannot start on the other node (0.25 CPU left of 1).
        def two_workers():
            actors = placement(run).get("actors", [])
            workers = [a for a in actors if a["role"] == "rollout-worker" and a["gone"] is None]
            learner = [a for a in actors if a["role"] == "learner"]
            return (workers, learner[0]) if len(workers) == 2 and learner else None

        workers, learner = wait_for(two_workers, 180, "two rollout workers and the Learner in cluster.json")
        victim = next(w["node_id"] for w in workers if w["node_id"] != learner["node_id"])
        _node_of(rig, victim).kill()
        wait_for(lambda: (run / "checkpoints" / "iter_0002").is_dir(), 240, "checkpoint 2")
        _node_of(rig, learner["node_id"]).kill()  # the Learner's node: the job ends, resumable
        job.wait(timeout=240)
        out = (tmp_path / "disturbed.log").read_text()
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("[grpo] error:")]
    assert len(errors) == 1 and "the Learner actor died" in errors[0] and "--resume auto" in errors[0]
    assert "Traceback" not in out
    first = grpo_rows(run)[0]
    assert first["trajectories"] == 6 and first["failed_excluded"] == 0  # every group played ...
    assert first["failed_trajectories"] == 3 and first["groups_rerun"] == 1  # ... the lost one again
    assert first["workers_lost"] == 1 and (first["fleet_size"], first["fleet_size_end"]) == (2, 1)
    assert [e["event"] for e in placement(run)["events"]] == ["driver", "shrank"]

    # Resume on a fresh node: one seat fits, the other waits; a node added meanwhile grows the fleet.
    rig.add_node()
    resumed = rig.start_job("grpo_alfworld.py", [*args, "--resume", "auto"], tmp_path / "resumed.log")
    try:
        wait_for(lambda: len(grpo_rows(run)) >= 3, 240, "a resumed iteration in metrics.jsonl")
        newcomer = rig.add_node()
        resumed.wait(timeout=300)
        out = (tmp_path / "resumed.log").read_text()
    finally:
        if resumed.poll() is None:
            resumed.kill()
    assert resumed.returncode == 0, out[-3000:]
    rows = grpo_rows(run)
    assert [r["iteration"] for r in rows] == list(range(1, ITERATIONS + 1))
    assert rows[2]["fleet_size"] == 1  # the first resumed iteration: no room for the second seat
    where = placement(run)
    joined = next(a for a in where["actors"] if a["role"] == "rollout-worker" and a["node_id"] == newcomer.node_id)
    later = [r for r in rows[2:] if r["time"] - r["iteration_seconds"] > joined["started"]]
    assert later and all(r["fleet_size"] == 2 for r in later)  # every iteration after it started used it
    assert "grew" in [e["event"] for e in where["events"]]
    final = f"iter_{ITERATIONS:04d}"
    assert _weights(run / "checkpoints" / final) == _weights(reference / "checkpoints" / final)
    same = ("success_rate", "loss", "kl", "trajectories")
    assert [{k: r[k] for k in same} for r in rows] == [{k: r[k] for k in same} for r in grpo_rows(reference)]


def test_user_data_missing_on_the_nodes_is_one_line(
    rig, memprism_tiny_corpus: Path, actors_reference_ckpt: Path, tmp_path: Path
) -> None:
    """``corpus.data_root`` given by the user exists on the driver only: the job refuses where
    the first actor starts, naming the node, the path and the fix; exit 1, no traceback."""
    _ensure_nodes(rig, 1)
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
    _ensure_nodes(rig, 2)
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
    _ensure_nodes(rig, 2)
    args = [
        "--config", "configs/mind2web_smoke.yaml", "--run.out_dir", str(rig.runs), "--run.name", "mind2web",
        "--grpo.iterations", "1",
    ]  # fmt: skip
    status, out = rig.run_job("grpo_mind2web.py", args, tmp_path / "mind2web.log")
    assert status == 0, out[-3000:]
    assert "node data: the generated Mind2Web fixture shipped to every node that lacks it" in out
    assert (rig.runs / "mind2web" / "eval" / "mind2web.md").exists()


def _node_of(rig, node_id: str):
    """The live LocalNode whose Ray node id is ``node_id``."""
    for node in rig.cluster.nodes:
        if node.alive() and node.node_id == node_id:
            return node
    pytest.fail(f"no live node with id {node_id[:8]}")
