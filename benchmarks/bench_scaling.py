"""Decisions per second of one GRPO iteration's rollouts on 1, 2 and 4 worker nodes, and a
projection on paper for the paper's run (issue 34 item 6; docs/cluster.md).

What runs: a real multi-node Ray cluster on this machine
(:class:`memprism_ray.testing.local_cluster.LocalCluster`, ``ray start`` processes): a head of 0 CPUs,
one *policy node* (0 CPUs and the custom resource ``scaling_policy``) holding the one
:class:`~memprism_ray.actors.workers.PolicyReplica`, and N *worker nodes* of
``rollout.seat_cpus()`` CPUs each (1: ``rollout_cpus`` 0.5 + one EnvWorker of ``env_cpus``
0.5), so each holds exactly one rollout seat. The N :class:`~memprism_ray.actors.rollout.
RolloutWorker` actors are created as the job creates them (``scheduling_strategy="SPREAD"``,
``num_cpus=seat_cpus()``, their EnvWorker on their node) and the iteration's groups are
dispatched by the job's own :func:`~memprism_ray.trainer.rollouts.run_groups` over a
:class:`~memprism_ray.cluster.fleet.RolloutFleet`; the script checks that the N workers sit
on N distinct worker nodes. The cluster is started once and grows (1 -> 2 -> 4 worker
nodes), so when N is measured it has exactly N worker nodes; workers already started stay
warm, and each new worker plays one warm-up group before anything is timed (actor start-up
and model loading excluded, as in bench_rollout.py).

The policy is a latency model of a GPU engine below saturation: the fake ``AsyncLLM`` of
``memprism_ray/testing/fake_vllm.py`` behind the ordinary vLLM path (``policy.backend: vllm``,
``AsyncVLLMPolicy``, the replica's async event loop, view PNGs over the wire) with
``--step-ms`` per engine step and ``seq_s = 0``, so a decision of ``--tokens`` tokens takes
``tokens x step`` seconds (0.40 s by default; a request arriving mid-step joins the next
one) whatever the batch -- the vLLM figures show a step takes nearly the same time at any
batch below saturation (docs/gpu.md) -- and ``max_batch`` 4096 never saturates. Its config says
``gpus_per_replica 1`` (``backend: vllm`` refuses 0), but the replica is created here with
CPU options only (``num_cpus 0``, ``resources {scaling_policy: 1}``), as
tests/actors/test_policy_pool.py does.

The CPU side is ALFWorld on the embedded corpus (configs/local.yaml: the rule Phi and
compose + render inside the rollout worker, 672-pixel views painted and PNG-encoded for the
replica), a random-initialised Router (seed 0) with its MiniLM features, groups of
``--group-size`` 4 trajectories for ``--max-steps`` 10 steps. An iteration is
``--groups-per-worker`` x N groups (2 x N: every worker busy the whole iteration), drawn
once per repetition for the largest N with :func:`~memprism_ray.trainer.rollouts.
sample_groups`; smaller N play the first groups of the same draw, so the groups all N
share must take the same actions and views (checked: the groups are seeded). Decisions/s =
decisions played / rollout wall time of the iteration; ``--repeats`` 3 repetitions per N,
median and range; targets: N=2 >= 1.6x and N=4 >= 3.2x the N=1 median (0.8x linear).
These sizes keep the CPU side light: about 20 ms of CPU a decision over every process
(measured here, ``per_n / <N> / cpu_ms_per_decision`` in the record), so a worker's step of
4 decisions costs about 80 ms of CPU against 400 ms of engine latency and 4 workers keep
well under one of the 2 cores busy (``per_n / 4 / cluster_cpu_cores``).

CPU accounting: every process of the cluster (the nodes' sessions, read from /proc) and
this driver are read before and after each repetition, by role (RolloutWorker, EnvWorker,
PolicyReplica, Ray's own processes, the driver), less what the cluster burns idle (a few
seconds' baseline per N), and so is the whole machine (/proc/stat): the record says how many
of the cores the job used and how many other work took.

What a 2-core machine can and cannot show. All nodes share the machine's two cores: the N
"nodes" are logical (separate raylets, object stores and worker processes talking over the
machine's own network stack), not N machines' worth of CPU. With the policy's latency
dominating a step and the CPU side kept light, the figure measures what Ray's controller
(driver dispatch, raylets, GCS), the object store and the wire cost as workers are added --
whether N concurrent groups against one latency-bound engine give N times the decisions. It cannot
show environment or view CPU throughput scaling (more nodes add no cores here), network
bandwidth or latency between machines (everything is loopback), a real GPU's batching curve,
or anything above 4 workers; and other work on the machine (recorded per repetition) slows
the CPU side of every N alike only to first order.

Projection on paper (:func:`project`): the paper's run (8 groups x 16 trajectories, 50
steps, 100 iterations) on clusters of 1, 4 and 16 GPU nodes, from per-stage costs measured
in the same run (per-decision CPU by role, split by the step rows' stage timings; step-table
bytes; Router weight bytes) and from records in ``benchmarks/results/`` cited by file and key
(views at 50 events, PNG bytes, the learner's update). The GPU's rate and small-batch latency
have no record yet (docs/gpu.md "Measured" holds them): ``--gpu-rate`` and ``--gpu-latency-s``
default to those figures and a GPU record of bench_policy_pool.py replaces the rate. For each
cluster size it gives lower bounds of the rollout phase (policy pool, CPU, the groups'
critical path), the learner's update (its record was taken on 2 CPU threads: the paper
preset's tenth of a GPU is unmeasured), the wire and object store, the bottleneck among them
and the rollout's own, and the CPU cores one GPU needs to stay fed (``--cores-per-node`` 16
and ``--bandwidth-gbit`` 10 describe the projected nodes). Last line ``RESULT {json}``,
recorded in ``benchmarks/results/bench_scaling.json``.

    python benchmarks/bench_scaling.py [--nodes 1,2,4] [--repeats 3] [--group-size 4] [--max-steps 10]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for _k, _v in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_k, _v)

from _results import RESULTS_DIR, summarize, write_result  # noqa: E402

from memprism_ray.config_tree import int_at_least  # noqa: E402

#: The paper's GRPO run (configs/alfworld_paper.yaml; Table A.4).
PAPER = {"groups": 8, "group_size": 16, "steps": 50, "iterations": 100}
PROJECTED_GPU_NODES = (1, 4, 16)
TARGETS = {2: 1.6, 4: 3.2}
POLICY_RESOURCE = "scaling_policy"
#: GPU figures without a record yet (docs/gpu.md "Measured", H100, 48 completion tokens):
#: the pool at 128 in flight, 8 callers x 16 (`bash scripts/gpu_proof.sh`), and one decision's
#: latency at small batch (16 calls of 4 in sequence: 11.7 decisions/s, i.e. 4 / 11.7 s).
GPU_RATE_DOCS = 19.1
GPU_LATENCY_DOCS_S = round(4 / 11.7, 3)
#: A GPU record of bench_policy_pool.py, when one exists, gives the rate instead (file, key).
GPU_RECORD = ("bench_policy_pool.json", "patterns / pool / decisions_per_s / median")
#: Records the projection reads (file, key path), cited in its output.
RECORDS = {
    "views_ms_at_50": (
        "bench_views.json",
        "machinery_at_paper_horizons / as shipped (atlas + readings kept) / p50_ms@50",
    ),
    "png_bytes_per_episode_50": ("bench_view_bytes.json", "bytes_per_episode / 50 / png"),
    "delta_bytes_per_episode_50": ("bench_view_bytes.json", "bytes_per_episode / 50 / after"),
    "learner_s_per_update": ("bench_router_training.json", "d2_shared_z_s_per_update"),
    "learner_update_decisions": ("bench_router_training.json", "decisions"),
    "learner_threads": ("bench_router_training.json", "threads"),
}
#: Process roles of the CPU accounting, from a process's command line.
ROLES = ("rollout_worker", "env_worker", "policy_replica", "ray_system", "driver")


# ----------------------------------------------------------------------------- pure parts
def scaling_ratios(medians: Mapping[int, float]) -> dict[str, float]:
    """Each N's median decisions/s over the N=1 median (``{"2": 1.9, ...}``; N=1 itself left out)."""
    if 1 not in medians or medians[1] <= 0:
        raise ValueError("the ratios need a positive N=1 median")
    return {str(n): round(v / medians[1], 3) for n, v in sorted(medians.items()) if n != 1}


