"""Issue 40 item 6, without Ray: the ports a node is given lie outside the kernel's ephemeral
range and are free on every address of the machine; one node start at a time per machine;
``kill_group`` signals only processes it verified as its own (a second call, a reused pid),
and sweeps the groups of their own that a node's workers take within its session; why a node
exited at start, read from Ray's logs."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from memprism_ray.cluster import head as local_head

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_EPHEMERAL = tuple(int(x) for x in _RANGE_FILE.read_text().split()) if _RANGE_FILE.exists() else (32768, 65535)


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, pgid)`` of a process, read from /proc; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[2])


def test_free_ports_lie_outside_the_ephemeral_range_and_replace_a_preferred_one_inside_it() -> None:
    """An outgoing connection takes its local port from the ephemeral range: a port chosen
    there and released can be taken before Ray binds it (CI: a worker node's runtime_env_agent,
    "Address already in use")."""
    low, high = _EPHEMERAL
    ports = local_head.free_ports(*[None] * 64)
    assert len(set(ports)) == 64
    assert all(20000 <= p <= 65535 and not low <= p <= high for p in ports)  # above Ray's worker ports
    inside = (low + high) // 2
    got = local_head.free_ports(inside, None)
    assert got[0] != inside and not low <= got[0] <= high and len(set(got)) == 2


def test_the_ephemeral_range_falls_back_where_it_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "range").write_text("40000\t50000\n")
    assert local_head.ephemeral_range(tmp_path / "range") == (40000, 50000)
    assert local_head.ephemeral_range(tmp_path / "missing") == local_head.FALLBACK_EPHEMERAL
    (tmp_path / "bad").write_text("not a range")
    assert local_head.ephemeral_range(tmp_path / "bad") == local_head.FALLBACK_EPHEMERAL


def test_no_room_outside_the_ephemeral_range_is_one_line_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_head, "ephemeral_range", lambda: (1024, 65535))
    with pytest.raises(RuntimeError, match=r"ephemeral range 1024-65535 \(net.ipv4.ip_local_port_range\): narrow it"):
        local_head.free_ports(None)


def _interface_address() -> str:
    """This machine's address on its default route (no packet is sent), or skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))
        except OSError:
            pytest.skip("no IPv4 route off this machine")
        address = s.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("no interface address but loopback")
    return address


def test_a_preferred_port_held_on_any_address_is_replaced() -> None:
    """The check binds 0.0.0.0: a port held on 127.0.0.1, on the interface address (where a
    node not kept to loopback binds its agents) or as a connection's local port is refused.
    The old check bound 127.0.0.1 only and kept a port held on the interface address."""
    preferred = local_head.free_ports(None, None, None)
    with contextlib.ExitStack() as stack:
        on_iface = stack.enter_context(socket.socket())
        on_iface.bind((_interface_address(), preferred[0]))
        on_iface.listen()
        on_loopback = stack.enter_context(socket.socket())
        on_loopback.bind(("127.0.0.1", preferred[1]))
        got = local_head.free_ports(*preferred)
    assert got[0] != preferred[0] and got[1] != preferred[1]
    assert got[2] == preferred[2]  # a free preferred port outside the ephemeral range is kept
    assert len(set(got)) == 3


def _lock_holder(lock: Path, hold_s: float) -> subprocess.Popen:
    """A process holding ``lock`` as "worker node 7" with a bound of ``hold_s`` until a line on its stdin."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from memprism_ray.cluster.head import node_start_lock\n"
         f"with node_start_lock({hold_s}, 'worker node 7', __import__('pathlib').Path({str(lock)!r})):\n"
         "    print('held', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_one_node_start_at_a_time_per_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Another process holding the lock (a parallel test session starting a node) makes this one
    wait as long as the holder's own bound says, past the waiter's own (CI under a CPU hog: a
    fixed 120 s wait failed three modules' set-ups while another session's node start, within
    its bound, held it), saying so; a holder past its bound is named."""
    lock = tmp_path / "start.lock"
    holder = _lock_holder(lock, 30.0)
    try:
        assert holder.stdin is not None
        release = threading.Timer(1.0, lambda: (holder.stdin.write("\n"), holder.stdin.flush()))  # type: ignore[union-attr]
        release.start()
        t0 = time.monotonic()
        with local_head.node_start_lock(0.3, "worker node 8", lock, grace_s=0.2, say_every_s=0.2):
            waited = time.monotonic() - t0
    finally:
        holder.communicate(timeout=30)
    assert waited >= 0.9
    assert "for worker node 7 (pid" in capsys.readouterr().err

    hung = _lock_holder(lock, 0.5)
    try:
        with (
            pytest.raises(TimeoutError, match=rf"worker node 7 \(pid {hung.pid}\) has held .*past the bound it gave"),
            local_head.node_start_lock(0.3, "worker node 8", lock, grace_s=0.3),
        ):
            pass
    finally:
        hung.communicate("\n", timeout=30)
    with local_head.node_start_lock(1.0, path=lock):  # released with its holder
        pass


