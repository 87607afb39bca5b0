"""The ``make run`` head with Ray token auth: the Job API refuses requests without the token,
accepts them with it, and a submitted driver joins the cluster (it inherits the token)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import stat
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_head_with_token_auth(tmp_path: Path) -> None:
    from memprism_ray.actors.local_head import auth_headers, new_auth_token, start_head, submit_and_wait

    token = new_auth_token()
    assert len(token) == 64 and token != new_auth_token()
    ray_tmp = Path(tempfile.mkdtemp(prefix="mpa-"))  # Ray's socket paths must stay short
    head = start_head(ray_tmp, num_cpus=1, dashboard_port=0, metrics_port=0, auth_token=token)
    try:
        assert head.token_path is not None and head.token_path.read_text() == token
        assert stat.S_IMODE(head.token_path.stat().st_mode) == 0o600
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{head.address}/api/jobs/", timeout=10)
        assert refused.value.code == 401
        req = urllib.request.Request(f"{head.address}/api/jobs/", headers=auth_headers(token))
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        work = tmp_path / "wd"
        work.mkdir()
        (work / "probe.py").write_text("import ray\nray.init()\nprint('CPUS', ray.cluster_resources()['CPU'])\n")
        status, logs = submit_and_wait(
            head.address, "python probe.py", work, timeout_s=300, echo=False, auth_token=token
        )
    finally:
        head.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert status == "SUCCEEDED", logs[-2000:]
    assert "CPUS 1.0" in logs
    # ray start shut its processes down itself on SIGTERM; it was not killed after a timeout.
    assert head.process.returncode is not None and head.process.returncode != -signal.SIGKILL


class _AgentlessClient:
    """A Job API whose head never gets a job agent (what a loaded machine showed)."""

    calls = 0

    def __init__(self, address: str, headers: dict | None = None) -> None:
        pass

    def submit_job(self, **kwargs) -> str:
        type(self).calls += 1
        raise RuntimeError("Request failed with status code 500: No available agent to submit job, try again later")


def test_submission_waits_for_the_job_agent_then_fails_clearly(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import ray.job_submission

    from memprism_ray.actors import local_head

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _AgentlessClient)
    monkeypatch.setattr(local_head.time, "sleep", lambda s: None)
    clock = iter(range(0, 10_000, 7))
    monkeypatch.setattr(local_head.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(RuntimeError, match=r"no job agent after \d+ s \(agent_wait_s=100\)"):
        local_head.submit_and_wait("http://127.0.0.1:1", "python x.py", Path("."), agent_wait_s=100.0)
    assert _AgentlessClient.calls >= 5  # it retried rather than failing at once
    assert "waiting for the head's job agent" in capsys.readouterr().out


class _OversizeClient:
    """A Job API refusing the working_dir upload as too large."""

    def __init__(self, address: str, headers: dict | None = None) -> None:
        pass

    def submit_job(self, **kwargs) -> str:
        raise RuntimeError("Request failed with status code 413: Maximum request body size 104857600 exceeded.")


def test_an_oversized_working_dir_fails_at_once_and_says_what_to_move(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray.job_submission

    from memprism_ray.actors import local_head

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _OversizeClient)
    with pytest.raises(RuntimeError, match=r"(?s)413.*working_dir.*\.gitignore or a \.rayignore"):
        local_head.submit_and_wait("http://127.0.0.1:1", "python x.py", Path("/some/checkout"), agent_wait_s=100.0)


def _live_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are not zombies (read from /proc)."""
    live = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process exited while we read
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat_file.parent.name))
    return live


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc")
def test_stop_sweeps_the_children_of_a_crashed_head() -> None:
    import os
    import time

    from memprism_ray.actors.local_head import start_head

    ray_tmp = Path(tempfile.mkdtemp(prefix="mpa-"))
    head = start_head(ray_tmp, num_cpus=1, dashboard_port=0, metrics_port=0)
    pgid = head.process.pid
    try:
        os.kill(pgid, signal.SIGKILL)  # ray start dies; the GCS and raylet it started live on
        head.process.wait(timeout=10)
        assert _live_members(pgid), "expected Ray's processes to outlive a killed ray start"
        head.stop()
        deadline = time.monotonic() + 10
        while _live_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _live_members(pgid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