def targets_met(ratios: Mapping[str, float], targets: Mapping[int, float] = TARGETS) -> dict[str, bool | None]:
    """Whether each measured N meets its target ratio (``None``: that N was not measured)."""
    return {str(n): (ratios[str(n)] >= t if str(n) in ratios else None) for n, t in targets.items()}


def role_of(cmdline: str) -> str:
    """The accounting role of a cluster process, from its command line (Ray names its
    workers ``ray::<Actor>``; idle workers, raylets, GCS and agents are Ray's own)."""
    if cmdline.startswith("ray::RolloutWorker"):
        return "rollout_worker"
    if cmdline.startswith("ray::EnvWorker"):
        return "env_worker"
    if cmdline.startswith("ray::PolicyReplica"):
        return "policy_replica"
    return "ray_system"


def cpu_split(rollout_cpu_ms: float, stage_wall_ms: Mapping[str, float]) -> dict[str, float]:
    """The rollout worker's CPU per decision split over its stages in proportion to their
    wall time (they run in its process, on CPU, while it holds a core); what the stages do
    not cover is ``wire``: the policy call's client side (the view's PNG encoding, Ray's
    client, routing), the env and Phi calls' client side, the group's Arrow table."""
    stages = {k: max(float(v), 0.0) for k, v in stage_wall_ms.items()}
    covered = sum(stages.values())
    if covered <= 0:
        return {"wire": round(rollout_cpu_ms, 3)}
    scale = min(1.0, rollout_cpu_ms / covered)
    out = {k: round(v * scale, 3) for k, v in stages.items()}
    out["wire"] = round(max(rollout_cpu_ms - covered * scale, 0.0), 3)
    return out


