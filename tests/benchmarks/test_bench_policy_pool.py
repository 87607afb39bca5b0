"""benchmarks/bench_policy_pool.py (issue 31): the repetition logic, the rollout loop's CPU
model, the projection and the RESULT fields, on the fake engine (no GPU)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_policy_pool", ROOT / "benchmarks" / "bench_policy_pool.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bench_policy_pool", bench)  # its dataclasses look their module up
_spec.loader.exec_module(bench)


def test_summarize_gives_median_and_range_of_the_repetitions() -> None:
    s = bench.summarize([20.0, 25.0, 22.0])
    assert s["median"] == 22.0 and s["min"] == 20.0 and s["max"] == 25.0
    assert s["reps"] == [20.0, 25.0, 22.0] and s["range_frac"] == round(5 / 22, 3)
    with pytest.raises(ValueError, match="no repetitions"):
        bench.summarize([])


def test_makespan_assigns_each_task_to_the_first_free_worker() -> None:
    assert bench.makespan([3, 1, 1, 1], parallel=2) == 3  # 3 | 1+1+1
    assert bench.makespan([1, 1, 1, 1], parallel=4) == 1
    assert bench.makespan([2, 2, 2], parallel=1) == 6
    assert bench.makespan([], parallel=4) == 0


def test_cpu_draws_are_seeded_with_the_configured_mean() -> None:
    cpu = bench.CpuModel(ms=20.0, cv=0.5, parallel=4)
    a = cpu.draws(random.Random(1), 20_000)
    assert a == cpu.draws(random.Random(1), 20_000)
    assert abs(sum(a) / len(a) - 0.020) < 0.0005  # seconds
    assert bench.CpuModel(ms=0).draws(random.Random(1), 3) == [0.0, 0.0, 0.0]
    # The mean comes from the profile in docs/experiments/embedded-default-log.md.
    assert bench.CPU_MS_PER_DECISION == 38 - 12.6 + 4.6 - 10


def test_decode_split_recovers_fixed_and_per_token_seconds() -> None:
    fixed, per_token = 0.03, 0.0004
    rate = lambda tokens: 1.0 / (fixed + per_token * tokens)  # noqa: E731
    split = bench.decode_split(rate(48), 48, rate(8), 8)
    assert split["fixed_s"] == pytest.approx(fixed) and split["per_completion_token_s"] == pytest.approx(per_token)
    with pytest.raises(ValueError, match="fewer completion tokens"):
        bench.decode_split(10.0, 8, 12.0, 8)
    # A pattern at half all_at_once's rate costs twice the GPU seconds a call.
    ref = {**split, "ref_rate": rate(48)}
    assert bench.call_seconds(ref, rate(48) / 2, 1.0, 48) == pytest.approx(2 / rate(48))
    assert bench.call_seconds(None, 25.0, 3.0, 999) == pytest.approx(1 / 25)


def test_paper_preset_projection_counts_every_phase() -> None:
    from memprism_ray.config import load_config

    calls = bench.paper_preset_calls(load_config(ROOT / "configs" / "alfworld_paper.yaml"))
    assert calls["d2_rollout"] == 100 * 8 * 16 * 50
    assert calls["evaluation"] == 140 * 8 * 50  # 8 conditions, each with the task policy
    assert calls["d1_teacher"] == pytest.approx(3827 * 69 / 4)
    out = bench.project_gpu_hours(calls, {"d1_teacher": 0.1, "d2_rollout": 1 / 25, "evaluation": 1 / 25})
    assert out["gpu_hours"]["d2_rollout"] == round(640_000 / 25 / 3600, 2)
    assert out["total_gpu_hours"] == round(sum(out["gpu_hours"].values()), 2)


def test_teacher_prompt_prefix_is_the_template_before_its_first_state_field() -> None:
    t = bench.teacher_prompt_tokens()
    assert 10_000 < t["shared_prefix"] < t["total"]


def test_prompts_are_distinct_and_a_group_shares_its_goal() -> None:
    factory = bench.PromptFactory(bases=3, seed=5)
    a = factory.take(4, "w0-core-s0", goal="put a clean mug in cabinet 1")
    b = factory.take(4, "w0-core-s1")
    inputs = a + b
    assert len({i.observation for i in inputs}) == 8
    digests = {hashlib.sha256(i.view_image.tobytes()).hexdigest() for i in inputs}
    assert len(digests) == 8  # bases are reused, but every image is stamped: no cache hit
    assert {i.goal for i in a} == {"put a clean mug in cabinet 1"}


def test_parse_args_refuses_unknown_stages_and_a_long_probe() -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--stages", "core,warp"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--probe-tokens", "48", "--max-tokens", "48"])
    args = bench.parse_args([])
    assert args.steps >= 6 and args.reps == 3 and args.workers * args.group == 128


@pytest.mark.ray
@pytest.mark.slow
def test_fake_engine_run_records_repetitions_and_the_new_result_fields(tmp_path: Path, bench_results_dir: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_policy_pool.py"), "--engine", "fake"]
    cmd += ["--fake-scale", "0.02", "--workers", "2", "--group", "3", "--steps", "2", "--reps", "3"]
    cmd += ["--max-tokens", "6", "--probe-tokens", "2", "--frontend-threads", "2", "--fake-preprocess-ms", "1"]
    cmd += ["--stages", "core,layout,rollout", "--out", str(out)]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    res = json.loads(line[len("RESULT ") :])

    for name in ("all_at_once", "pool", "pool_instructions_first"):
        entry = res["patterns"][name]
        d = entry["decisions_per_s"]
        assert len(d["reps"]) == 3 and d["min"] <= d["median"] <= d["max"], name
        assert entry["decisions"] == 2 * 3 * 2 and entry["in_flight"] == 6 and entry["failed"] == 0
    assert {"rollout_sync", "rollout_ready", "rollout_sync2x"} <= set(res["patterns"])
    assert res["patterns"]["rollout_sync2x"]["in_flight"] == 12
    pool = res["patterns"]["pool"]
    assert pool["prefill_tokens_per_s"] > 0 and pool["fraction_of_compute_limit"] > 0
    assert res["compute_limit_tokens_per_s"] == round(800e12 / (2 * 7.6e9))
    assert len(res["ratio_per_rep"]["reps"]) == 3 and res["ratio"] > 0
    # The engine got the explicit scheduler of the config (parity with vllm.LLM's defaults).
    assert res["scheduler"]["max_num_batched_tokens"] == 16384 and res["scheduler"]["max_num_seqs"] == 1024
    assert res["scheduler"]["frontend_threads"] == 2
    # Front-end timestamps: PNG decode, templating and the engine's (blocking) input processing.
    ms = pool["frontend_ms_per_decision"]
    assert ms["decode"] > 0 and ms["template"] > 0 and ms["mm_preprocess"] >= 1.0
    assert set(res["stage_seconds"]) >= {"engine_start", "warmup", "core", "layout", "rollout"}
    assert res["decode_probe"]["completion_tokens"] == 2
    proj = res["projection"]
    assert "error" not in proj, proj
    assert proj["d2_pattern"] == "rollout_sync" and proj["at_bench_completion"]["total_gpu_hours"] > 0
    assert proj["at_bench_completion"]["calls"]["d2_rollout"] == 640_000
    # The record: bench_policy_pool.fake.json (never the GPU run's file), and --out.
    record = json.loads((bench_results_dir / "bench_policy_pool.fake.json").read_text())
    assert record["result"]["patterns"].keys() == res["patterns"].keys()
    assert json.loads(out.read_text())["ratio"] == res["ratio"]


def test_gpu_bench_script_parses_and_its_dry_run_names_every_stage_in_order() -> None:
    """scripts/gpu_bench.sh cannot run without a GPU: its syntax and plan are checked here."""
    script = ROOT / "scripts" / "gpu_bench.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    env = dict(os.environ, GPU_BENCH_BUDGET_S="540")
    run = subprocess.run(["bash", str(script), "--dry-run", "run"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    order = [line.split()[2] for line in run.stdout.splitlines() if line.startswith("[gpu_bench] stage ")]
    assert order == ["install", "source", "model", "bench", "tests"]
    assert "--enforce-eager" in run.stdout and "--deadline-s" in run.stdout and "nothing ran" in run.stdout
    prep = subprocess.run(["bash", str(script), "--dry-run", "prep"], capture_output=True, text=True, env=env)
    calls = [line for line in prep.stdout.splitlines() if line.strip().startswith("run(")]
    assert len(calls) >= 2 and "scripts/gpu_bench.sh run" in calls[-1] and "tmp/gpu/src.tar.gz" in calls[-1]
    assert all("timeout_s=" in c for c in calls)
