"""What a job checks before any work (issue 10): settings it cannot honour, and a task-policy
backend that cannot run here, are one-line errors at config load, before Ray or D1 start."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memprism_ray.benchmark import get_benchmark
from memprism_ray.benchmark.job_spec import JobSpec, check_job
from memprism_ray.config import joins_cluster, load_config
from memprism_ray.trainer.job_args import parse_job_args

GRPO_ALFWORLD = get_benchmark("alfworld").job_spec("grpo")
EVAL_ALFWORLD = get_benchmark("alfworld").job_spec("eval")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))


def test_a_job_rejects_a_setting_it_would_ignore(monkeypatch: pytest.MonkeyPatch) -> None:
    # The GRPO job labels D1 with either teacher (adapter/d1_labels.py); a job declaring
    # only the counterfactual teacher rejects the LLM one instead of ignoring it.
    assert GRPO_ALFWORLD.supports["label.teacher"] == ("counterfactual", "llm")
    narrow = JobSpec("grpo_alfworld", supports={"label.teacher": ("counterfactual",)})
    cfg = load_config("configs/local.yaml", ["--label.teacher", "llm"])
    with pytest.raises(ValueError) as err:
        check_job(narrow, cfg, environ={})
    assert str(err.value) == (
        "label.teacher='llm' is not supported by the grpo_alfworld job; it supports: counterfactual"
    )
    check_job(EVAL_ALFWORLD, cfg, environ={})  # the eval job never labels views
    check_job(narrow, load_config("configs/local.yaml"), environ={})


def test_widening_a_jobs_declaration_is_the_one_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark's jobs' declarations are its own (``Benchmark.job_supports``): widening one is
    the one switch, and EB-ALFRED's GRPO job labels with the LLM teacher only."""
    from memprism_ray.benchmark.alfworld.benchmark import Alfworld

    cfg = load_config("configs/local.yaml", ["--label.teacher", "llm"])
    monkeypatch.setattr(Alfworld, "job_supports", {"grpo": {"label.teacher": ("counterfactual",)}})
    with pytest.raises(ValueError, match="not supported"):
        check_job(get_benchmark("alfworld").job_spec("grpo"), cfg, environ={})
    monkeypatch.setattr(Alfworld, "job_supports", {"grpo": {"label.teacher": ("counterfactual", "llm")}})
    check_job(get_benchmark("alfworld").job_spec("grpo"), cfg, environ={})
    eb = load_config("configs/ebalfred_smoke.yaml", ["--label.teacher", "counterfactual"])
    with pytest.raises(ValueError, match=r"label\.teacher='counterfactual' is not supported by the grpo_ebalfred job"):
        check_job(get_benchmark("ebalfred").job_spec("grpo"), eb, environ={})


def test_a_vllm_policy_on_a_machine_without_vllm_fails_at_load(no_vllm: None) -> None:
    cfg = load_config("configs/alfworld_paper.yaml")
    with pytest.raises(ValueError, match=r"^policy\.backend=vllm needs vLLM, which is not importable here"):
        check_job(GRPO_ALFWORLD, cfg, environ={})
    with pytest.raises(ValueError, match=r"^policy\.backend=vllm needs vLLM"):
        check_job(EVAL_ALFWORLD, cfg, environ={"RAY_ADDRESS": ""})
    # Under `ray job submit` the driver may sit on a CPU head; the GPU nodes run the policy.
    check_job(GRPO_ALFWORLD, cfg, environ={"RAY_ADDRESS": "http://127.0.0.1:8265"})
    local = load_config("configs/alfworld_paper.yaml", ["--run.ray_address", "local"])
    with pytest.raises(ValueError, match="needs vLLM"):
        check_job(GRPO_ALFWORLD, local, environ={"RAY_ADDRESS": "http://127.0.0.1:8265"})


def test_joins_cluster_only_for_auto_under_ray_job_submit() -> None:
    """The one rule init_ray, check_job and run_evaluation share: ``auto`` with ``RAY_ADDRESS`` set."""
    assert joins_cluster("auto", {"RAY_ADDRESS": "http://127.0.0.1:8265"})
    assert not joins_cluster("auto", {"RAY_ADDRESS": ""})
    assert not joins_cluster("auto", {})
    assert not joins_cluster("local", {"RAY_ADDRESS": "http://127.0.0.1:8265"})