def project(
    costs: Mapping[str, Any],
    gpu_nodes: Sequence[int] = PROJECTED_GPU_NODES,
    paper: Mapping[str, int] = PAPER,
) -> dict[str, Any]:
    """The paper's run on clusters of ``gpu_nodes`` GPU nodes, one policy replica each.

    ``costs`` (see :func:`projection_costs`): ``cpu_ms`` (CPU per decision, by stage),
    ``serial_ms`` (per decision, the part of a group's step between two policy calls),
    ``gpu_rate`` (decisions/s of one saturated replica), ``gpu_latency_s`` (one decision at
    small batch), ``learner_s_per_decision``, ``bytes_per_decision`` (view PNG + view delta +
    step row), ``weights_bytes`` (the per-iteration broadcast to each seat), ``cores_per_node``,
    ``bandwidth_bytes_s``. With D = groups x group size x steps decisions an iteration, each
    a lower bound on the rollout phase, in seconds:

    * policy pool: ``D / (min(K, groups) x rate)``: a group sticks to one replica, so more
      replicas than groups idle;
    * group critical path: ``steps x (group size x serial_ms + max(latency, group size /
      rate))``: a group's steps are sequential, each waits for its own requests;
    * CPU: ``D x cpu_ms / (K x cores_per_node)``.

    The rollout phase is the largest; the learner's update follows it (serial,
    ``D x learner_s_per_decision``), then the weight broadcast (``groups x weights_bytes /
    bandwidth``); the wire's per-decision bytes overlap the rollouts (``D x bytes /
    bandwidth``). Per K: the bounds, the bottleneck (largest of all) and the rollout's own,
    the GPUs' busy fraction over the iteration, the cores the CPU stages keep busy per GPU
    during the rollouts, decisions/s and the run's hours."""
    groups, g, steps, iters = paper["groups"], paper["group_size"], paper["steps"], paper["iterations"]
    d = groups * g * steps
    cpu_ms = sum(costs["cpu_ms"].values())
    rate, lat = float(costs["gpu_rate"]), float(costs["gpu_latency_s"])
    learn_s = d * float(costs["learner_s_per_decision"])
    bw = float(costs["bandwidth_bytes_s"])
    weights_s = groups * float(costs["weights_bytes"]) / bw
    path_s = steps * (g * float(costs["serial_ms"]) / 1000.0 + max(lat, g / rate))
    rows = []
    for k in gpu_nodes:
        pool_s = d / (min(k, groups) * rate)
        rollout_bounds = {
            "policy pool": pool_s,
            "group critical path": path_s,
            "cpu": d * cpu_ms / 1000.0 / (k * float(costs["cores_per_node"])),
        }
        rollout_s = max(rollout_bounds.values())
        phases = {**rollout_bounds, "learner": learn_s, "wire": d * float(costs["bytes_per_decision"]) / bw + weights_s}
        iteration_s = rollout_s + learn_s + weights_s
        rows.append(
            {
                "gpu_nodes": k,
                "replicas_busy": min(k, groups),
                "bounds_s": {name: round(v, 2) for name, v in phases.items()},
                "rollout_s": round(rollout_s, 2),
                "iteration_s": round(iteration_s, 2),
                "bottleneck": max(phases, key=lambda name: phases[name]),
                "rollout_bottleneck": max(rollout_bounds, key=lambda name: rollout_bounds[name]),
                "gpu_busy": round(d / (k * rate) / iteration_s, 3),
                "cpu_cores_busy_per_gpu": round(d * cpu_ms / 1000.0 / rollout_s / k, 2),
                "decisions_per_s": round(d / iteration_s, 2),
                "run_hours": round(iters * iteration_s / 3600.0, 2),
            }
        )
    return {
        "decisions_per_iteration": d,
        "cpu_ms_per_decision": round(cpu_ms, 2),
        "largest_cpu_stage": max(costs["cpu_ms"], key=lambda s: costs["cpu_ms"][s]),
        # A GPU at its saturated rate needs rate x CPU seconds a decision of cores to feed it.
        "cores_per_gpu_to_stay_fed": round(rate * cpu_ms / 1000.0, 2),
        "learner_s_per_iteration": round(learn_s, 2),
        "group_critical_path_s": round(path_s, 2),
        "rows": rows,
    }


def record_value(name: str, key: str, results_dir: Path = RESULTS_DIR) -> Any:
    """``result[key...]`` of ``results_dir/name`` (key parts joined by `` / ``, as the
    benchmarks README quotes them); ``None`` when the record does not exist."""
    path = results_dir / name
    if not path.exists():
        return None
    value: Any = json.loads(path.read_text())["result"]
    for part in key.split(" / "):
        value = value[part]
    return value


