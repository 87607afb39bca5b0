"""benchmarks/bench_scaling.py (issue 34 item 6): the pure parts -- the summary, the ratios and
targets, the CPU accounting's roles and split, the analysis of repetitions (identical play
across N), the projection's inputs and arithmetic, the records it cites -- without a cluster."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_scaling", ROOT / "benchmarks" / "bench_scaling.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bench_scaling", bench)
_spec.loader.exec_module(bench)

COSTS = {
    "cpu_ms": {"env": 10.0, "router": 10.0},
    "serial_ms": 10.0,
    "gpu_rate": 20.0,
    "gpu_latency_s": 0.5,
    "learner_s_per_decision": 0.01,
    "bytes_per_decision": 1000.0,
    "weights_bytes": 1_000_000,
    "cores_per_node": 4.0,
    "bandwidth_bytes_s": 1e8,
}


def test_summary_ratios_and_targets() -> None:
    s = bench.summarize([8.0, 10.0, 9.0])
    assert (s["median"], s["min"], s["max"], s["range_frac"]) == (9.0, 8.0, 10.0, round(2 / 9, 3))
    with pytest.raises(ValueError, match="no repetitions"):
        bench.summarize([])
    ratios = bench.scaling_ratios({1: 8.0, 2: 15.0, 4: 25.0})
    assert ratios == {"2": 1.875, "4": 3.125}
    assert bench.targets_met(ratios) == {"2": True, "4": False}
    assert bench.targets_met({"2": 1.6}) == {"2": True, "4": None}  # N=4 not measured
    with pytest.raises(ValueError, match="N=1"):
        bench.scaling_ratios({2: 15.0})


def test_roles_and_the_rollout_workers_cpu_split() -> None:
    assert bench.role_of("ray::RolloutWorker.run_group") == "rollout_worker"
    assert bench.role_of("ray::EnvWorker.step") == "env_worker"
    assert bench.role_of("ray::PolicyReplica") == "policy_replica"
    assert bench.role_of("/venv/bin/raylet --node_id=x") == "ray_system"
    assert bench.role_of("ray::IDLE") == "ray_system"
    # 10 ms of CPU, stages of 4 + 2 ms wall: they keep theirs, the rest is the wire.
    assert bench.cpu_split(10.0, {"router": 4.0, "views": 2.0}) == {"router": 4.0, "views": 2.0, "wire": 4.0}
    # Less CPU than the stages' wall time (waiting for a core): shared out in proportion.
    assert bench.cpu_split(3.0, {"router": 4.0, "views": 2.0}) == {"router": 2.0, "views": 1.0, "wire": 0.0}
    assert bench.cpu_split(3.0, {}) == {"wire": 3.0}
    rep = {"seconds": 10.0, "cpu_s": {"ray_system": 2.0, "driver": 0.5}, "idle_cores": {"ray_system": 0.05}}
    assert bench.net_cpu_s(rep, "ray_system") == pytest.approx(1.5)
    assert bench.net_cpu_s(rep, "driver") == 0.5
    assert bench.net_cpu_s({**rep, "idle_cores": {"ray_system": 1.0}}, "ray_system") == 0.0


def _rep(seconds: float, decisions: int) -> dict:
    stage = dict.fromkeys((*bench.STAGE_COLUMNS, "env_ms", "policy_latency_ms"), 1.0)
    return {
        "seconds": seconds,
        "decisions": decisions,
        "cpu_s": dict.fromkeys(bench.ROLES, 0.1),
        "idle_cores": {},
        "machine_busy_cores": 0.5,
        "load_avg_1min": 1.0,
        "stage_ms": {**stage, "policy_ms": 100.0, "step_ms": 110.0},
        "row_bytes": 4000.0,
    }


def test_analyse_medians_ratios_and_identical_play_across_n() -> None:
    play = {"it0001-g0": (["go to desk 1"], [3]), "it0001-g1": (["look"], [1])}
    raw = {
        "per_n": {1: [_rep(10.0, 80), _rep(8.0, 80)], 2: [_rep(10.0, 160), _rep(10.0, 160)]},
        "tables": {(1, 0): dict(play), (1, 1): {}, (2, 0): {**play, "it0001-g2": (["x"], [0])}, (2, 1): {}},
        "engine": {1: {"mean_groups_per_step": 1.0}},
    }
    args = argparse.Namespace(groups_per_worker=2, repeats=2)
    res = bench.analyse(raw, args)
    assert res["per_n"][1]["decisions_per_s"]["median"] == 9.0  # 8 and 10
    assert res["per_n"][2]["decisions_per_s"]["median"] == 16.0
    assert res["ratios"] == {"2": round(16 / 9, 3)}
    assert res["per_n"][1]["cpu_ms_per_decision"]["rollout_worker"] == 1.25  # 0.1 s / 80
    assert res["identical"] is True
    raw["tables"][(2, 0)]["it0001-g1"] = (["look"], [2])  # another view on the shared group
    assert bench.analyse(raw, args)["identical"] is False
    costs = bench.measured_costs(res["per_n"][1], 4000.0, 123)
    assert costs["serial_ms"] == 10.0  # step 110 less the policy call's 100, per decision
    assert costs["cpu_ms"]["env"] == 1.25 and costs["cpu_ms"]["controller"] == 2.5
    assert set(costs["cpu_ms"]) == {"env", "router", "views", "phi", "wire", "policy front end", "controller"}


def test_projection_arithmetic() -> None:
    proj = bench.project(COSTS)
    assert proj["decisions_per_iteration"] == 8 * 16 * 50
    assert proj["cpu_ms_per_decision"] == 20.0
    assert proj["cores_per_gpu_to_stay_fed"] == 0.4  # 20 decisions/s x 20 ms
    assert proj["learner_s_per_iteration"] == 64.0
    assert proj["group_critical_path_s"] == 48.0  # 50 x (16 x 10 ms + max(0.5, 16 / 20))
    one, four, sixteen = proj["rows"]
    assert one["bounds_s"] == {"policy pool": 320.0, "group critical path": 48.0, "cpu": 32.0, "learner": 64.0,
                               "wire": 0.14}  # fmt: skip
    assert one["iteration_s"] == 384.08  # 320 + 64 + the weights to 8 seats, 0.08
    assert (one["bottleneck"], one["gpu_busy"], one["cpu_cores_busy_per_gpu"]) == ("policy pool", 0.833, 0.4)
    assert four["bounds_s"]["policy pool"] == 80.0 and four["bottleneck"] == "policy pool"
    # 16 replicas but 8 groups: only 8 busy, and the groups' 50 sequential steps set the floor.
    assert sixteen["replicas_busy"] == 8 and sixteen["bounds_s"]["policy pool"] == 40.0
    assert (sixteen["rollout_bottleneck"], sixteen["bottleneck"]) == ("group critical path", "learner")
    assert sixteen["iteration_s"] == 112.08 and sixteen["gpu_busy"] == round(20 / 112.08, 3)
    assert sixteen["run_hours"] == round(100 * 112.08 / 3600, 2)
    lines = bench.projection_table(proj)
    assert len(lines) == 4 and lines[3].endswith("learner (group critical path)")


def test_projection_inputs_take_the_paper_horizon_views_and_the_records_bytes() -> None:
    measured = {"cpu_ms": {"views": 0.5, "env": 7.0}, "serial_ms": 9.0, "row_bytes": 4000.0, "weights_bytes": 50}
    records = {
        "views_ms_at_50": 1.5,
        "png_bytes_per_episode_50": 750_000,
        "delta_bytes_per_episode_50": 35_000,
        "learner_s_per_update": 9.0,
        "learner_update_decisions": 600,
        "learner_threads": 2,
    }
    costs = bench.projection_costs(
        measured, records, gpu_rate=19.0, gpu_latency_s=0.3, cores_per_node=16, bandwidth_gbit_s=8
    )
    assert costs["cpu_ms"] == {"views": 1.5, "env": 7.0} and costs["serial_ms"] == 10.0
    assert costs["bytes_per_decision"] == 15_000 + 700 + 4000
    assert costs["learner_s_per_decision"] == 0.015 and costs["bandwidth_bytes_s"] == 1e9
    # This run's views already cost more than the record's: kept as measured.
    more = {**measured, "cpu_ms": {"views": 2.0}}
    assert bench.projection_costs(
        more, records, gpu_rate=19.0, gpu_latency_s=0.3, cores_per_node=16, bandwidth_gbit_s=8
    )["cpu_ms"] == {"views": 2.0}


def test_every_cited_record_key_exists(tmp_path: Path) -> None:
    for name, (file, key) in bench.RECORDS.items():
        assert bench.record_value(file, key) is not None, name
    assert bench.record_value("missing.json", "x", results_dir=tmp_path) is None
    assert bench.scaling_table({1: {"decisions": 80, "decisions_per_s": bench.summarize([8.0])}}, {})[1].split()[
        :3
    ] == [
        "1",
        "80",
        "8.00",
    ]
