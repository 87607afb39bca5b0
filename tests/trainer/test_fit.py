"""The trainer's start and its failures, as a user meets them (issue 29, item 9): a start that
cannot succeed is one line and exit status 2 and leaves nothing behind; a dead Learner is one
line naming the last checkpoint and the ``--resume auto`` command that continues."""

from __future__ import annotations

import errno
import importlib
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memprism_ray.benchmark import get_benchmark
from memprism_ray.config import load_config

fit_module = importlib.import_module("memprism_ray.trainer.fit")  # the package re-exports fit(), the function


def _cfg(tmp_path: Path, corpus: Path, *extra: str):
    return load_config(
        "configs/local.yaml",
        ["--corpus.data_root", str(corpus), "--run.out_dir", str(tmp_path), "--run.name", "r", *extra],
    )


def test_a_run_dir_through_a_regular_file_is_one_line(
    tmp_path: Path, memprism_tiny_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_text("x")
    cfg = load_config("configs/local.yaml", ["--run.out_dir", str(tmp_path / "f" / "runs"), "--run.name", "r"])
    assert fit_module.fit(cfg, get_benchmark("alfworld"), []) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[grpo] error: run directory") and "--run.out_dir" in err[0]


def test_training_on_the_evaluation_games_is_refused_and_leaves_no_run_dir(
    tmp_path: Path, memprism_tiny_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _cfg(tmp_path, memprism_tiny_corpus, "--alfworld.eval_split", "train")
    assert fit_module.fit(cfg, get_benchmark("alfworld"), []) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "alfworld evaluation tasks are also training tasks" in err[0]
        and "alfworld.eval_split" in err[0]
    )
    assert not cfg.run.dir.exists()


@pytest.fixture
def fit_grpo_by(
    tmp_path: Path, memprism_tiny_corpus: Path, actors_reference_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[Callable[..., object], list[str]], int]:
    """``fit`` on the tiny corpus without Ray or actors, its GRPO phase the given function: the
    exit status for the job arguments ``argv``."""
    from memprism_ray.cluster import node_data, placement
    from memprism_ray.trainer import grpo

    def run(iterations: Callable[..., object], argv: list[str], *settings: str) -> int:
        monkeypatch.setattr(placement, "init_ray", lambda *a, **k: {"CPU": 2.0})
        monkeypatch.setattr(node_data, "ship", lambda *a, **k: node_data.NodeData())
        monkeypatch.setattr(grpo, "start_training_actors", lambda *a, **k: None)
        monkeypatch.setattr(grpo, "run_grpo_iterations", iterations)
        cfg = _cfg(tmp_path, memprism_tiny_corpus, "--init_checkpoint", str(actors_reference_ckpt), *settings)
        return fit_module.fit(cfg, get_benchmark("alfworld"), argv)

    return run


def test_a_dead_learner_is_one_line_with_the_command_that_continues(
    fit_grpo_by: Callable[[Callable[..., object], list[str]], int], capsys: pytest.CaptureFixture[str]
) -> None:
    from ray.exceptions import ActorDiedError

    def died(*_args: object, **_kwargs: object) -> None:
        raise ActorDiedError()

    argv = ["--config", "configs/local.yaml", "--resume", "auto", "--grpo.iterations", "3"]
    assert fit_grpo_by(died, argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[grpo] error: the Learner actor died (ActorDiedError)")
    assert "last checkpoint: none yet" in err[0]
    assert err[0].endswith("--config configs/local.yaml --grpo.iterations 3 --resume auto")


def test_a_warm_start_from_a_router_trained_otherwise_is_said(
    tmp_path: Path, actors_reference_ckpt: Path, fit_grpo_by: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--init_checkpoint`` of a Router another benchmark or another text encoder trained went
    on without a word: GRPO then fine-tunes it on features it never learned on."""
    import json
    import shutil

    ckpt = tmp_path / "other"
    shutil.copytree(actors_reference_ckpt, ckpt)
    meta = json.loads((ckpt / "config.json").read_text())
    meta["extra"] = {"config": {"corpus.benchmark": "mind2web", "encoder.model_name_or_path": None,
                                "encoder.max_length": 128}}  # fmt: skip
    (ckpt / "config.json").write_text(json.dumps(meta))

    def stop(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        fit_grpo_by(stop, ["--config", "configs/local.yaml"], "--init_checkpoint", str(ckpt))
    notes = [line for line in capsys.readouterr().out.splitlines() if "note: init_checkpoint" in line]
    assert notes == [
        f"[grpo] note: init_checkpoint {ckpt} was trained on mind2web; this run is alfworld",
        f"[grpo] note: init_checkpoint {ckpt} was trained with encoder.max_length 128; this run encodes with 256: "
        "its features differ from its training's",
    ]


def test_resume_auto_without_a_checkpoint_says_it_starts_over(
    tmp_path: Path, fit_grpo_by: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--resume auto`` on a run with nothing to resume (a misspelt ``--run.name``, a run killed
    in D1) trains from the start, as documented, and says so before it does."""

    def died(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("stop here")

    argv = ["--config", "configs/local.yaml", "--resume", "auto"]
    with pytest.raises(RuntimeError, match="stop here"):
        fit_grpo_by(died, argv, "--run.resume", "auto")
    out = capsys.readouterr().out
    assert f"[grpo] --resume auto: no run directory at {tmp_path / 'r'}: training starts at iteration 1\n" in out
    with pytest.raises(RuntimeError, match="stop here"):
        fit_grpo_by(died, argv, "--run.resume", "auto")
    out = capsys.readouterr().out
    assert (
        f"no checkpoint yet at {tmp_path / 'r'}: training starts at iteration 1 (finished D1 stages are reused)" in out
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stopped_job_is_one_line_with_the_command_that_continues(
    signum: int, fit_grpo_by: Callable[[Callable[..., object], list[str]], int], capsys: pytest.CaptureFixture[str]
) -> None:
    """``ray job stop`` (SIGTERM), Ctrl-C (SIGINT) and a closed terminal (SIGHUP) mid-run: one line
    saying what is kept and how to continue, exit status 128 + the signal; they ended in Ray's
    stack dump, a traceback or nothing."""

    def stop_mid_run(cfg: object, actors: object, games: object, logger: object, run_dir: Path, *_: object) -> None:
        (run_dir / "checkpoints" / "iter_0001").mkdir(parents=True)
        (run_dir / "checkpoints" / "iter_0001" / "config.json").write_text("{}")
        os.kill(os.getpid(), signum)  # to this process, as `ray job stop` and a terminal send it
        time.sleep(30)
        pytest.fail(f"{signal.Signals(signum).name} did not stop the run")

    def sentinel(*_: object) -> None:  # what was installed before the job must be there after it
        raise AssertionError("the job's own handler was not in place")

    argv = ["--config", "configs/local.yaml", "--grpo.iterations", "3"]
    before = {s: signal.signal(s, sentinel) for s in (signal.SIGTERM, signal.SIGHUP)}
    # Python's Ctrl-C handler, as in a terminal: a runner that starts the suite in the background
    # (`cmd &` in a script) hands it SIGINT ignored, and a test must not depend on that.
    before_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert fit_grpo_by(stop_mid_run, argv) == 128 + signum
        assert signal.getsignal(signal.SIGTERM) is sentinel and signal.getsignal(signal.SIGHUP) is sentinel
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        signal.signal(signal.SIGINT, before_int)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"[grpo] error: stopped by {signal.Signals(signum).name}; last checkpoint: ")
    assert err[0].endswith(f"iter_0001; continue with: python {sys.argv[0]} {shlex.join(argv)} --resume auto")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["full", "read-only"])
def test_a_full_disk_is_one_line_naming_the_file_and_what_the_run_kept(code: int) -> None:
    """A checkpoint, a metrics row or a report that its disk could not hold ended in a traceback
    (the file named by io_atomic's writer: tests/test_io_atomic.py)."""
    path = "/runs/r/checkpoints/iter_0002/state.pt"

    def fails(exc: OSError) -> Callable[[], int]:
        def work() -> int:
            raise exc

        return work

    errors: list[str] = []
    kept = lambda: "last checkpoint: iter_0001"  # noqa: E731
    assert fit_module.explained(fails(OSError(code, os.strerror(code), path)), errors.append, kept) == 1
    fix = "make that file system writable" if code == errno.EROFS else "free space on that disk"
    assert errors == [f"{os.strerror(code)} writing {path}: {fix}; last checkpoint: iter_0001"]
    with pytest.raises(PermissionError):  # not a disk's state: propagates as it was
        fit_module.explained(fails(PermissionError(errno.EACCES, "Permission denied", path)), errors.append, kept)


def test_without_resume_drops_every_spelling() -> None:
    args = ["--resume", "x", "--a", "1", "--run.resume=auto", "--resume=p", "--run.resume", "y", "--b"]
    assert fit_module._without_resume(args) == ["--a", "1", "--b"]


@pytest.mark.ray
def test_an_actor_that_fails_in_init_is_one_line_naming_its_cause(ray_session, tmp_path: Path) -> None:
    """Ray keeps only the text of an exception raised in ``__init__`` (an ``ActorDiedError``
    with no ``.cause``); the job still ends in one line naming the actor, its node and the
    cause (issue 40: it ended in a traceback)."""
    from memprism_ray.actors.learner import Learner
    from memprism_ray.adapter.grpo_update import GRPOConfig
    from memprism_ray.benchmark import DataTree
    from memprism_ray.cluster.node_data import NodeData

    missing = tmp_path / "not-here" / "ckpt"
    data = NodeData(checked=(DataTree(str(missing.parent), "corpus.data_root", owned=False, fix="mount it"),))
    learner = Learner.options(num_cpus=0).remote(GRPOConfig(), str(missing), "", 1, data)
    errors: list[str] = []
    work = lambda: ray_session.get(learner.iteration.remote(), timeout=120)  # noqa: E731
    assert fit_module.explained(work, errors.append, lambda: "") == 1
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert errors[0].startswith("Learner could not start on 127.0.0.1: NodeDataError: corpus.data_root ")
    assert f"{missing.parent} does not exist on node 127.0.0.1 (" in errors[0] and errors[0].endswith("): mount it")


@pytest.mark.ray
def test_a_task_that_cannot_load_the_text_encoder_is_one_line(ray_session, tmp_path: Path) -> None:
    """``--encoder.model_name_or_path`` naming no directory failed in the first D1 labelling
    task (a Ray task, not an actor), in a traceback."""
    from memprism_ray.router.encoder import EncoderConfig, TextEncoder

    @ray_session.remote(num_cpus=0)
    def load(cfg: EncoderConfig) -> int:
        TextEncoder(cfg)
        return 0

    cfg = EncoderConfig(model_name_or_path=str(tmp_path / "minilm"))
    errors: list[str] = []
    work = lambda: ray_session.get(load.remote(cfg), timeout=120)  # noqa: E731
    assert fit_module.explained(work, errors.append, lambda: "") == 1
    assert errors == [
        f"cannot load the text encoder from {tmp_path / 'minilm'} (offline: only local directories or models "
        "already in the Hugging Face cache): no such directory"
    ]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_job_stopped_while_it_builds_its_data_is_one_line_and_leaves_no_run_dir(
    signum: int, tmp_path: Path, memprism_tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A first run builds its games for minutes before Ray starts (benchmark.prepare): Ctrl-C
    there ended in a traceback and left the fresh run directory, which the same command then
    refused ("already exists"); SIGTERM killed it without a word."""
    from memprism_ray.benchmark.alfworld.benchmark import Alfworld

    def building(self: object, cfg: object, log: object) -> None:
        os.kill(os.getpid(), signum)
        time.sleep(30)
        pytest.fail(f"{signal.Signals(signum).name} did not stop the start")

    monkeypatch.setattr(Alfworld, "prepare", building)
    before_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        assert fit_module.fit(_cfg(tmp_path, memprism_tiny_corpus), get_benchmark("alfworld"), []) == 128 + signum
    finally:
        signal.signal(signal.SIGINT, before_int)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"[grpo] error: stopped by {signal.Signals(signum).name} while the job was starting, before any of its "
        "results were written (data it had built so far is kept and reused)"
    ]
    assert not (tmp_path / "r").exists()


@pytest.mark.ray
def test_sigterm_inside_ray_get_is_named_sigterm(ray_session) -> None:
    """Ray's signal check inside ``ray.get`` turns the handler's exception into a plain
    KeyboardInterrupt: a job stopped by SIGTERM during D1 said "stopped by SIGINT", exit 130."""

    @ray_session.remote(num_cpus=0)
    def wait() -> None:
        time.sleep(60)

    task = wait.remote()
    errors: list[str] = []

    def work() -> int:
        # From another thread a second later: the signal must land while ray.get waits.
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return ray_session.get(task, timeout=60)

    try:
        assert fit_module.explained(work, errors.append, lambda: "kept") == 128 + signal.SIGTERM
    finally:
        ray_session.cancel(task, force=True)
    assert errors == ["stopped by SIGTERM; kept"]