def projection_costs(
    measured: Mapping[str, Any],
    records: Mapping[str, Any],
    *,
    gpu_rate: float,
    gpu_latency_s: float,
    cores_per_node: float,
    bandwidth_gbit_s: float,
    steps: int = PAPER["steps"],
) -> dict[str, Any]:
    """The projection's inputs from this run's N=1 measurement (``measured``: CPU ms per
    decision by stage, serial ms per decision, step-row bytes, weight bytes) and the records
    (``records``: values of :data:`RECORDS`). Compose + render takes the larger of this run's
    cost and the record's at the paper's 50 events (this run's episodes are shorter), on the
    CPU and on the group's critical path alike; the PNG encoding of the view is measured
    here, in ``wire`` (the policy call's client side)."""
    cpu = dict(measured["cpu_ms"])
    views_gain = max(float(records["views_ms_at_50"]) - cpu.get("views", 0.0), 0.0)
    cpu["views"] = round(cpu.get("views", 0.0) + views_gain, 3)
    png = float(records["png_bytes_per_episode_50"]) / steps
    delta = float(records["delta_bytes_per_episode_50"]) / steps
    learner = float(records["learner_s_per_update"]) / float(records["learner_update_decisions"])
    return {
        "cpu_ms": cpu,
        "serial_ms": round(float(measured["serial_ms"]) + views_gain, 3),
        "gpu_rate": gpu_rate,
        "gpu_latency_s": gpu_latency_s,
        "learner_s_per_decision": round(learner, 6),
        "bytes_per_decision": round(png + delta + float(measured["row_bytes"]), 1),
        "weights_bytes": int(measured["weights_bytes"]),
        "cores_per_node": cores_per_node,
        "bandwidth_bytes_s": bandwidth_gbit_s * 1e9 / 8,
    }


def scaling_table(per_n: Mapping[int, Mapping[str, Any]], ratios: Mapping[str, float]) -> list[str]:
    """The measured table, one line per N."""
    lines = [f"{'worker nodes':>12}{'decisions':>11}{'decisions/s median':>20}{'range':>18}{'x N=1':>8}"]
    for n, row in sorted(per_n.items()):
        s = row["decisions_per_s"]
        ratio = "1.00" if n == 1 else f"{ratios.get(str(n), float('nan')):.2f}"
        span = f"[{s['min']:.2f}, {s['max']:.2f}]"
        lines.append(f"{n:>12}{row['decisions']:>11}{s['median']:>20.2f}{span:>18}{ratio:>8}")
    return lines


def projection_table(proj: Mapping[str, Any]) -> list[str]:
    """The projection, one line per cluster size (bounds in seconds per iteration)."""
    names = ("policy pool", "group critical path", "cpu", "learner", "wire")
    head = f"{'GPU nodes':>9}" + "".join(f"{n:>{max(len(n), 6) + 2}}" for n in names)
    head += f"{'iteration s':>13}{'GPU busy':>10}{'cores/GPU':>11}{'run h':>7}  bottleneck (rollout's own)"
    lines = [head]
    for r in proj["rows"]:
        line = f"{r['gpu_nodes']:>9}" + "".join(f"{r['bounds_s'][n]:>{max(len(n), 6) + 2}.1f}" for n in names)
        line += f"{r['iteration_s']:>13.1f}{r['gpu_busy']:>10.2f}{r['cpu_cores_busy_per_gpu']:>11.2f}"
        line += f"{r['run_hours']:>7.1f}  {r['bottleneck']} ({r['rollout_bottleneck']})"
        lines.append(line)
    return lines


