"""The ``make run`` head's helpers: submission waits for the head's job agent and fails
clearly, an oversized working dir says what to move, and stopping a crashed head sweeps its
children. The head with Ray token auth (401 without the token, a submitted driver joining
the cluster) is checked by tests/e2e/test_job_submit.py, which submits the GRPO job to it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


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

    from memprism_ray.cluster import head as local_head

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

    from memprism_ray.cluster import head as local_head

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _OversizeClient)
    with pytest.raises(RuntimeError, match=r"(?s)413.*working_dir.*\.gitignore or a \.rayignore"):
        local_head.submit_and_wait("http://127.0.0.1:1", "python x.py", Path("/some/checkout"), agent_wait_s=100.0)


class _InterruptedClient:
    """A Job API whose job runs until Ctrl-C lands in the wait (``ended``: it had finished)."""

    ended = False
    stopped: ClassVar[list[str]] = []

    def __init__(self, address: str, headers: dict | None = None) -> None:
        self.polls = 0

    def submit_job(self, **kwargs) -> str:
        return "job-1"

    def get_job_logs(self, job_id: str) -> str:
        return ""

    def get_job_status(self, job_id: str) -> Any:
        from ray.job_submission import JobStatus

        self.polls += 1
        if self.polls == 1:
            raise KeyboardInterrupt  # the user's Ctrl-C, while the client waits on the head
        return JobStatus.STOPPED if self.stopped else JobStatus.SUCCEEDED

    def stop_job(self, job_id: str) -> bool:
        if self.ended:
            return False
        type(self).stopped.append(job_id)
        return True


@pytest.mark.parametrize("ended", [False, True], ids=["running", "ended"])
def test_ctrl_c_in_the_wait_stops_the_job_it_submitted(monkeypatch: pytest.MonkeyPatch, ended: bool) -> None:
    # `make run` interrupted: the job is stopped (with --keep-head it went on running), unless it
    # had ended just before, when its own status is the answer.
    import ray.job_submission

    from memprism_ray.cluster import head as local_head

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _InterruptedClient)
    monkeypatch.setattr(_InterruptedClient, "ended", ended)
    monkeypatch.setattr(_InterruptedClient, "stopped", [])
    if ended:
        assert local_head.submit_and_wait("http://127.0.0.1:1", "python x.py", Path("."), echo=False)[0] == "SUCCEEDED"
    else:
        with pytest.raises(KeyboardInterrupt):
            local_head.submit_and_wait("http://127.0.0.1:1", "python x.py", Path("."), echo=False)
    assert _InterruptedClient.stopped == ([] if ended else ["job-1"])


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


def _wait_for_members(pgid: int, count: int) -> None:
    """Until ``sh`` has forked its ``sleep`` (at most 10 s: a loaded CI machine is slow to)."""
    deadline = time.monotonic() + 10
    while len(_live_members(pgid)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_live_members(pgid)) == count


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc")
def test_stop_sweeps_the_children_of_a_crashed_head() -> None:
    import os

    from memprism_ray.cluster.head import start_head

    ray_tmp = Path(tempfile.mkdtemp(prefix="mpa-"))
    head = start_head(ray_tmp, num_cpus=1, dashboard_port=0, metrics_port=0)
    pgid = head.process.pid
    try:
        # Ray's reaper SIGTERMs the group when ray start dies, within about a second (a race
        # with the check below): it goes first, as when the whole parent side is lost.
        for pid in _live_members(pgid):
            if b"ray_process_reaper" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        os.kill(pgid, signal.SIGKILL)  # ray start dies; the GCS and raylet it started live on
        head.process.wait(timeout=10)  # reaped by the caller: its pid may be anyone's now
        assert _live_members(pgid), "expected Ray's processes to outlive a killed ray start"
        head.stop()
        assert _live_members(pgid) == []  # stop returns only once the group is gone (its marked processes)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc")
def test_stop_group_terms_the_leader_then_sweeps_its_group() -> None:
    """What LocalHead.stop and LocalNode.stop share: the leader gets SIGTERM and ``timeout_s``;
    a child that outlives it, or a leader that ignores SIGTERM, is SIGKILLed with the group."""
    import subprocess

    from memprism_ray.cluster.head import stop_group

    # The leader exits on SIGTERM; its background child (like Ray's GCS) lives on.
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & wait"], start_new_session=True)
    try:
        _wait_for_members(leader.pid, 2)
        _wait_for_members(stubborn.pid, 2)
        stop_group(leader, 10.0)
        assert leader.returncode == -signal.SIGTERM and _live_members(leader.pid) == []
        t0 = time.monotonic()
        stop_group(stubborn, 1.0)
        assert stubborn.returncode == -signal.SIGKILL and _live_members(stubborn.pid) == []
        assert time.monotonic() - t0 < 10
    finally:
        for proc in (leader, stubborn):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc")
def test_kill_group_returns_only_once_every_member_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL reaches a group's members asynchronously (CI saw a killed child still running
    the moment ``killpg`` returned). Here the leader dies at once and its child 0.5 s later:
    :func:`kill_group` must not return in between."""
    import subprocess
    import threading

    from memprism_ray.cluster import head as local_head

    real_killpg = os.killpg
    timers: list[threading.Timer] = []

    def late_killpg(pgid: int, sig: int) -> None:
        os.kill(pgid, sig)  # the leader now, the rest of the group later
        timer = threading.Timer(0.5, real_killpg, (pgid, sig))
        timers.append(timer)
        timer.start()

    leader = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    try:
        _wait_for_members(leader.pid, 2)
        monkeypatch.setattr(local_head.os, "killpg", late_killpg)
        local_head.kill_group(leader, 10.0)
        assert leader.returncode == -signal.SIGKILL and _live_members(leader.pid) == []
    finally:
        for timer in timers:
            timer.join()
        with contextlib.suppress(ProcessLookupError):
            real_killpg(leader.pid, signal.SIGKILL)


