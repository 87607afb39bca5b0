"""``jobs/grpo_alfworld.py`` as users run it (``python jobs/...``, its own local Ray):
checkpoints, logs, and resuming a killed driver to the same state (no metrics step twice; a
changed config refused unless allowed).

The resume check runs the smallest job that writes two checkpoints (two iterations of one
group of two trajectories). The run that is killed is a process of its own, started as users
start it; the uninterrupted reference (played once for the module: the resume and the run
whose Learners are killed both reach it) and the resume run ``main(argv)`` in this process on the
session's Ray (a job's start-up, not its iterations, is most of its time). Refusals that come
before Ray are checked in-process too, one of them also as a process (exit status 2, one line
on stderr)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: Two iterations of one group of two trajectories: two checkpoints, a planner that moves
#: (entropy bonus and KL, even when every trajectory of the group fails).
SMALLEST = ("--grpo.groups_per_iteration", "1", "--grpo.group_size", "2", "--rollout.env_slots_per_worker", "2")


def _args(tiny_overrides, corpus: Path, out: Path, name: str, ref: Path, *extra: str) -> list[str]:
    return [
        "--config",
        "configs/local.yaml",
        *tiny_overrides(corpus, out, name),
        *SMALLEST,
        "--init_checkpoint",
        str(ref),
        "--run.ray_address",
        "local",
        "--run.num_cpus",
        "2",
        *extra,
    ]


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "jobs/grpo_alfworld.py", *args]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    return env


def _weights_sha(ckpt: Path) -> str:
    from memprism_ray.adapter.checkpoint import WEIGHTS_FILE

    return hashlib.sha256((ckpt / WEIGHTS_FILE).read_bytes()).hexdigest()


def _grpo_rows(run: Path) -> list[dict]:
    """The GRPO metrics rows without wall-clock fields (timings differ between two runs)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and "seconds" not in k} for r in rows if r["kind"] == "grpo"]


@pytest.fixture
def args(memprism_tiny_overrides, memprism_tiny_corpus: Path, actors_reference_ckpt: Path, tmp_path: Path):
    """The job's arguments for a run named ``name`` under this test's directory."""
    return lambda name, *extra: _args(
        memprism_tiny_overrides, memprism_tiny_corpus, tmp_path, name, actors_reference_ckpt, *extra
    )


