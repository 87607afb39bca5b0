"""``jobs/grpo_alfworld.py`` as users run it (``python jobs/...``, its own local Ray):
checkpoints, logs, and resuming a killed driver to the same state (no metrics step twice; a
changed config refused unless allowed)."""

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


def _cmd(tiny_overrides, corpus: Path, out: Path, name: str, ref: Path, *extra: str) -> list[str]:

    return [
        sys.executable,
        "jobs/grpo_alfworld.py",
        "--config",
        "configs/local.yaml",
        *tiny_overrides(corpus, out, name),
        "--init_checkpoint",
        str(ref),
        "--run.ray_address",
        "local",
        "--run.num_cpus",
        "2",
        *extra,
    ]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    return env


def _weights_sha(ckpt: Path) -> str:
    from memprism_ray.adapter.checkpoint import WEIGHTS_FILE

    return hashlib.sha256((ckpt / WEIGHTS_FILE).read_bytes()).hexdigest()


def test_killed_driver_resumes_to_the_same_state(
    memprism_tiny_corpus: Path, actors_reference_ckpt: Path, memprism_tiny_overrides, tmp_path: Path
) -> None:
    # A: two iterations without interruption.
    a = subprocess.run(
        _cmd(memprism_tiny_overrides, memprism_tiny_corpus, tmp_path, "a", actors_reference_ckpt),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-3000:]
    run_a = tmp_path / "a"
    assert (run_a / "checkpoints" / "iter_0001" / "config.json").exists()
    assert (run_a / "checkpoints" / "iter_0002" / "config.json").exists()
    lines = [json.loads(x) for x in (run_a / "metrics.jsonl").read_text().splitlines()]
    grpo = [x for x in lines if x["kind"] == "grpo"]
    assert [x["step"] for x in grpo] == [1, 2]
    for key in ("loss", "kl", "entropy", "clip_frac", "zero_std_group_frac", "success_rate", "failed_trajectories"):
        assert key in grpo[0]

    # B: the same run, its driver killed after the first checkpoint, then --resume auto.
    proc = subprocess.Popen(
        _cmd(memprism_tiny_overrides, memprism_tiny_corpus, tmp_path, "b", actors_reference_ckpt),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    first = tmp_path / "b" / "checkpoints" / "iter_0001" / "config.json"
    deadline = time.monotonic() + 600
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.exists(), "the first checkpoint never appeared"
    assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # The kill landed mid-run: the second (last) iteration had not been checkpointed.
    assert not (tmp_path / "b" / "checkpoints" / "iter_0002" / "config.json").exists(), "the run had finished"

    # A fresh start into a run directory with checkpoints is refused (nothing overwritten).
    refused = subprocess.run(
        _cmd(memprism_tiny_overrides, memprism_tiny_corpus, tmp_path, "b", actors_reference_ckpt),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode != 0 and "--resume auto" in (refused.stdout + refused.stderr)
    assert "Traceback" not in refused.stderr and refused.stderr.strip().count("\n") == 0, refused.stderr

    # Resuming with a different config is refused (before any Ray starts), naming the setting.
    new_lr = ("--resume", "auto", "--grpo.lr", "1e-5")
    changed = subprocess.run(
        _cmd(memprism_tiny_overrides, memprism_tiny_corpus, tmp_path, "b", actors_reference_ckpt, *new_lr),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert changed.returncode != 0 and "grpo.lr" in changed.stderr, changed.stderr[-2000:]
    assert "--run.allow_config_change true" in changed.stderr and "Traceback" not in changed.stderr

    b = subprocess.run(
        _cmd(memprism_tiny_overrides, memprism_tiny_corpus, tmp_path, "b", actors_reference_ckpt, "--resume", "auto"),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    assert "resumed from" in b.stdout
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if x["kind"] == "grpo"] == [1, 2], "a step logged twice or lost"
    assert [x["step"] for x in rows if x["kind"] == "checkpoint"] == [1, 2]
    meta = json.loads((tmp_path / "b" / "checkpoints" / "iter_0002" / "config.json").read_text())
    assert len(meta["extra"]["config_sha256"]) == 64 and meta["extra"]["config"]["grpo.lr"] > 0
    for it in ("iter_0001", "iter_0002"):
        assert _weights_sha(tmp_path / "a" / "checkpoints" / it) == _weights_sha(tmp_path / "b" / "checkpoints" / it)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--resume", "/nonexistent/ckpt"), "no such checkpoint directory"),
        (("--init_checkpoint", "/nonexistent/ckpt"), "init_checkpoint /nonexistent/ckpt"),
        (("--run.name", "../../x"), "run.name '../../x'"),
    ],
)
def test_bad_start_is_one_line_before_ray(tmp_path: Path, extra: tuple[str, ...], message: str) -> None:
    cmd = [sys.executable, "jobs/grpo_alfworld.py", "--config", "configs/local.yaml", "--run.out_dir", str(tmp_path)]
    r = subprocess.run([*cmd, *extra], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert message in r.stderr and "Traceback" not in r.stderr
    assert "cluster" not in r.stdout  # refused before a Ray instance started
    assert not any(tmp_path.iterdir())  # nothing created
