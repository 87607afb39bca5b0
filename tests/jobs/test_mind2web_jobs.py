"""The Mind2Web jobs (issue 12 item 4): the CPU smoke config runs D1 -> GRPO -> the Mind2Web
evaluation end to end on the generated fixture through ``jobs/grpo_mind2web.py``, the
evaluation job reports per split, and a missing data path or an unsupported setting is one
clear error before any work.

The smoke run is played once (module fixture, ``main`` on the session's Ray, tests/jobs/
conftest.py) and read by three tests; the evaluation job plays the same fixture data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprism_ray.cli import main

SMOKE = ["--config", "configs/mind2web_smoke.yaml", "--run.ray_address", "local", "--run.num_cpus", "2"]


@pytest.fixture(autouse=True)
def _no_mind2web_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIND2WEB_DATA", raising=False)  # the config's path (or its absence) decides


@pytest.fixture(scope="module")
def m2w_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data root both jobs use: the first to run generates the fixture there."""
    return tmp_path_factory.mktemp("mind2web") / "data"


@pytest.fixture(scope="module")
def smoke_run(ray_session, m2w_data: Path, tmp_path_factory: pytest.TempPathFactory, run_job_captured):
    """``jobs/grpo_mind2web.py`` on the smoke config, once: (run directory, its stdout)."""
    runs = tmp_path_factory.mktemp("m2w-runs")
    with pytest.MonkeyPatch.context() as m:
        m.delenv("MIND2WEB_DATA", raising=False)
        status, out, err = run_job_captured(
            "grpo_mind2web.py", [*SMOKE, "--corpus.data_root", str(m2w_data), "--run.out_dir", str(runs)]
        )
    assert status == 0, out[-3000:] + err[-3000:]
    return runs / "mind2web-smoke", out


@pytest.mark.slow
def test_smoke_run_builds_d1_from_the_fixture(smoke_run) -> None:
    run_dir, out = smoke_run
    assert "the generated Mind2Web fixture" in out
    assert len(list(run_dir.glob("d1/*/labels.parquet"))) == 1 and len(list(run_dir.glob("d1/*/checkpoint"))) == 1
    # The D1 checkpoint records the config it was trained with, as a D2 one does (it recorded
    # nothing: its benchmark and text encoder were unknown to an evaluation of it).
    (d1,) = run_dir.glob("d1/*/checkpoint")
    recorded = json.loads((d1 / "config.json").read_text())["extra"]["config"]
    assert recorded["corpus.benchmark"] == "mind2web" and recorded["encoder.max_length"] == 256


@pytest.mark.slow
def test_smoke_run_trains_on_the_action_correct_reward(smoke_run) -> None:
    run_dir, _ = smoke_run
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1].endswith("2")
    its = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in its if r.get("kind") == "grpo"]
    assert len(grpo) == 2
    # The reward is 1[action correct] averaged per trajectory: returns are fractions, not 0/1.
    assert all(0.0 <= r["mean_return"] <= 1.0 for r in grpo)


@pytest.mark.slow
def test_smoke_run_ends_with_the_evaluation_per_split(smoke_run) -> None:
    run_dir, out = smoke_run
    summary = json.loads((run_dir / "eval" / "mind2web.json").read_text())
    assert list(summary["metrics"]) == ["memprism", "no_memory", "full_history"]
    assert summary["splits"] == ["test_task", "test_website", "test_domain"]
    for m in summary["metrics"].values():
        assert m["overall"]["step_accuracy"]["n"] == 20 and m["overall"]["episode_success"]["n"] == 6
        assert m["overall"]["failed_episodes"] == 0
    assert "Paper step accuracy" in out and "MindAct step SR" in out  # each figure under its rule's name