@pytest.fixture(scope="module")
def undisturbed(
    ray_session, memprism_tiny_corpus: Path, actors_reference_ckpt: Path, memprism_tiny_overrides, run_job,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:  # fmt: skip
    """A: the two iterations without interruption, the run the killed driver's resume and the
    lost Learners' run must reach (in this process, on the session's Ray; played once for both)."""
    out = tmp_path_factory.mktemp("undisturbed")
    argv = _args(memprism_tiny_overrides, memprism_tiny_corpus, out, "a", actors_reference_ckpt)
    assert run_job("grpo_alfworld.py", argv) == 0
    run_a = out / "a"
    assert (run_a / "checkpoints" / "iter_0001" / "config.json").exists()
    assert (run_a / "checkpoints" / "iter_0002" / "config.json").exists()
    grpo_a = _grpo_rows(run_a)
    assert [x["step"] for x in grpo_a] == [1, 2]
    for key in ("loss", "kl", "entropy", "clip_frac", "zero_std_group_frac", "success_rate", "failed_trajectories"):
        assert key in grpo_a[0]
    assert _weights_sha(run_a / "checkpoints" / "iter_0001") != _weights_sha(run_a / "checkpoints" / "iter_0002")
    return run_a


@pytest.mark.ray
def test_killed_driver_resumes_to_the_same_state(
    undisturbed: Path,
    args,
    tmp_path: Path,
    run_job,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_a, grpo_a = undisturbed, _grpo_rows(undisturbed)

    # B: the same run as users start it, its driver killed after the first checkpoint.
    proc = subprocess.Popen(
        _cmd(*args("b")),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    first = tmp_path / "b" / "checkpoints" / "iter_0001" / "config.json"  # written last: the checkpoint is whole
    deadline = time.monotonic() + 600
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.exists(), "the first checkpoint never appeared"
    assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # The kill landed mid-run: the second (last) iteration had not been checkpointed.
    assert not (tmp_path / "b" / "checkpoints" / "iter_0002" / "config.json").exists(), "the run had finished"

    # A fresh start into a run directory with checkpoints is refused (nothing overwritten), in one line.
    refused = subprocess.run(_cmd(*args("b")), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--resume auto" in (refused.stdout + refused.stderr)
    assert "Traceback" not in refused.stderr and refused.stderr.strip().count("\n") == 0, refused.stderr

    # Resuming with a different config is refused before any Ray starts, naming the setting.
    import memprism_ray.cluster.placement as placement

    with monkeypatch.context() as m:
        m.setattr(placement, "init_ray", lambda *a, **k: pytest.fail("init_ray reached before the refusal"))
        assert run_job("grpo_alfworld.py", args("b", "--resume", "auto", "--grpo.lr", "1e-5")) == 2
    err = capsys.readouterr().err
    assert "grpo.lr" in err and "--run.allow_config_change true" in err, err[-2000:]

    # --resume auto continues to exactly the uninterrupted run's state (in this process: nothing
    # of run B is left in memory here, its Ray died with it).
    assert run_job("grpo_alfworld.py", args("b", "--resume", "auto")) == 0
    assert "resumed from" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if x["kind"] == "grpo"] == [1, 2], "a step logged twice or lost"
    assert [x["step"] for x in rows if x["kind"] == "checkpoint"] == [1, 2]
    meta = json.loads((tmp_path / "b" / "checkpoints" / "iter_0002" / "config.json").read_text())
    assert len(meta["extra"]["config_sha256"]) == 64 and meta["extra"]["config"]["grpo.lr"] > 0
    for it in ("iter_0001", "iter_0002"):
        assert _weights_sha(run_a / "checkpoints" / it) == _weights_sha(tmp_path / "b" / "checkpoints" / it)
    assert _grpo_rows(tmp_path / "b") == grpo_a  # every logged statistic, bit for bit


@pytest.mark.ray
def test_lost_learners_are_started_again_and_reach_the_undisturbed_weights(
    undisturbed: Path, args, tmp_path: Path, run_job, capsys: pytest.CaptureFixture[str]
) -> None:
    run_a, grpo_a = undisturbed, _grpo_rows(undisturbed)

    # C: the same run in this process, its Learner killed as soon as it exists (while the fleet
    # starts: the rollout workers used to load their first weights from it) and the next one once
    # the first iteration is logged. Each is started again by itself, the second from the last
    # checkpoint, and the run ends on run A's weights.
    import threading

    import ray

    def kill_learners() -> None:
        metrics = tmp_path / "c" / "metrics.jsonl"
        deadline = time.monotonic() + 600
        when = {"c-learner": lambda: True, "c-learner.1": lambda: metrics.exists() and "grpo" in metrics.read_text()}
        for name, ready in when.items():
            while time.monotonic() < deadline:
                try:
                    if ready():
                        ray.kill(ray.get_actor(name))
                        break
                except ValueError:  # no such actor yet
                    pass
                time.sleep(0.05)

    killer = threading.Thread(target=kill_learners, daemon=True)
    killer.start()
    assert run_job("grpo_alfworld.py", args("c")) == 0
    killer.join(timeout=5)
    out = capsys.readouterr().out
    restarts = [line for line in out.splitlines() if "the Learner was lost" in line]
    assert len(restarts) == 2, out[-3000:]
    assert "while it started" in restarts[0] and "restart 2 of 3 from " in restarts[1], restarts
    for it in ("iter_0001", "iter_0002"):
        assert _weights_sha(run_a / "checkpoints" / it) == _weights_sha(tmp_path / "c" / "checkpoints" / it)
    rows_c = [json.loads(x) for x in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()]
    grpo_c = [r for r in rows_c if r["kind"] == "grpo"]
    assert [r["step"] for r in grpo_c] == [1, 2]  # a replayed iteration is logged once
    restarted = [r for r in rows_c if r["kind"] == "learner_restart"]
    assert len(restarted) == 1 and restarted[0]["replayed"] <= 1  # at most run.checkpoint_every
    # In the row of the iteration played again (none when the loss came after the last row).
    assert sum(r["learner_restarts"] for r in grpo_c) <= 1
    same = ("success_rate", "loss", "kl", "trajectories")
    assert [{k: r[k] for k in same} for r in grpo_c] == [{k: r[k] for k in same} for r in grpo_a]
    events = json.loads((tmp_path / "c" / "cluster.json").read_text())["events"]
    assert [e["event"] for e in events].count("learner_restarted") == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--resume", "/nonexistent/ckpt"), "no such checkpoint directory"),
        (("--init_checkpoint", "/nonexistent/ckpt"), "init_checkpoint /nonexistent/ckpt"),
        (("--run.name", "../../x"), "run.name '../../x'"),
        (("--corpus.cache_dir", "/dev/null/x"), "error: /dev/null/x: Not a directory"),  # was a traceback
    ],
)
def test_bad_start_is_one_line_before_ray(
    tmp_path: Path,
    extra: tuple[str, ...],
    message: str,
    run_job,
    no_ray_start: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--config", "configs/local.yaml", "--run.out_dir", str(tmp_path), *extra]
    assert run_job("grpo_alfworld.py", argv) == 2
    out, err = capsys.readouterr()
    assert message in err and "Traceback" not in err
    assert "cluster" not in out  # refused before a Ray instance started
    assert not any(tmp_path.iterdir())  # nothing created


@pytest.fixture
def in_rays_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory a job has under ``ray job submit --working-dir .``: Ray's copy."""
    copy = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    return copy


@pytest.mark.parametrize(
    ("script", "extra", "setting"),
    [
        ("grpo_alfworld.py", (), "run.out_dir 'runs'"),
        ("sft_alfworld.py", (), "run.out_dir 'runs'"),
        ("eval_alfworld.py", ("--out", "ev"), "the output directory 'ev'"),
    ],
)
def test_a_run_in_rays_copy_of_the_working_dir_is_refused_before_anything_is_written(
    in_rays_copy: Path, script: str, extra: tuple[str, ...], setting: str, run_job, no_ray_start: None, capsys
) -> None:
    """``ray job submit --working-dir . -- python jobs/X.py --config configs/local.yaml`` (the
    README's command): the relative ``runs`` landed in Ray's copy of the working dir."""
    copy = in_rays_copy
    assert run_job(script, ["--config", str(ROOT / "configs" / "local.yaml"), *extra]) == 2
    err = capsys.readouterr().err
    assert f"error: {setting} is inside Ray's temporary copy of this job's working_dir ({copy})" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not any(copy.iterdir())  # nothing created


@pytest.mark.parametrize(
    "script, option, setting",
    [
        ("grpo_alfworld.py", "--init_checkpoint", "init_checkpoint"),
        ("eval_alfworld.py", "--checkpoint", "--checkpoint"),
        ("grpo_alfworld.py", "--resume", "--resume"),
    ],
)
def test_a_relative_checkpoint_missing_from_rays_copy_says_why(
    tmp_path: Path, in_rays_copy: Path, script: str, option: str, setting: str, run_job, no_ray_start: None, capsys
) -> None:
    """``ray job submit --working-dir . -- python jobs/X.py ... --init_checkpoint runs/...``: the
    copy Ray runs the job in holds no ``runs/`` (not uploaded); the error says so, not only that
    the directory is missing. A relative path the copy does hold is taken."""
    copy = in_rays_copy
    argv = ["--config", str(ROOT / "configs" / "local.yaml"), "--run.out_dir", str(tmp_path / "runs")]
    assert run_job(script, [*argv, option, "runs/a/checkpoints/iter_0002"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(
        f": error: {setting} 'runs/a/checkpoints/iter_0002': no such path in Ray's temporary copy of "
        f"this job's working_dir ({copy}), which holds only the files ray job submit uploaded: give its path "
        "on the node the job runs on, e.g. '~/runs/...'"
    )
    (copy / "ckpt").mkdir()  # uploaded with the working dir: past this check, to the checkpoint's own
    assert run_job(script, [*argv, option, "ckpt"]) != 0
    err = capsys.readouterr().err
    assert "Ray's temporary copy" not in err and "ckpt" in err, err


@pytest.mark.ray
def test_a_job_in_which_every_trajectory_fails_ends_in_one_line_with_the_cause(
    ray_session,
    memprism_tiny_corpus: Path,
    actors_reference_ckpt: Path,
    memprism_tiny_overrides,
    tmp_path: Path,
    run_job_captured,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 34 item 2: the task model's endpoint is down, so every decision of every
    trajectory fails. The [grpo] lines name the first cause and its node; the job ends in one
    line with that cause, exit status 1, no traceback (it used to end in a 12-line traceback
    that never said why). The endpoint went away after the start: the job's probe found it."""
    import memprism_ray.llm_client

    monkeypatch.setattr(memprism_ray.llm_client, "probe", lambda *args, **kwargs: None)
    argv = [
        "--config", "configs/local.yaml", *memprism_tiny_overrides(memprism_tiny_corpus, tmp_path, "down"),
        "--init_checkpoint", str(actors_reference_ckpt), "--grpo.iterations", "1",
        "--policy.backend", "openai", "--policy.openai.base_url", "http://127.0.0.1:9/v1",
        "--policy.openai.max_retries", "0", "--policy.openai.model", "none",
    ]  # fmt: skip
    status, out, err = run_job_captured("grpo_alfworld.py", argv)
    assert status == 1, out[-2000:] + err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out + err
    assert lines[0].startswith("[grpo] error: iteration 1: no group produced a decision (")
    assert "first cause: policy: " in lines[0] and "127.0.0.1:9" in lines[0] and "[node " in lines[0]
    assert "trajectories failed (first: policy: " in out  # the [grpo] line of each failed group says it too


def test_an_endpoint_that_does_not_answer_is_refused_before_any_work(
    tiny_argv, tmp_path: Path, run_job, no_ray_start, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task policy, LLM Phi, LLM view teacher or memory baseline whose server is not running was
    met only when the first episode or D1 label asked it (30 s into the embedded default, after
    D1's reference tasks; minutes on a corpus; the memory baselines' after training). Each is asked
    once, before Ray starts; one on this machine's loopback is not asked for a job that joins a
    cluster (the actors call their own node's)."""
    from memprism_ray.cluster.head import free_ports
    from memprism_ray.config import load_config
    from memprism_ray.trainer.fit import check_endpoints

    (port,) = free_ports(None)  # nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    base = tiny_argv("probe")
    cases = {
        "policy.openai": ["--policy.backend", "openai", "--policy.openai.base_url", url],
        "phi": ["--phi.kind", "llm", "--phi.model", "m", "--phi.base_url", url],
        "label.llm": ["--label.teacher", "llm", "--label.llm.base_url", url],
        "eval.memory": ["--eval.enabled", "true", "--eval.conditions", "memprism,mem0", "--eval.memory.base_url", url],
    }
    for key, extra in cases.items():
        assert run_job("grpo_alfworld.py", [*base, *extra]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"[grpo] error: {key}.base_url {url}: no server answers (transport error ConnectError: [Errno 111] "
            "Connection refused) (asked before any work)"
        ]
        assert not (tmp_path / "probe").exists()  # the run directory the refused job made is gone
    resumed = tmp_path / "stopped"  # a run stopped before D1 labelled: its resume labels
    resumed.mkdir()
    (resumed / "config.yaml").write_text("{}\n")
    assert run_job("grpo_alfworld.py", [*tiny_argv("stopped"), *cases["label.llm"], "--resume", "auto"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"[grpo] error: label.llm.base_url {url}: ")
    assert (resumed / "config.yaml").is_file()  # a resumed run's directory is kept
    evaluation = ["--out", str(tmp_path / "e"), "--eval.conditions", "no_memory"]
    for script, prefix, extra in (("eval_alfworld.py", "[eval]", evaluation), ("label_views.py", "[d1]", [])):
        assert run_job(script, [*base, *cases["policy.openai"], *extra]) == 2  # every job asks
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"{prefix} error: policy.openai.base_url {url}: no server answers"), err
    cfg = load_config("configs/local.yaml", cases["policy.openai"])
    with monkeypatch.context() as m:
        m.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # joins a cluster: the driver's loopback is not the actors'
        check_endpoints(cfg)
    with pytest.raises(ValueError, match="no server answers"):
        check_endpoints(cfg)
    check_endpoints(load_config("configs/local.yaml", cases["label.llm"]))  # a job without D1 does not ask it
    check_endpoints(load_config("configs/local.yaml", cases["eval.memory"]))  # nor one without an evaluation


def test_a_memory_baseline_that_cannot_run_here_is_refused_before_training(
    tiny_argv, run_job, no_ray_start, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--eval.conditions memprism,mem0`` without the baselines extra trained to the end, then
    every mem0 episode of the final evaluation crashed (the evaluation jobs already refused it)."""
    import sys

    import memprism_ray.llm_client

    monkeypatch.setitem(sys.modules, "mem0", None)  # its import fails, as where the extra is not installed
    monkeypatch.setattr(memprism_ray.llm_client, "probe", lambda *args, **kwargs: None)  # its endpoint answers
    argv = tiny_argv("mem", "--eval.enabled", "true", "--eval.conditions", "memprism,mem0",
                     "--eval.memory.base_url", "http://127.0.0.1:9/v1")  # fmt: skip
    assert run_job("grpo_alfworld.py", argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[grpo] error: condition 'mem0' needs mem0ai=="), err
    assert "not installed): pip install 'memprism-ray[baselines]'" in err[0]
