"""The Mind2Web jobs as users run them (issue 12 item 4): the CPU smoke config runs D1 ->
GRPO -> the Mind2Web evaluation end to end on the generated fixture through
``jobs/grpo_mind2web.py`` (its own local Ray), the evaluation job reports per split, and a
missing data path or an unsupported setting is one clear error before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.pop("MIND2WEB_DATA", None)
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _job(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, f"jobs/{script}", "--config", "configs/mind2web_smoke.yaml", *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_smoke_config_runs_d1_grpo_and_eval_end_to_end(tmp_path: Path) -> None:
    run = _job(
        "grpo_mind2web.py",
        "--corpus.data_root", str(tmp_path / "data"), "--run.out_dir", str(tmp_path / "runs"),
        "--run.ray_address", "local", "--run.num_cpus", "2",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = tmp_path / "runs" / "mind2web-smoke"
    assert "the generated Mind2Web fixture" in run.stdout
    assert len(list(run_dir.glob("d1/*/labels.parquet"))) == 1 and len(list(run_dir.glob("d1/*/checkpoint"))) == 1
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1].endswith("2")
    its = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in its if r.get("kind") == "grpo"]
    assert len(grpo) == 2
    # The reward is 1[action correct] averaged per trajectory: returns are fractions, not 0/1.
    assert all(0.0 <= r["mean_return"] <= 1.0 for r in grpo)
    summary = json.loads((run_dir / "eval" / "mind2web.json").read_text())
    assert list(summary["metrics"]) == ["memprism", "no_memory", "full_history"]
    assert summary["splits"] == ["test_task", "test_website", "test_domain"]
    for m in summary["metrics"].values():
        assert m["overall"]["step_accuracy"]["n"] == 20 and m["overall"]["episode_success"]["n"] == 6
        assert m["overall"]["failed_episodes"] == 0
    assert "Step action accuracy" in run.stdout


@pytest.mark.slow
def test_eval_job_reports_per_split(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    run = _job(
        "eval_mind2web.py",
        "--corpus.data_root", str(tmp_path / "data"), "--out", str(out), "--eval.conditions", "no_memory,full_history",
        "--run.ray_address", "local", "--run.num_cpus", "2",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    no_mem = json.loads((out / "no_memory" / "mind2web.json").read_text())
    full = json.loads((out / "full_history" / "mind2web.json").read_text())
    # The stand-in reads memory: the full history beats no memory on the same 20 steps.
    assert full["overall"]["step_accuracy"]["correct"] > no_mem["overall"]["step_accuracy"]["correct"]
    # Step accuracy, episode success, Mind2Web's own metrics (issue 30) and the paired differences.
    assert (out / "mind2web.md").read_text().count("| full_history |") == 4
    again = _job("eval_mind2web.py", "--corpus.data_root", str(tmp_path / "data"), "--out", str(out))
    assert again.returncode == 2 and "already holds an evaluation" in again.stderr


def test_missing_data_path_is_one_clear_error(tmp_path: Path) -> None:
    run = _job("eval_mind2web.py", "--mind2web.fixture", "false", "--out", str(tmp_path / "eval"), timeout=120)
    assert run.returncode == 2
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("[eval] error: no Mind2Web data path") and "MIND2WEB_DATA" in line
    assert "huggingface.co/datasets/osunlp/Mind2Web" in line
    assert not (tmp_path / "eval").exists()


def test_job_settings_are_checked() -> None:
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.config import load_config
    from memprism_ray.pipeline.jobs import check_job

    check_benchmark = get_benchmark("mind2web").check
    cfg = load_config("configs/mind2web_smoke.yaml")
    check_job("grpo_mind2web", cfg)
    check_benchmark(cfg)
    with pytest.raises(ValueError, match=r"grpo\.reward='success' is not defined for mind2web"):
        check_benchmark(load_config("configs/mind2web_smoke.yaml", ["--grpo.reward", "success"]))
    with pytest.raises(ValueError, match=r"eval\.episodes=5 is not supported by the eval_mind2web job"):
        check_job("eval_mind2web", load_config("configs/mind2web_smoke.yaml", ["--eval.episodes", "5"]))
    with pytest.raises(ValueError, match=r"agent\.benchmark='alfworld'"):
        check_benchmark(load_config("configs/mind2web_smoke.yaml", ["--agent.benchmark", "alfworld"]))
    paper = load_config("configs/mind2web_paper.yaml")
    assert (paper.grpo.top_p, paper.grpo.reward, paper.grpo.lr, paper.grpo.iterations) == (
        0.85, "action_correct", 1e-6, 150
    )  # fmt: skip
    assert (paper.grpo.eps_low, paper.grpo.eps_high, paper.grpo.beta_kl, paper.label.teacher) == (
        0.1,
        0.15,
        0.01,
        "llm",
    )