def test_parse_job_args_exits_2_with_the_error(
    no_vllm: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    narrow = JobSpec("grpo_alfworld", supports={"label.teacher": ("counterfactual",)})
    with pytest.raises(SystemExit) as exc:
        parse_job_args("x", ["--config", "configs/local.yaml", "--label.teacher", "llm"], job=narrow)
    assert exc.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith("error: label.teacher='llm' is not supported by the grpo_alfworld job; it supports: counterfactual")
    )
    _, cfg = parse_job_args("x", ["--config", "configs/local.yaml", "--label.teacher", "llm"])
    assert cfg.label.teacher == "llm"  # without a job name nothing job-specific is checked


def test_a_group_of_one_ends_the_job_at_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40 item 7: ``--grpo.group_size 1`` is one line and exit status 2 from the job's entry,
    before any run directory, Ray or D1 (it used to train with every advantage 0)."""
    from memprism_ray.trainer.fit import grpo_job

    with pytest.raises(SystemExit) as exc:
        grpo_job("alfworld", "x", ["--config", "configs/local.yaml", "--grpo.group_size", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.endswith(
        "error: grpo.group_size must be at least 2: GRPO's advantage is a reward minus its group's mean, so a "
        "group of 1 has advantage 0 and nothing trains; got 1"
    )


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is importable on this machine")
def test_the_paper_preset_fails_before_ray_or_d1_without_vllm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "jobs/grpo_alfworld.py", "--config", "configs/alfworld_paper.yaml",
         "--run.out_dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "error: policy.backend=vllm needs vLLM, which is not importable here: install it on a GPU machine "
            "(clusters/node_setup.sh install gpu, or docker/Dockerfile.gpu; see clusters/README.md) or pick another "
            "backend (--policy.backend openai|hf|scripted)"
        )
    )
    assert list(tmp_path.iterdir()) == []  # no run directory, no D1


def test_corpus_cache_dir_holds_one_folder_per_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``corpus.cache_dir`` names the folder the way the default cache does, sizes included, and
    the resolved data root is the tree built there."""
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    sizes = ["--corpus.train_games", "1", "--corpus.eval_games", "0", "--corpus.seed", "4"]
    cfg = load_config(None, ["--corpus.cache_dir", str(tmp_path), *sizes])
    got = get_benchmark("alfworld").prepare(cfg, lambda _: None)
    assert Path(got.corpus.data_root).is_relative_to(tmp_path / "alfworld-corpus-4-t1-e0")
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["alfworld-corpus-4-t1-e0"]


def test_the_evaluation_paths_expand_the_home_of_the_node_the_job_runs_on() -> None:
    """``ray job submit -- python jobs/eval_X.py --checkpoint '~/runs/a/checkpoints/iter_0010'``
    reaches the job quoted, as written (the submitting machine's shell expands nothing)."""
    args, _ = parse_job_args(
        "x", ["--config", "configs/local.yaml", "--checkpoint", "~/runs/c", "--out", "~/ev"], evaluation=True
    )
    assert (args.checkpoint, args.out) == (str(Path.home() / "runs" / "c"), str(Path.home() / "ev"))
    args, _ = parse_job_args("x", ["--config", "configs/local.yaml"], evaluation=True)
    assert (args.checkpoint, args.out) == ("", "")


@pytest.mark.parametrize("resume", [["--resume", "auto"], ["--run.resume", "auto"], ["--run.resume=auto"]])
def test_a_job_without_a_run_to_continue_refuses_resume(resume: list[str], capsys: pytest.CaptureFixture) -> None:
    """The D1 and evaluation jobs accepted ``--resume auto`` and ignored it (D1 reuses what it
    finished by itself, an evaluation refuses an existing report directory)."""
    with pytest.raises(SystemExit) as done:
        parse_job_args("d1", ["--config", "configs/local.yaml", *resume], resumable=False)
    assert done.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith(
            "error: --resume continues a GRPO run and this job has none: D1 reuses the stages it finished by itself, "
            "an evaluation writes a new report directory"
        )
    )
    assert parse_job_args("grpo", ["--config", "configs/local.yaml", *resume])[1].run.resume == "auto"


def test_a_resumed_runs_own_config_is_taken_by_a_job_that_does_not_resume(tmp_path: Path) -> None:
    """A resumed run's config.yaml says ``run.resume: auto``: evaluating with it is no resume."""
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    cfg.setdefault("run", {})["resume"] = "auto"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    _, got = parse_job_args("eval", ["--config", str(tmp_path / "config.yaml")], evaluation=True, resumable=False)
    assert got.run.resume == "auto"
