"""``trainer/grpo.py``: the training-success summary printed before the final evaluation."""

from __future__ import annotations

import json
from pathlib import Path

from memprism_ray.trainer.grpo import training_plot


def _write_metrics(run_dir: Path, success: list[float]) -> None:
    lines = [json.dumps({"kind": "grpo", "step": i + 1, "success_rate": sr}) for i, sr in enumerate(success)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_the_summary_compares_the_replayed_iterations_and_says_so(tmp_path: Path) -> None:
    _write_metrics(tmp_path, [0.1, 0.2, 0.3, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8])
    said: list[str] = []
    assert training_plot(tmp_path, said.append, replay_first=3) == tmp_path / "eval" / "training_success.png"
    assert said == ["training success: first 3 iterations 0.200, last 3 0.700, on the same tasks (grpo.replay_first)"]


def test_without_a_replay_the_summary_compares_five_and_five(tmp_path: Path) -> None:
    _write_metrics(tmp_path, [0.0] * 5 + [1.0] * 5 + [0.5] * 5)
    said: list[str] = []
    training_plot(tmp_path, said.append)
    assert said == ["training success: first 5 iterations 0.000, last 5 0.500"]


def test_final_eval_dir_summarises_by_the_configs_replay(tmp_path: Path) -> None:
    # Every GRPO job (ALFWorld, EB-ALFRED, Mind2Web) schedules by cfg.grpo.replayed_iterations;
    # its summary reads the same property, so no job can replay games and compare others.
    from types import SimpleNamespace

    from memprism_ray.adapter.grpo_update import GRPOConfig
    from memprism_ray.trainer.grpo import final_eval_dir

    _write_metrics(tmp_path, [0.1, 0.2, 0.3, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8])
    cfg = SimpleNamespace(grpo=GRPOConfig(iterations=10, replay_first=3))
    said: list[str] = []
    assert final_eval_dir(tmp_path, cfg, said.append, "exact success") == tmp_path / "eval"
    assert said[0] == (
        "training exact success: first 3 iterations 0.200, last 3 0.700, on the same tasks (grpo.replay_first)"
    )
    assert (tmp_path / "eval" / "training_success.png").exists()


def test_an_interrupted_final_evaluation_is_continued(tmp_path: Path) -> None:
    """A job stopped during its final evaluation left some conditions' reports and no summary; its
    resume used to say the evaluation "exists and is not repeated" and end without the table, then
    played it all again: it is continued (``evaluate(resume=True)`` keeps what it finished)."""
    from types import SimpleNamespace

    from memprism_ray.adapter.grpo_update import GRPOConfig
    from memprism_ray.trainer.grpo import final_eval_dir

    _write_metrics(tmp_path, [0.5] * 4)
    cfg = SimpleNamespace(grpo=GRPOConfig(iterations=4))
    for condition in ("memprism", "no_memory"):
        (tmp_path / "eval" / condition).mkdir(parents=True)
        (tmp_path / "eval" / condition / "report.json").write_text("{}")
    said: list[str] = []
    assert final_eval_dir(tmp_path, cfg, said.append) == tmp_path / "eval"
    assert said[0] == "the final evaluation was interrupted after memprism, no_memory (no summary): continuing it"
    assert (tmp_path / "eval" / "no_memory" / "report.json").exists()  # kept for evaluate to judge
    # A finished evaluation (its summary written) is never repeated.
    (tmp_path / "eval" / "summary.md").write_text("table")
    assert final_eval_dir(tmp_path, cfg, said.append) is None
    assert said[-1].endswith("the final evaluation of this run exists and is not repeated")
    # One whose summary counts failed episodes keeps its progress record: they are played again.
    (tmp_path / "eval" / "progress.json").write_text('{"reports": {}}')
    assert final_eval_dir(tmp_path, cfg, said.append) == tmp_path / "eval"
    assert said[-1] == "the final evaluation ended with failed episodes (its summary): playing them again"


def test_a_torn_last_row_is_said_and_the_summary_still_printed(tmp_path: Path) -> None:
    """Issue 40 item 4: a killed writer's half row at the end of metrics.jsonl used to raise
    JSONDecodeError here, before the final evaluation."""
    _write_metrics(tmp_path, [0.0] * 5 + [1.0] * 5)
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"kind": "grpo", "step": 11, "succ')
    said: list[str] = []
    assert training_plot(tmp_path, said.append) == tmp_path / "eval" / "training_success.png"
    assert said[-1] == "training success: first 5 iterations 0.000, last 5 1.000"
    assert any("line 11" in s and "torn" in s for s in said[:-1]), said


def test_a_worker_lost_with_its_node_counts_when_ray_marks_the_node_dead_late(ray_session, monkeypatch) -> None:
    """Issue 40: Ray marks a killed node dead only when its health checks fail (about 15 s by
    default); an iteration that ended first counted its workers as replaced, not lost
    (``workers_lost`` read 0). Ray's verdict is awaited now: here the node is listed alive
    twice, runs no probe, then is dead."""
    import itertools

    from memprism_ray.cluster import placement_record

    verdicts = itertools.chain([True, True], itertools.repeat(False))
    monkeypatch.setattr(placement_record, "node_alive", lambda node_id: next(verdicts))
    assert placement_record.node_lost("ab" * 28, timeout_s=30) is True
    # A node that runs the probe is alive whatever Ray's table says at first (a process died, not a node).
    here = ray_session.get_runtime_context().get_node_id()
    monkeypatch.setattr(placement_record, "node_alive", lambda node_id: True)
    assert placement_record.node_lost(here, timeout_s=30) is False