def test_free_ports_are_distinct_and_keep_a_free_preferred_port() -> None:
    """CI saw Ray refuse to start: two ports asked one at a time came back equal (50031 for the
    runtime-env agent and the metrics export). Chosen together, they never are."""
    import socket

    from memprism_ray.cluster.head import free_ports

    ports = free_ports(*[None] * 64)
    assert len(set(ports)) == 64 and all(p > 0 for p in ports)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        free = free_ports(None)[0]
        got = free_ports(free, busy, None)
    assert got[0] == free  # a free preferred port is kept
    assert got[1] != busy and len(set(got)) == 3  # a taken one is replaced by another free port


def _rpc_error(name: str) -> Exception:
    """A gRPC error as a stub raises it (``code()``): ``DEADLINE_EXCEEDED`` or ``UNAVAILABLE``."""
    import grpc

    class Error(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode[name]

    return Error()


def _gcs(nodes: Callable[[], list[Any]] | None, unregister: Callable[[], None]) -> Any:
    """A :class:`~memprism_ray.cluster.head.Gcs` over a fake stub (no cluster): ``nodes`` gives
    the node list each time it is asked (None: the GCS does not answer)."""
    from memprism_ray.cluster.head import Gcs

    class Stub:
        def GetAllNodeInfo(self, request: Any, metadata: Any, timeout: float) -> Any:
            if nodes is None:
                raise _rpc_error("UNAVAILABLE")
            return SimpleNamespace(node_info_list=nodes())

        def UnregisterNode(self, request: Any, metadata: Any, timeout: float) -> None:
            unregister()

    gcs = Gcs.__new__(Gcs)
    gcs._stub, gcs._metadata = Stub(), []
    return gcs


def _info(node_id: str, state: str) -> Any:
    from ray.core.generated import gcs_pb2

    return gcs_pb2.GcsNodeInfo(node_id=bytes.fromhex(node_id), state=gcs_pb2.GcsNodeInfo.GcsNodeState.Value(state))


def test_only_a_node_the_gcs_may_have_alive_is_taken_off() -> None:
    """CI: a worker node that died at start had unregistered itself when its raylet exited; the
    GCS (Ray 2.60) never answers UnregisterNode for a node it has dead already, and the start
    waited out the call's 10 s and said the node "counts as alive", which it did not."""
    a, b, c = "aa" * 28, "bb" * 28, "cc" * 28
    listed = _gcs(lambda: [_info(a, "ALIVE"), _info(b, "DEAD")], lambda: None)
    assert listed.may_be_alive(a) and not listed.may_be_alive(b) and not listed.may_be_alive(c)
    assert _gcs(None, lambda: None).may_be_alive(a)  # a GCS that does not answer: it may

    def times_out() -> None:
        raise _rpc_error("DEADLINE_EXCEEDED")

    # Gone dead while the call waited (its raylet, or its health checks, took it off): done.
    states = iter([[_info(a, "ALIVE")], [_info(a, "DEAD")]])
    raced = _gcs(lambda: next(states), times_out)
    assert raced.may_be_alive(a) and raced.unregister(a, "test") == ""
    # Still alive after the call ran out: said, not hidden.
    stuck = _gcs(lambda: [_info(a, "ALIVE")], times_out)
    assert "the GCS did not take it off (DEADLINE_EXCEEDED)" in stuck.unregister(a, "test")
