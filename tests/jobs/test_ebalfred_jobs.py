"""``jobs/eval_ebalfred.py`` and ``jobs/grpo_ebalfred.py`` on the smoke preset (fake controller
over the fixture, scripted stand-in). The jobs and the refusals run ``main`` in this process
(tests/jobs/conftest.py) on the session's Ray; tests/cluster runs the GRPO job as users run it,
a process of its own joining a cluster of several nodes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

SMALL = ["--ebalfred.subsets", "base,long_horizon", "--ebalfred.episodes_per_subset", "2"]


def _args(out: Path, *extra: str) -> list[str]:
    return [
        "--config",
        "configs/ebalfred_smoke.yaml",
        "--run.out_dir",
        str(out),
        "--run.ray_address",
        "local",
        "--run.num_cpus",
        "2",
        "--run.tensorboard",
        "false",
        *SMALL,
        *extra,
    ]


@pytest.fixture
def clean_ebalfred_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``MEMPRISM_EBALFRED_*`` variable of the caller's shell reaches an in-process job."""
    for key in [k for k in os.environ if k.startswith("MEMPRISM_EBALFRED_")]:
        monkeypatch.delenv(key)


def _check_report(eval_dir: Path, conditions: list[str]) -> None:
    tables = json.loads((eval_dir / "ebalfred_report.json").read_text())
    assert list(tables) == conditions
    summary = (eval_dir / "summary.md").read_text()
    assert "| Condition | Base | Long | Avg |" in summary
    for condition in conditions:
        t = tables[condition]
        assert list(t["subsets"]) == ["base", "long_horizon"] and t["pooled"]["n"] == 4
        eps = pq.read_table(eval_dir / condition.replace(":", "_") / "episodes.parquet").to_pylist()
        wins = {s: sum(e["won"] for e in eps if e["game_id"].startswith(s + "/")) for s in ("base", "long_horizon")}
        assert {s: t["subsets"][s]["successes"] for s in wins} == wins
        # Table A.4 reward: success + 0.2 x final progress, per episode
        for e in eps:
            assert 0.0 <= e["reward"] <= 1.2 + 1e-6
        steps = pq.read_table(eval_dir / condition.replace(":", "_") / "steps.parquet")
        assert min(steps.column("camera_visual_tokens").to_pylist()) > 0  # the frame is in every prompt
        rows = steps.select(["text_tokens", "visual_tokens", "camera_visual_tokens", "prompt_tokens"]).to_pylist()
        for r in rows:
            assert r["prompt_tokens"] == r["text_tokens"] + r["visual_tokens"] + r["camera_visual_tokens"]
        if condition.startswith("fixed:"):  # frame and optical view in one prompt, both counted
            assert min(r["visual_tokens"] for r in rows) > 0
        assert sum(t["subsets"][s]["successes"] for s in wins) == t["pooled"]["successes"]


@pytest.mark.ray
def test_eval_job_reports_per_subset_sr(
    ray_session, tmp_path: Path, run_job, clean_ebalfred_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_job("eval_ebalfred.py", _args(tmp_path)) == 0
    _check_report(tmp_path / "ebalfred-smoke" / "eval", ["no_memory", "fixed:TemporalTrace"])
    capsys.readouterr()
    assert run_job("eval_ebalfred.py", _args(tmp_path)) == 2  # reports are never silently replaced
    assert "already holds an evaluation" in capsys.readouterr().err


@pytest.mark.ray
def test_grpo_job_trains_on_progress_reward(
    ray_session, tmp_path: Path, actors_reference_ckpt: Path, run_job_captured, clean_ebalfred_env: None
) -> None:
    status, out, err = run_job_captured(
        "grpo_ebalfred.py",
        _args(tmp_path, "--init_checkpoint", str(actors_reference_ckpt), "--grpo.iterations", "1",
              "--eval.conditions", "no_memory"),
    )  # fmt: skip
    assert status == 0, out[-3000:] + err[-3000:]
    run = tmp_path / "ebalfred-smoke"
    assert (run / "checkpoints" / "iter_0001").is_dir()
    its = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (grpo,) = [x for x in its if x.get("kind") == "grpo"]
    # returns are success + 0.2 x progress, not the binary success of ALFWorld
    assert grpo["mean_return"] == pytest.approx(1.2 * grpo["success_rate"], abs=0.25)
    assert grpo["mean_return"] != grpo["success_rate"] or grpo["success_rate"] == 0.0
    _check_report(run / "eval", ["no_memory"])


def test_jobs_reject_a_non_ebalfred_config(
    tmp_path: Path, run_job, no_ray_start: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_job("eval_ebalfred.py", _args(tmp_path, "--corpus.benchmark", "alfworld")) == 2
    err = capsys.readouterr().err
    # Benchmark.check refuses it (the one place): the job declares nothing beyond it.
    assert "corpus.benchmark='alfworld': the ebalfred jobs need ebalfred" in err