@pytest.mark.slow
def test_eval_job_reports_per_split(
    ray_session, m2w_data: Path, smoke_run, tmp_path: Path, run_job, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    argv = [*SMOKE, "--corpus.data_root", str(m2w_data), "--out", str(out)]
    assert run_job("eval_mind2web.py", [*argv, "--eval.conditions", "no_memory,full_history"]) == 0
    no_mem = json.loads((out / "no_memory" / "mind2web.json").read_text())
    full = json.loads((out / "full_history" / "mind2web.json").read_text())
    # The stand-in reads memory: the full history beats no memory on the same 20 steps.
    assert full["overall"]["step_accuracy"]["correct"] > no_mem["overall"]["step_accuracy"]["correct"]
    # The same plan and policy as the smoke run's final evaluation: the same scores.
    trained = json.loads((smoke_run[0] / "eval" / "mind2web.json").read_text())["metrics"]
    assert full["overall"]["step_accuracy"] == trained["full_history"]["overall"]["step_accuracy"]
    assert no_mem["overall"]["step_accuracy"] == trained["no_memory"]["overall"]["step_accuracy"]
    # Side by side per split: step accuracy, episode success, Mind2Web's own metrics, paired differences.
    assert (out / "mind2web.md").read_text().count("| full_history |") == 4
    # `memprism compare` of two conditions pairs the same 20 steps the reports count.
    capsys.readouterr()
    assert main(["compare", str(out / "no_memory"), str(out / "full_history"), "--boot", "200"]) == 0
    step, *per_split = (json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{"))
    rate = lambda m, split="overall": m[split]["step_accuracy"]["rate"]  # noqa: E731
    assert step["measure"] == "step_accuracy" and step["n_common"] == 20
    assert (step["rate_a"], step["rate_b"]) == (rate(no_mem), rate(full))
    assert step["diff"] == pytest.approx(rate(full) - rate(no_mem))
    # then each split, as the reports count it
    splits = [r for r in per_split if r["measure"] == "step_accuracy"]
    assert [r["split"] for r in splits] == sorted(k for k in no_mem if k.startswith("test_")) and len(splits) == 3
    assert all((r["rate_a"], r["rate_b"]) == (rate(no_mem, r["split"]), rate(full, r["split"])) for r in splits)
    assert run_job("eval_mind2web.py", argv) == 2  # reports are never silently replaced
    assert "already holds an evaluation" in capsys.readouterr().err


def test_missing_data_path_is_one_clear_error(
    tmp_path: Path, run_job, no_ray_start: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", "configs/mind2web_smoke.yaml", "--mind2web.fixture", "false", "--out", str(tmp_path / "eval")]
    assert run_job("eval_mind2web.py", [*argv, "--eval.conditions", "no_memory,full_history"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("[eval] error: no Mind2Web data path") and "MIND2WEB_DATA" in line
    assert "huggingface.co/datasets/osunlp/Mind2Web" in line
    assert not (tmp_path / "eval").exists()


def test_job_settings_are_checked() -> None:
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.benchmark.job_spec import check_job
    from memprism_ray.config import load_config

    check_benchmark = get_benchmark("mind2web").check
    cfg = load_config("configs/mind2web_smoke.yaml")
    check_job(get_benchmark("mind2web").job_spec("grpo"), cfg)
    check_benchmark(cfg)
    with pytest.raises(ValueError, match=r"grpo\.reward='success' is not defined for mind2web"):
        check_benchmark(load_config("configs/mind2web_smoke.yaml", ["--grpo.reward", "success"]))
    five = load_config("configs/mind2web_smoke.yaml", ["--eval.episodes", "5"])
    with pytest.raises(ValueError, match=r"eval\.episodes=5 is not supported by the eval_mind2web job"):
        check_job(get_benchmark("mind2web").job_spec("eval"), five)
    with pytest.raises(ValueError, match=r"corpus\.benchmark='alfworld': the mind2web jobs need mind2web"):
        check_benchmark(load_config("configs/mind2web_smoke.yaml", ["--corpus.benchmark", "alfworld"]))
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