def _running(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _wait_for(check, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


#: A leader whose child takes a process group of its own within the session, as Ray's
#: raylet does for every worker it starts; the child prints its pid once it has.
LEADER_WITH_WORKER = (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgid(0, 0); "
    "print(os.getpid(), flush=True); time.sleep(300)'])\n"
    "time.sleep(300)\n"
)


def _leader_with_worker(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    log = tmp_path / "leader.log"
    proc = local_head.spawn([sys.executable, "-c", LEADER_WITH_WORKER], log, dict(os.environ))
    _wait_for(lambda: log.read_text().strip().isdigit(), "the worker started")
    return proc, int(log.read_text())


def _cleanup(proc: subprocess.Popen, worker: int) -> None:
    """What a failing test leaves: the leader's group and the worker in its own."""
    for kill, pid in ((os.killpg, proc.pid), (os.kill, worker)):
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)


@needs_proc
def test_kill_group_sweeps_a_worker_in_a_group_of_its_own(tmp_path: Path) -> None:
    """A node's workers (``ray::RolloutWorker``, ...) have process groups of their own in the
    node's session: a killed node's workers must die with it, not when they notice."""
    proc, worker = _leader_with_worker(tmp_path)
    try:
        assert _stat(worker)[1] == worker  # its own group, in the leader's session
        local_head.kill_group(proc, 10.0)
        assert not _running(worker) and proc.returncode == -signal.SIGKILL
    finally:
        _cleanup(proc, worker)


@needs_proc
def test_kill_group_twice_signals_nothing_the_second_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LocalCluster.shutdown`` after a node's kill: the group is gone and its leader reaped, so
    its pid may be anyone's by now. The old code sent ``killpg`` to it again."""
    proc = local_head.spawn(["sh", "-c", "sleep 300 & wait"], tmp_path / "g.log", dict(os.environ))
    local_head.kill_group(proc, 10.0)
    assert proc.returncode == -signal.SIGKILL
    sent: list[tuple[str, int]] = []
    monkeypatch.setattr(local_head.os, "killpg", lambda pgid, sig: sent.append(("killpg", pgid)))
    monkeypatch.setattr(local_head.os, "kill", lambda pid, sig: sent.append(("kill", pid)))
    record_pidfd = lambda fd, sig: sent.append(("pidfd", fd))  # noqa: E731
    monkeypatch.setattr(local_head.signal, "pidfd_send_signal", record_pidfd, raising=False)
    local_head.kill_group(proc, 1.0)
    local_head.stop_group(proc, 1.0)
    assert sent == []


@needs_proc
def test_kill_group_spares_a_group_that_took_a_reaped_leaders_pid(tmp_path: Path) -> None:
    """A leader reaped elsewhere (a caller's ``wait``) frees its pid; a process given that pid
    later leads a group that is not ours. Simulated by pointing the reaped ``Popen`` at another
    group's leader: the old code SIGKILLed that group."""
    dead = local_head.spawn(["true"], tmp_path / "dead.log", dict(os.environ))
    dead.wait(timeout=30)
    stranger = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    try:
        dead.pid = stranger.pid
        local_head.kill_group(dead, 1.0)
        assert stranger.poll() is None
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait(timeout=30)


@needs_proc
def test_kill_group_still_sweeps_its_own_processes_after_a_caller_reaped_the_leader(tmp_path: Path) -> None:
    """``ray start`` crashed and was reaped by a caller (``head.process.wait()``): its children,
    which carry spawn's mark, are still swept; nothing else is."""
    proc, worker = _leader_with_worker(tmp_path)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _running(worker)
        local_head.kill_group(proc, 10.0)
        assert not _running(worker)
    finally:
        _cleanup(proc, worker)


def test_the_start_cause_names_the_agent_and_its_error(tmp_path: Path) -> None:
    """The lines Ray 2.60 wrote when a worker node's runtime_env_agent found its port taken
    (reproduced here; the raylet printed "Ray runtime started" first and exited 10 s later).
    Only the logs the node created count: the head's own (non-fatal) bind errors are older."""
    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "dashboard.log").write_text("OSError: [Errno 98] Address already in use\n")  # the head's
    before = {"dashboard.log"}
    (logs / "runtime_env_agent.1.err").write_text(
        'Traceback (most recent call last):\n  File "main.py", line 248, in <module>\n    sock.bind(sockaddr)\n'
        "OSError: [Errno 98] Address already in use\n"
    )
    (logs / "raylet.1.out").write_text(
        "[2026-11-29 03:19:02,254 E 21150 21250] (raylet) agent_manager.cc:87: The raylet exited immediately "
        "because one Ray agent failed, agent_name = runtime_env_agent.\n"
        'reason_message: "runtime_env_agent failed and raylet fate-shares with it."\n'
    )
    start_log = tmp_path / "node-0.log"
    start_log.write_text(
        "2026-11-29 03:19:12,626\tERR scripts.py:1307 -- \x1b[31mSome Ray subprocesses exited unexpectedly:\x1b[39m\n"
    )
    cause = local_head.start_cause(start_log, tmp_path, before, 1)
    assert cause == (
        "runtime_env_agent failed (OSError: [Errno 98] Address already in use) and the raylet exits with it "
        "(see raylet.1.out)"
    )
    (logs / "raylet.1.out").write_text("")
    (logs / "runtime_env_agent.1.err").write_text("")
    assert local_head.start_cause(start_log, tmp_path, before, 1) == (
        "node-0.log: Some Ray subprocesses exited unexpectedly:"
    )
    start_log.write_text("")
    assert local_head.start_cause(start_log, tmp_path, before, -9) == "no output, exit status -9"