# ----------------------------------------------------------------------------- CPU accounting
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def cluster_cpu(sessions: set[int]) -> dict[str, float]:
    """CPU seconds so far of every live process in ``sessions`` (the nodes' process groups:
    ``ray start`` runs each node in a session of its own), by :func:`role_of`."""
    out = dict.fromkeys(ROLES, 0.0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getsid(pid) not in sessions:
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        secs = _proc_cpu_s(pid)
        if secs is not None:
            out[role_of(cmd)] += secs
    return out


def engine_overlap(steps: Sequence[Sequence[str]]) -> dict[str, float]:
    """How many groups (caller tags) ran together in the fake engine's steps: the mean and
    the most, over steps that ran something (continuous batching across rollout workers)."""
    busy = [len(s) for s in steps if s]
    if not busy:
        return {"steps": 0, "mean_groups_per_step": 0.0, "max_groups_per_step": 0}
    return {
        "steps": len(busy),
        "mean_groups_per_step": round(sum(busy) / len(busy), 3),
        "max_groups_per_step": max(busy),
    }


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot (/proc/stat)."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return float(sum(parts) - idle), float(sum(parts))


# ----------------------------------------------------------------------------- measurement
STAGE_COLUMNS = ("features_ms", "select_ms", "view_ms", "phi_ms")


def _config(args: argparse.Namespace, groups: int) -> Any:
    from memprism_ray.config import load_config

    g, s = args.group_size, args.max_steps
    return load_config(
        ROOT / "configs" / "local.yaml",
        [
            "--run.name", "scaling",
            "--grpo.groups_per_iteration", str(groups), "--grpo.group_size", str(g),
            "--agent.max_steps", str(s),
            "--rollout.num_workers", str(max(args.nodes)), "--rollout.env_slots_per_worker", str(g),
            "--rollout.env_workers_per_rollout", "1", "--rollout.env_cpus", "0.5", "--rollout.rollout_cpus", "0.5",
            "--rollout.phi_workers", "0", "--rollout.view_workers", "0",
            "--policy.backend", "vllm", "--policy.num_replicas", "1", "--policy.gpus_per_replica", "1",
            "--policy.vllm.chat_template", "qwen2_vl", "--policy.vllm.frontend_threads", "0",
        ],
    )  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start the cluster, grow it through ``args.nodes``, time ``args.repeats`` iterations
    at each size; per N the decisions/s, the CPU by role, the stage timings, the actions."""
    from memprism_ray.cluster.head import new_auth_token, token_auth_env

    # This process is the cluster's driver. Ray reads a driver's auth settings and whether
    # 127.0.0.1 stays 127.0.0.1 (the cluster listens on loopback only) when `ray` is first
    # imported: both are set before, with the token the cluster is started with.
    tmp = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    token = new_auth_token()
    os.environ.update({**token_auth_env(tmp, token), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    if "ray" in sys.modules:
        raise RuntimeError("bench_scaling: ray was imported before the driver's auth settings were set")
    import numpy as np
    import ray
    import torch

    from memprism_ray.actors.learner import state_to_numpy
    from memprism_ray.actors.rollout import RolloutWorker
    from memprism_ray.actors.workers import PolicyReplica
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.benchmark.alfworld import list_games
    from memprism_ray.cluster.fleet import RolloutFleet
    from memprism_ray.policy.factory import needs_view_text
    from memprism_ray.router.model import ViewPolicyModel
    from memprism_ray.testing.fake_vllm import fake_engine_factory
    from memprism_ray.testing.local_cluster import LocalCluster
    from memprism_ray.trainer.rollouts import run_groups, sample_groups

    torch.set_num_threads(1)
    max_n = max(args.nodes)
    g_max = args.groups_per_worker * max_n
    cfg = _config(args, g_max)
    cfg = get_benchmark("alfworld").prepare(cfg, lambda m: print(m, file=sys.stderr))
    games = list_games("train", cfg.corpus.data_root)
    torch.manual_seed(0)
    model = ViewPolicyModel(cfg.router).eval()
    state = state_to_numpy(model.state_dict())
    # The per-iteration broadcast is the planner alone (Learner.planner_weights: D2 trains only it); a
    # fresh model has every parameter trainable, so requires_grad would count the encoder too (4x).
    weights_bytes = sum(int(p.numel() * p.element_size()) for p in model.parameter_groups()["planner"])
    # Repetition k plays iteration k + 1's draw; iteration 0's groups warm new workers up.
    specs_of = [sample_groups(games, cfg, it) for it in range(args.repeats + 1)]
    if any(len(s) < g_max for s in specs_of):
        raise SystemExit(f"the corpus has {len(games)} training games; {g_max} groups need as many")
    engine = functools.partial(
        fake_engine_factory, step_s=args.step_ms / 1000.0, seq_s=0.0, tokens=args.tokens, max_batch=4096
    )
    seat = cfg.rollout.seat_cpus()
    needs_text = needs_view_text(cfg.policy, get_benchmark("alfworld").task_contract())
    # Nodes inherit this environment (MEMPRISM_CACHE too); token auth, every listener on 127.0.0.1.
    cluster = LocalCluster(tmp / "ray", head_cpus=0, auth_token=token)
    t_start = time.perf_counter()
    out: dict[str, Any] = {"per_n": {}, "tables": {}, "engine": {}}
    seen_steps = 0
    try:
        cluster.add_node(0, resources={POLICY_RESOURCE: 1})
        os.environ.update(cluster.driver_env())
        ray.init(address=cluster.address, log_to_driver=False)
        full = ray.put(state)
        replica = PolicyReplica.options(
            num_cpus=0, resources={POLICY_RESOURCE: 1}, max_concurrency=cfg.policy.max_concurrency
        ).remote(cfg.policy, engine)
        ray.get(replica.load.remote(), timeout=300)
        sessions = {cluster.head.process.pid, *(n.process.pid for n in cluster.nodes)}
        workers: list[Any] = []
        for n in sorted(args.nodes):
            while len(cluster.nodes) - 1 < n:  # the policy node is nodes[0]
                node = cluster.add_node(seat)
                sessions.add(node.process.pid)
            new = [
                RolloutWorker.options(num_cpus=seat, scheduling_strategy="SPREAD").remote(
                    cfg,
                    i,
                    full,
                    [],
                    [],
                    [replica],
                    needs_text,
                    "scaling",
                    benchmark=get_benchmark(cfg.corpus.benchmark),
                )
                for i in range(len(workers), n)
            ]
            ray.get([w.start.remote() for w in new], timeout=600)
            workers.extend(new)
            places = ray.get([w.placed.remote() for w in workers], timeout=60)
            nodes_used = {p["node_id"] for p in places}
            worker_nodes = {node.node_id for node in cluster.nodes[1:]}
            if len(nodes_used) != n or not nodes_used <= worker_nodes:
                raise RuntimeError(f"{n} rollout workers landed on {len(nodes_used)} node(s): {places}")
            # Warm-up: each new worker plays one group (its Router, encoder and EnvWorker loaded).
            if new:
                run_groups(RolloutFleet(new), specs_of[0][: len(new)], None, 0, cfg)
            fleet = RolloutFleet(workers[:n])
            groups = args.groups_per_worker * n
            # Idle baseline: what the cluster's processes burn with nothing to do (agents, raylets'
            # heartbeats), subtracted per repetition so per-decision costs are the work's own.
            idle0 = cluster_cpu(sessions)
            time.sleep(args.idle_s)
            idle1 = cluster_cpu(sessions)
            idle = {r: max(idle1[r] - idle0[r], 0.0) / args.idle_s for r in ROLES if r != "driver"}
            reps: list[dict[str, Any]] = []
            for k in range(args.repeats):
                specs = specs_of[k + 1][:groups]
                cpu0, m0 = cluster_cpu(sessions), machine_busy()
                d0 = time.process_time()
                t0 = time.perf_counter()
                result = run_groups(fleet, specs, None, 0, cfg)
                seconds = time.perf_counter() - t0
                d1 = time.process_time()
                cpu1, m1 = cluster_cpu(sessions), machine_busy()
                if result.failed_trajectories:
                    raise RuntimeError(f"N={n} repetition {k + 1}: {result.first_failure}")
                tables = ray.get([o.steps for o in result.groups], timeout=600)  # after the clock
                decisions = sum(t.num_rows for t in tables)
                cores = os.cpu_count() or 2
                busy = (m1[0] - m0[0]) / max(m1[1] - m0[1], 1.0) * cores
                cpu = {r: cpu1[r] - cpu0[r] for r in ROLES if r != "driver"}
                cpu["driver"] = d1 - d0
                reps.append(
                    {
                        "seconds": seconds,
                        "decisions": decisions,
                        "cpu_s": cpu,
                        "idle_cores": idle,
                        "machine_busy_cores": busy,
                        "load_avg_1min": os.getloadavg()[0],
                        "stage_ms": {c: float(np.mean(np.concatenate([t.column(c).to_numpy() for t in tables])))
                                     for c in (*STAGE_COLUMNS, "env_ms", "policy_ms", "policy_latency_ms", "step_ms")},
                        "row_bytes": sum(t.nbytes for t in tables) / decisions,
                    }
                )  # fmt: skip
                out["tables"][(n, k)] = {
                    o.summary.group_id: (t.column("action").to_pylist(), t.column("view_index").to_pylist())
                    for o, t in zip(result.groups, tables, strict=True)
                }
                print(
                    f"[bench] N={n} rep {k + 1}: {decisions} decisions in {seconds:.2f} s = "
                    f"{decisions / seconds:.2f}/s; cluster CPU {sum(cpu.values()) / seconds:.2f} cores, "
                    f"machine {busy:.2f} of {cores}",
                    file=sys.stderr,
                )
            steps = ray.get(replica.engine_record.remote(), timeout=60)["steps"]
            out["engine"][n] = engine_overlap(steps[seen_steps:])
            seen_steps = len(steps)
            out["per_n"][n] = reps
        stats = ray.get(replica.stats.remote(), timeout=60)
        front = stats.get("frontend", {})
        out["replica"] = {
            "max_in_flight": stats.get("max_in_flight"),
            "frontend_ms_per_decision": {
                st: round(1000 * front[f"{st}_s"] / front[f"{st}_n"], 3)
                for st in ("decode", "template", "mm_preprocess")
                if front.get(f"{st}_n")
            },
        }
    except BaseException:
        print(f"[bench] failed; the nodes' logs are in {tmp}", file=sys.stderr)
        raise
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)  # the nodes' logs, kept only when the run failed
    out["wall_s"] = time.perf_counter() - t_start
    out["weights_bytes"] = weights_bytes
    return out


def analyse(raw: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The record's figures from :func:`measure`'s raw repetitions."""
    per_n: dict[int, dict[str, Any]] = {}
    for n, reps in sorted(raw["per_n"].items()):
        dps = [r["decisions"] / r["seconds"] for r in reps]
        decisions = reps[0]["decisions"]
        cpu_ms = {
            role: round(statistics.median(1000 * net_cpu_s(r, role) / r["decisions"] for r in reps), 3)
            for role in ROLES
        }
        per_n[n] = {
            "groups": args.groups_per_worker * n,
            "decisions": decisions,
            "decisions_per_s": summarize(dps),
            "seconds": summarize([r["seconds"] for r in reps]),
            "cpu_ms_per_decision": cpu_ms,
            "idle_cores": {role: round(v, 3) for role, v in reps[0]["idle_cores"].items()},
            "engine": raw["engine"].get(n, {}),
            "cluster_cpu_cores": round(statistics.median(sum(r["cpu_s"].values()) / r["seconds"] for r in reps), 3),
            "machine_busy_cores": round(statistics.median(r["machine_busy_cores"] for r in reps), 3),
            "other_work_cores": round(
                statistics.median(r["machine_busy_cores"] - sum(r["cpu_s"].values()) / r["seconds"] for r in reps), 3
            ),
            "load_avg_1min": [round(r["load_avg_1min"], 2) for r in reps],
            "stage_ms": {c: round(statistics.median(r["stage_ms"][c] for r in reps), 3) for c in reps[0]["stage_ms"]},
        }
    medians = {n: row["decisions_per_s"]["median"] for n, row in per_n.items()}
    ratios = scaling_ratios(medians) if 1 in medians else {}
    # Identical play: every group that two sizes share took the same actions and views.
    tables = raw["tables"]
    identical = True
    for k in range(args.repeats):
        seen: dict[str, Any] = {}
        for n in sorted(per_n):
            for gid, play in tables[(n, k)].items():
                if gid in seen and seen[gid] != play:
                    identical = False
                seen.setdefault(gid, play)
    return {"per_n": per_n, "ratios": ratios, "identical": identical}


def net_cpu_s(rep: Mapping[str, Any], role: str) -> float:
    """A repetition's CPU seconds of ``role`` less what the cluster burns idle over as long
    (never below 0; the driver has no idle baseline)."""
    idle = rep.get("idle_cores", {}).get(role, 0.0) * rep["seconds"]
    return max(rep["cpu_s"][role] - idle, 0.0)


def measured_costs(n1: Mapping[str, Any], row_bytes: float, weights_bytes: int) -> dict[str, Any]:
    """Per-decision CPU by stage at N=1: the rollout worker's CPU split over its stages
    (:func:`cpu_split`), the EnvWorker's as ``env``, the replica's as ``policy front end``,
    Ray's processes and the driver as ``controller``; the serial part of a group's step is
    the step's wall time less the policy call (per decision)."""
    cpu = n1["cpu_ms_per_decision"]
    st = n1["stage_ms"]
    split = cpu_split(
        cpu["rollout_worker"],
        {"router": st["features_ms"] + st["select_ms"], "views": st["view_ms"], "phi": st["phi_ms"]},
    )
    stages = {
        "env": cpu["env_worker"],
        **split,
        "policy front end": cpu["policy_replica"],
        "controller": round(cpu["ray_system"] + cpu["driver"], 3),
    }
    return {
        "cpu_ms": stages,
        "serial_ms": round(st["step_ms"] - st["policy_ms"], 3),
        "row_bytes": round(row_bytes, 1),
        "weights_bytes": weights_bytes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="1,2,4", help="worker-node counts, comma-separated (must include 1)")
    p.add_argument("--repeats", type=int_at_least(1), default=3, help="timed iterations per N (median and range)")
    p.add_argument("--groups-per-worker", type=int_at_least(1), default=2, help="groups per worker per iteration")
    p.add_argument("--group-size", type=int_at_least(1), default=4, help="trajectories per group")
    p.add_argument("--max-steps", type=int_at_least(1), default=10, help="steps per trajectory")
    p.add_argument("--step-ms", type=float, default=40.0, help="the fake engine's step (ms), whatever the batch")
    p.add_argument("--tokens", type=int_at_least(1), default=10, help="engine steps (tokens) per decision")
    p.add_argument("--idle-s", type=float, default=4.0, help="idle window per N for the CPU baseline (s)")
    p.add_argument(
        "--gpu-rate",
        type=float,
        default=0.0,
        help="projection: decisions/s of one saturated GPU replica "
        f"(0: the GPU record {GPU_RECORD[0]} if present, else {GPU_RATE_DOCS}, docs/gpu.md)",
    )
    p.add_argument(
        "--gpu-latency-s",
        type=float,
        default=GPU_LATENCY_DOCS_S,
        help="projection: one decision's engine latency at small batch (docs/gpu.md)",
    )
    p.add_argument("--cores-per-node", type=float, default=16.0, help="projection: CPU cores of a GPU node")
    p.add_argument("--bandwidth-gbit", type=float, default=10.0, help="projection: network per node (Gbit/s)")
    args = p.parse_args(argv)
    args.nodes = sorted({int(x) for x in str(args.nodes).split(",") if x.strip()})
    if 1 not in args.nodes or min(args.nodes) < 1:
        p.error("--nodes must include 1 (the ratios are to one worker node)")

    raw = measure(args)
    res = analyse(raw, args)
    n1 = res["per_n"][1]
    row_bytes = statistics.median(r["row_bytes"] for r in raw["per_n"][1])
    measured = measured_costs(n1, row_bytes, raw["weights_bytes"])
    records = {name: record_value(*where) for name, where in RECORDS.items()}
    gpu_record = record_value(*GPU_RECORD)
    gpu_rate = args.gpu_rate or (float(gpu_record) if gpu_record else GPU_RATE_DOCS)
    gpu_source = "--gpu-rate" if args.gpu_rate else f"{GPU_RECORD[0]}: {GPU_RECORD[1]}" if gpu_record else "docs/gpu.md"
    costs = projection_costs(
        measured,
        records,
        gpu_rate=gpu_rate,
        gpu_latency_s=args.gpu_latency_s,
        cores_per_node=args.cores_per_node,
        bandwidth_gbit_s=args.bandwidth_gbit,
    )
    proj = project(costs)
    met = targets_met(res["ratios"])
    latency_s = args.tokens * args.step_ms / 1000.0

    print(f"\nRollouts of one GRPO iteration on N worker nodes ({os.cpu_count()} cores shared by every node)")
    print(
        f"policy: fake engine, {args.tokens} tokens x {args.step_ms:g} ms = {latency_s:.2f} s a decision at any batch; "
        f"{args.groups_per_worker} groups x {args.group_size} trajectories x {args.max_steps} steps per worker"
    )
    for line in scaling_table(res["per_n"], res["ratios"]):
        print(line)
    for n, row in res["per_n"].items():
        print(
            f"  N={n}: cluster CPU {row['cluster_cpu_cores']:.2f} cores, machine busy {row['machine_busy_cores']:.2f} "
            f"(other work {row['other_work_cores']:.2f}); groups per engine step "
            f"{row['engine'].get('mean_groups_per_step', 0):.2f} (most {row['engine'].get('max_groups_per_step', 0)}); "
            f"CPU ms/decision {row['cpu_ms_per_decision']}"
        )
    print(f"targets (median, x N=1): {', '.join(f'N={n} >= {t}' for n, t in TARGETS.items())}: {met}")
    print(f"identical actions and views in the groups every N played: {res['identical']}")
    print(
        "What this shows: the nodes share 2 cores, so this measures the controller, the object store and the wire "
        "against a latency-bound policy, not environment or view CPU throughput (more nodes add no cores here), "
        "nor network between machines or a real GPU's batching."
    )
    print(
        f"\nProjection on paper: {PAPER['groups']} groups x {PAPER['group_size']} x {PAPER['steps']} steps, "
        f"{PAPER['iterations']} iterations; one replica per GPU node at {gpu_rate:g} decisions/s saturated "
        f"({gpu_source}), {args.gpu_latency_s:g} s a decision at small batch; {args.cores_per_node:g} cores and "
        f"{args.bandwidth_gbit:g} Gbit/s per node; bounds in seconds per iteration"
    )
    for line in projection_table(proj):
        print(line)
    shares = ", ".join(f"{k} {v:g}" for k, v in costs["cpu_ms"].items())
    print(
        f"CPU per decision {proj['cpu_ms_per_decision']} ms ({shares}"
        f"; largest: {proj['largest_cpu_stage']}): a GPU at {gpu_rate:g} decisions/s needs "
        f"{proj['cores_per_gpu_to_stay_fed']} cores to stay fed; learner {proj['learner_s_per_iteration']} s an "
        f"iteration ({records['learner_threads']} CPU threads; {RECORDS['learner_s_per_update'][0]}); "
        f"{costs['bytes_per_decision']:.0f} bytes a decision on the wire"
    )
    print("sources: " + "; ".join(f"{k}: {f}: {key}" for k, (f, key) in RECORDS.items()))

    result = {
        "nodes": args.nodes,
        "policy_latency_s": latency_s,
        "step_ms": args.step_ms,
        "tokens": args.tokens,
        "groups_per_worker": args.groups_per_worker,
        "group_size": args.group_size,
        "max_steps": args.max_steps,
        "repeats": args.repeats,
        "per_n": {str(n): row for n, row in res["per_n"].items()},
        "decisions_per_s_median": {str(n): row["decisions_per_s"]["median"] for n, row in res["per_n"].items()},
        "ratio": res["ratios"],
        "targets": {str(n): t for n, t in TARGETS.items()},
        "targets_met": met,
        "actions_identical": res["identical"],
        "replica": raw["replica"],
        "wall_s": round(raw["wall_s"], 1),
        "cpus": os.cpu_count(),
        "measured_costs": measured,
        "projection": {
            "paper": PAPER,
            "inputs": costs,
            "gpu_rate_source": gpu_source,
            "records": {k: {"file": f, "key": key, "value": records[k]} for k, (f, key) in RECORDS.items()},
            **proj,
        },
    }
    print("RESULT " + json.dumps(result))
    write_result("bench_scaling", result, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
