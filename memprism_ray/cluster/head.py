"""Start, probe and stop a local Ray head as a child process group (never with ``ray stop``:
every Ray process on the machine), and submit jobs to it through the Job API (``make run``, the
end-to-end test; docs/embedded-default.md). Every listener is bound to 127.0.0.1.

What every node start here shares with :mod:`memprism_ray.testing.local_cluster` (issue 40 item 6):

- **Ports**: the ports a node must be told are chosen by :func:`free_ports` outside the
  kernel's ephemeral range (:func:`ephemeral_range`), so no outgoing connection can take one
  between the check and Ray's bind; the rest are left to Ray (``0``: the process binds a port
  of the kernel's choice itself and records it, nothing to take from under it).
- **Start**: :func:`start_ray_node` holds a machine-wide lock (:data:`NODE_START_LOCK`) from
  the port choice until the node is up (:func:`wait_until_up`: ALIVE in the GCS, its ports
  its own), and starts a node that dies at start again, on new ports, a bounded number of
  times, with a line naming the cause, after taking it off the GCS (:class:`Gcs`).
- **Stop**: :func:`kill_group` signals a process group only while it is verifiably the one
  :func:`spawn` started.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Ray's worker processes bind ports from 10002-19999 (``ray start``'s default
#: ``--min-worker-port``/``--max-worker-port``): the ports chosen here lie above them.
PORT_FLOOR = 20000
#: Assumed when ``net.ipv4.ip_local_port_range`` cannot be read: Linux's default lower bound to
#: the top, which covers the IANA dynamic range (49152-65535) other kernels hand out.
FALLBACK_EPHEMERAL = (32768, 65535)
#: Held while a node of this machine chooses its ports and starts (:func:`node_start_lock`).
NODE_START_LOCK = Path(tempfile.gettempdir()) / "memprism-ray-node-start.lock"
#: How long past the bound its holder gave a waiter still waits for the lock.
LOCK_GRACE_S = 30.0
#: What one attempt of :func:`start_ray_node` may take beyond its ``timeout_s`` (the ports'
#: choice, the stop of a failed node and taking it off the GCS).
START_MARGIN_S = 60.0
#: Longer than ``ray start --block``'s 1 s check of its children: a node that lost a process
#: at start has said so (by exiting) within it.
SETTLE_S = 1.5
#: Ports every node's agents record in its session (``<name>_<node id>``) once bound.
AGENT_PORT_FILES = (
    "dashboard_agent_listen_port",
    "metrics_agent_port",
    "metrics_export_port",
    "runtime_env_agent_port",
)
#: The variable :func:`spawn` marks a group's processes with (inherited by Ray's children).
GROUP_MARK = "MEMPRISM_PROCESS_GROUP"


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral port range (``net.ipv4.ip_local_port_range``): where a port bound
    as 0, and the local port of every outgoing connection, comes from. :data:`FALLBACK_EPHEMERAL`
    where it cannot be read (not Linux)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return FALLBACK_EPHEMERAL
    return low, high


def port_pool() -> list[int]:
    """The ports :func:`free_ports` chooses from: :data:`PORT_FLOOR` and up, outside the
    ephemeral range."""
    low, high = ephemeral_range()
    pool = [p for p in range(PORT_FLOOR, 65536) if not low <= p <= high]
    if not pool:
        raise RuntimeError(
            f"no port in {PORT_FLOOR}-65535 lies outside the kernel's ephemeral range {low}-{high} "
            "(net.ipv4.ip_local_port_range): narrow it, e.g. sysctl -w net.ipv4.ip_local_port_range='32768 60999'"
        )
    return pool


def _hold(port: int) -> socket.socket | None:
    """A socket bound to ``port`` on 0.0.0.0 (not listening), or None where the port is taken.
    Bound on 0.0.0.0, the check fails wherever the port is held on any IPv4 address of the
    machine (127.0.0.1, the interface address, the wildcard, an IPv4-mapped IPv6 socket) or
    is the local port of a connection, so it holds for the address a node binds, whichever."""
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
    except OSError:
        s.close()
        return None
    return s


def free_ports(*preferred: int | None) -> list[int]:
    """One free port per entry, all distinct: ``preferred`` where it is outside the kernel's
    ephemeral range and free, else one from :func:`port_pool`, scanned from a random offset
    (two processes choosing at once rarely meet; :data:`NODE_START_LOCK` serializes this
    package's own starts, and a node that still finds its port taken dies at start and is
    started again: :func:`start_ray_node`). Every socket stays bound until all are chosen:
    asked one at a time, the kernel handed out the same ephemeral port twice in a row (CI:
    Ray refused to start, runtime_env_agent and metrics_export both on 50031). Issue 40: a
    port from the ephemeral range, checked and released, was taken by an outgoing connection
    before Ray bound it (a worker node's runtime_env_agent, "Address already in use")."""
    low, high = ephemeral_range()
    held: dict[int, socket.socket] = {}
    try:
        chosen: list[int | None] = []
        for want in preferred:  # the preferred ports first: a later "any" slot must not take one
            s = _hold(want) if want and not low <= want <= high and want not in held else None
            if s is not None:
                held[want] = s  # type: ignore[index]
            chosen.append(want if s is not None else None)
        pool = port_pool()
        start = random.SystemRandom().randrange(len(pool))
        candidates = iter(pool[start:] + pool[:start])
        for i, port in enumerate(chosen):
            while port is None:
                candidate = next(candidates, None)
                if candidate is None:
                    raise RuntimeError(f"no free port left in {pool[0]}-{pool[-1]} outside {low}-{high}")
                if candidate in held:
                    continue
                s = _hold(candidate)
                if s is not None:
                    held[candidate] = s
                    port = candidate
            chosen[i] = port
        return [int(p) for p in chosen]  # type: ignore[arg-type]
    finally:
        for s in held.values():
            s.close()


@contextlib.contextmanager
def node_start_lock(
    hold_s: float,
    what: str = "a Ray node",
    path: Path = NODE_START_LOCK,
    *,
    grace_s: float = LOCK_GRACE_S,
    say_every_s: float = 30.0,
) -> Iterator[None]:
    """Hold :data:`NODE_START_LOCK` (``flock``; released by the kernel if the holder dies): one
    node of this machine chooses its ports and starts at a time, whichever process starts it
    (parallel test sessions), which also keeps two starts from timing out each other. Ray
    itself needs it even where no port is chosen here: two worker nodes of one cluster started
    at once without it (every port left to Ray), one raylet died at start on a port the other
    had taken ("bind: Address already in use") in 3 rounds of 3, and the pair was up in 35 s
    against 7.5-8.3 s one after the other (2 cores, idle).

    The holder writes into the lock file who it is and until when it may hold it (``hold_s``
    from now: the bound of its start). A waiter waits at least its own ``hold_s``, and as long
    as the holder is within its bound (``grace_s`` more), with a line on stderr every
    ``say_every_s``; past that the holder is hung and the TimeoutError names it. A fixed wait
    was not enough: under a CPU hog a worker node's start (two attempts Ray timed out, then a
    third) held the lock past 120 s, and three test modules waiting 120 s failed their set-up."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except PermissionError:  # another user's lock file: lock it, without saying who holds it
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        since = time.time()
        said = since
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _lock_holder(fd)
                now = time.time()
                until = max(since + hold_s, float(holder.get("until", 0.0)) + grace_s)
                who = f"{holder.get('what', 'another process')} (pid {holder.get('pid', '?')})"
                if now > until:
                    raise TimeoutError(
                        f"{who} has held {path} for more than {now - since:.0f}s, past the bound it gave "
                        "(a Ray node start on this machine that hung)"
                    ) from None
                if now - said >= say_every_s:
                    print(f"waiting {now - since:.0f}s for {who} to start on this machine", file=sys.stderr, flush=True)
                    said = now
                time.sleep(0.1)
        with contextlib.suppress(OSError):  # read-only: nothing to say
            record = json.dumps({"pid": os.getpid(), "what": what, "until": time.time() + hold_s}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _lock_holder(fd: int) -> dict[str, object]:
    """What the lock's holder wrote ({} while it is writing, or from a holder that wrote nothing)."""
    try:
        got = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def new_auth_token() -> str:
    """A fresh Ray auth token: 256 random bits, hex (the format ``ray get-auth-token --generate`` writes)."""
    return secrets.token_hex(32)


def token_auth_env(folder: Path, token: str) -> dict[str, str]:
    """Write ``token`` to ``folder/auth_token`` (created 0600, never world-readable in between)
    and return what every node and driver needs to use it."""
    path = Path(folder) / "auth_token"
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        fh.write(token)
    os.chmod(path, 0o600)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def ray_bin() -> str:
    """The ``ray`` CLI of this Python's environment (a venv need not be on PATH), else ``ray``."""
    ray = Path(sys.executable).parent / "ray"
    return str(ray) if ray.exists() else "ray"


def proc_stat(pid: str | int) -> tuple[str, str, int, int] | None:
    """``(comm, state, pgid, sid)`` of a process from ``/proc/<pid>/stat``; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # the process exited while we read
        return None
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    return head.partition("(")[2], fields[0], int(fields[2]), int(fields[3])


def _session(leader: int) -> dict[int, str]:
    """Running processes (pid: comm) of the group and session ``leader`` leads (``spawn``'s
    ``start_new_session``): Ray's worker processes take process groups of their own within the
    node's session. Zombies do not count: an orphan's zombie waits on whatever reaps for PID 1,
    which in a container may be nobody."""
    members = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = proc_stat(entry.name)
            if stat is not None and leader in (stat[2], stat[3]) and stat[1] not in ("Z", "X"):
                members[int(entry.name)] = stat[0]
    return members


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group or session ``pgid`` still runs (:func:`_session`). Without
    ``/proc`` (not Linux) a signal-0 probe of the group, which counts zombies too."""
    if not Path("/proc/self/stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return bool(_session(pgid))


#: The mark of every group :func:`spawn` started, by its leader.
_MARKS: weakref.WeakKeyDictionary[subprocess.Popen, str] = weakref.WeakKeyDictionary()


def spawn(cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """``cmd`` in a process group of its own (stopped by it: :func:`stop_group`), writing
    ``log_path``; its processes carry a mark of their own (:data:`GROUP_MARK`) by which
    :func:`kill_group` knows them once the leader is gone."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    mark = secrets.token_hex(8)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**env, GROUP_MARK: mark},
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
    _MARKS[proc] = mark
    return proc


def exited(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has exited, without reaping it: while it is not reaped its pid, which is
    its group's id, cannot be given to another process (:func:`kill_group` relies on it).
    ``Popen.poll`` would reap it."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped behind Popen's back
        return True


def _marked(pid: int, mark: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{GROUP_MARK}={mark}".encode() in environ.split(b"\0")


def kill_if(pid: int, ours: Callable[[int], bool]) -> None:
    """SIGKILL ``pid`` if ``ours(pid)`` holds for the process a pidfd pins (a pid read from
    /proc may have been reused by the time it is signalled); without pidfds (Linux < 5.3),
    checked and signalled by pid."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        if ours(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return
    try:
        if ours(pid):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)


def kill_group(proc: subprocess.Popen, wait_s: float = 30.0) -> None:
    """SIGKILL the process group ``proc`` leads (``start_new_session=True``) and the rest of its
    session (Ray's workers, in groups of their own), wait, at most ``wait_s`` seconds, until
    none of them runs, then reap ``proc``: Ray's children may outlive ``ray start`` itself, and
    SIGKILL is delivered asynchronously, so a caller that starts a node on the same ports or
    directories right after must not find one still dying (CI caught a killed child still
    listed as running the moment ``killpg`` returned).

    Only processes verified as ours are signalled (issue 40). While ``proc`` is not reaped its
    pid is reserved, so the group and session of that id are the ones it leads; the leader is
    reaped only once they are gone. Once it is reaped (a second call, ``LocalCluster.shutdown``
    after a node's kill, or a caller's ``wait``) the pid may be someone else's: only processes
    of that group or session carrying :func:`spawn`'s mark, or any of it while no other process
    holds the leader's pid (a process title may overwrite the mark), are signalled, none of a
    group it did not start."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

        def ours(pid: int) -> bool:
            stat = proc_stat(pid)
            return stat is not None and proc.pid in (stat[2], stat[3])

        def running() -> list[int]:
            if not Path("/proc/self/stat").exists():
                return [proc.pid] if _group_alive(proc.pid) else []
            return list(_session(proc.pid))

    else:
        mark = _MARKS.get(proc)

        def ours(pid: int) -> bool:
            stat = proc_stat(pid)
            if stat is None or proc.pid not in (stat[2], stat[3]) or mark is None:
                return False
            # Ray's agents set their process title, which overwrites the environment the mark is
            # in (ray::DashboardAgent, ray::RuntimeEnvAgent survived a stop so). Linux gives no
            # process a pid that is still the id of a group or session with members, and the
            # reaped leader is gone: while no process holds its pid, its session is the one it led.
            return _marked(pid, mark) or proc_stat(proc.pid) is None

        def running() -> list[int]:
            if mark is None or not Path("/proc/self/stat").exists():
                return []
            return [pid for pid in _session(proc.pid) if ours(pid)]

    deadline = time.monotonic() + wait_s
    while (left := running()) and time.monotonic() < deadline:
        for pid in left:
            if pid != proc.pid:  # the session's other groups, and whatever killpg's walk missed
                kill_if(pid, ours)
        time.sleep(0.05)
    if proc.returncode is None and not running():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(deadline - time.monotonic(), 1.0))


def stop_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """Stop a ``ray start --block`` process group: SIGTERM to ``ray start`` (it drains and stops
    its own processes), at most ``timeout_s`` seconds for it to exit, then :func:`kill_group`
    as a sweep (a ``ray start`` that already exited, crashed say, gets only the sweep, which its
    surviving children still need). The leader is not reaped before the sweep (:func:`exited`).

    Only ``ray start`` gets the SIGTERM: with the whole group signalled at once it waited out
    the full 30 s timeout on every run, against about 3 s when it shuts its children down
    itself (measured with Ray 2.60 on 2 cores)."""
    if not exited(proc):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while not exited(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
    kill_group(proc, timeout_s)


class NodeStartError(RuntimeError):
    """A node that died while starting; ``cause``: the line that says why."""

    def __init__(self, what: str, cause: str) -> None:
        super().__init__(f"{what} exited while starting: {cause}")
        self.cause = cause


class Gcs:
    """A minimal client of a Ray cluster's GCS, for :func:`start_ray_node`: the nodes' states,
    and taking a node off. Ray's own generated gRPC stubs with the cluster's token as the
    ``authorization`` header, in this process: Ray's client classes read the auth mode and
    token once, when ``ray`` is imported, and a test process has its own (disabled)."""

    def __init__(self, address: str, token: str | None) -> None:
        import grpc
        from ray.core.generated import gcs_service_pb2_grpc

        self._channel = grpc.insecure_channel(address)
        self._stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(self._channel)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []

    def _nodes(self) -> list[Any] | None:
        """Every node the GCS has (``GcsNodeInfo``); None when it does not answer."""
        import grpc
        from ray.core.generated import gcs_service_pb2

        try:
            request = gcs_service_pb2.GetAllNodeInfoRequest()
            return list(self._stub.GetAllNodeInfo(request, metadata=self._metadata, timeout=5).node_info_list)
        except grpc.RpcError:
            return None

    def node(self, node_id: str) -> tuple[str, str] | None:
        """``(state, why it died)`` of node ``node_id`` (hex) as the GCS has it; None when it has
        not registered, or the GCS does not answer yet."""
        from ray.core.generated import gcs_pb2

        for info in self._nodes() or []:
            if info.node_id.hex() == node_id:
                return gcs_pb2.GcsNodeInfo.GcsNodeState.Name(info.state), info.death_info.reason_message
        return None

    def may_be_alive(self, node_id: str) -> bool:
        """False only when the GCS answers and has node ``node_id`` dead, or not at all."""
        from ray.core.generated import gcs_pb2

        nodes = self._nodes()
        alive = gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE
        return nodes is None or any(info.node_id.hex() == node_id and info.state == alive for info in nodes)

    def unregister(self, node_id: str, why: str) -> str:
        """Mark node ``node_id`` dead at once (``UnregisterNode``, what a raylet that stops sends):
        a worker node killed after it registered stays ALIVE in the GCS, and placeable, until
        its health checks run out (an actor was placed on one in testing, and died with it).
        "" when done (or when the node went dead meanwhile), else why not. Ray 2.60's GCS never
        answers the call for a node it no longer has alive ("Node is already removed"): the
        caller asks only while :meth:`may_be_alive`, and a call that times out is asked again."""
        import grpc
        from ray.core.generated import common_pb2, gcs_service_pb2

        death = common_pb2.NodeDeathInfo(reason=common_pb2.NodeDeathInfo.UNEXPECTED_TERMINATION, reason_message=why)
        request = gcs_service_pb2.UnregisterNodeRequest(node_id=bytes.fromhex(node_id), node_death_info=death)
        try:
            self._stub.UnregisterNode(request, metadata=self._metadata, timeout=10)
        except grpc.RpcError as exc:
            if not self.may_be_alive(node_id):  # its raylet or its health checks took it off meanwhile
                return ""
            code = exc.code().name  # type: ignore[attr-defined]
            return f"the GCS did not take it off ({code}): it counts as alive until its health checks run out"
        return ""

    def close(self) -> None:
        self._channel.close()


def _listening() -> dict[int, set[int]]:
    """Port: socket inodes of every listening TCP socket of this network namespace."""
    ports: dict[int, set[int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    ports.setdefault(int(fields[1].rsplit(":", 1)[1], 16), set()).add(int(fields[9]))
    return ports


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def head_node_id(session: Path) -> str | None:
    """The head's node id in a Ray session (the node that recorded a GCS port)."""
    gcs = next(iter(session.glob("gcs_server_port_*")), None)
    return gcs.name.rsplit("_", 1)[1] if gcs else None


def session_ports(session: Path, node_id: str) -> dict[str, int]:
    """The ports node ``node_id`` recorded in its Ray session (``<name>_<node id>`` files, each
    written by a process once it bound)."""
    ports = {}
    for f in session.glob(f"*_{node_id}"):
        with contextlib.suppress(OSError, ValueError):
            ports[f.name[: -len(node_id) - 1]] = int(f.read_text().strip())
    return ports


#: What a raylet logs when an agent of it died (it then exits with it): ``<agent> failed and ...``.
FATE_SHARES = re.compile(r"(\w+) failed and raylet fate-shares with it")


class RayletLog:
    """A node's own ``raylet*.out`` in a session several nodes share (found by the node id its
    raylet logs at start), read for the line a raylet writes when one of its agents died: it
    then exits with the agent ("fate-shares"), but only 10 s later here, or when ``ray start``'s
    own 30 s wait for the GCS to list the node runs out (a CI run), so a start that has already
    failed is known from this line seconds sooner than from the exit."""

    def __init__(self, session: Path) -> None:
        self.session = session
        self.path: Path | None = None

    def agent_failed(self, node_id: str) -> bool:
        if self.path is None:
            for f in (self.session / "logs").glob("raylet*.out"):
                with contextlib.suppress(OSError):
                    if f"Setting node ID node_id={node_id}" in f.read_text(errors="replace"):
                        self.path = f
                        break
        if self.path is None:
            return False
        try:
            return FATE_SHARES.search(self.path.read_text(errors="replace")) is not None
        except OSError:
            return False


def wait_until_up(
    proc: subprocess.Popen,
    log_path: Path,
    temp_dir: Path,
    what: str,
    timeout_s: float,
    *,
    gcs: Gcs | None = None,
    node_id: str | None = None,
    ports: Mapping[str, int] | None = None,
    settle_s: float = SETTLE_S,
) -> str:
    """Wait until the ``ray start --block`` node of ``proc`` is up and return its node id: its
    log says "Ray runtime started", the GCS (``gcs``) has it ALIVE, every port it was given
    (``ports``) and every port its agents recorded (:data:`AGENT_PORT_FILES`) is listened on by
    a process of its own session, its raylet listens, and all of that still holds ``settle_s``
    later with ``ray start`` running. The log line alone is not enough: a worker node whose
    runtime_env_agent could not bind printed it, and its raylet exited 10 s later
    ("fate-shares" with the agent; issue 40). ``node_id`` None: the head's. Raises
    :class:`NodeStartError` when the node exits, its raylet says an agent of it died
    (:class:`RayletLog`), the GCS has it dead, or another process listens on one of its
    ports; TimeoutError past ``timeout_s``."""
    session = Path(temp_dir) / "session_latest"
    given = {name: port for name, port in (ports or {}).items() if port > 0}
    check_ports = Path("/proc/net/tcp").exists()
    deadline = time.monotonic() + timeout_s
    up_since: float | None = None
    foreign_before: set[str] = set()
    raylet_log = RayletLog(session)
    while time.monotonic() < deadline:
        if exited(proc):
            raise NodeStartError(what, "")
        node = node_id or head_node_id(session)
        if node is not None and raylet_log.agent_failed(node):
            raise NodeStartError(what, "")  # the caller reads why from the logs (start_cause)
        ready = node is not None and "Ray runtime started" in log_path.read_text(errors="replace")
        if ready and gcs is not None:
            state = gcs.node(node)  # type: ignore[arg-type]
            if state is not None and state[0] == "DEAD":
                raise NodeStartError(what, f"the GCS has it dead: {state[1] or 'no reason given'}")
            ready = state is not None and state[0] == "ALIVE"
        if ready and check_ports:
            recorded = session_ports(session, node)  # type: ignore[arg-type]
            want = {**given, **{k: v for k, v in recorded.items() if v > 0}}
            listening = _listening()
            members = _session(proc.pid)
            ours = {pid: _socket_inodes(pid) for pid in members}
            owned = set().union(*ours.values()) if ours else set()
            foreign = {name for name, port in want.items() if listening.get(port) and not listening[port] & owned}
            if foreign & foreign_before:  # seen twice: not a socket of ours caught between two reads
                name = sorted(foreign & foreign_before)[0]
                raise NodeStartError(what, f"port {want[name]} ({name}) is held by another process")
            foreign_before = foreign
            listeners = set().union(*listening.values())
            raylet = any(comm == "raylet" and ours[pid] & listeners for pid, comm in members.items())
            ready = (
                raylet
                and all(name in recorded for name in AGENT_PORT_FILES)
                and all(listening.get(port, set()) & owned for port in want.values())
            )
        if not ready:
            up_since = None
        elif up_since is None:
            up_since = time.monotonic()
        elif time.monotonic() - up_since >= settle_s:
            return node  # type: ignore[return-value]
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not start within {timeout_s:.0f}s; see {log_path}")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _lines(text: str) -> list[str]:
    """Log lines without colour codes and without the ``<time> <level> <file>:<line> --`` prefix."""
    return [_ANSI.sub("", line).split(" -- ", 1)[-1].strip() for line in text.splitlines()]


def start_cause(log_path: Path, temp_dir: Path, before: set[str], returncode: int | None = None) -> str:
    """Why a node exited at start, in one line, from its ``ray start`` log and the session logs
    it created (not in ``before``). Ray's raylet exits with an agent that failed ("fate-shares
    with it"); the agent's own ``.err`` says why (CI: ``OSError: [Errno 98] Address already in
    use``)."""
    logs = Path(temp_dir) / "session_latest" / "logs"
    texts = {log_path.name: log_path.read_text(errors="replace") if log_path.exists() else ""}
    if logs.is_dir():
        for f in sorted(logs.iterdir()):
            if f.is_file() and f.name not in before:
                texts[f.name] = f.read_text(errors="replace")
    lines = {name: _lines(text) for name, text in texts.items()}
    for name, text in texts.items():
        agent = FATE_SHARES.search(text)
        if agent:
            errors = [
                line
                for log, found in lines.items()
                if log.startswith(agent[1]) and log.endswith(".err")
                for line in found
                if re.match(r"\w*(Error|Exception)\b", line)
            ]
            why = f" ({errors[-1]})" if errors else ""
            return f"{agent[1]} failed{why} and the raylet exits with it (see {name})"
    for pattern in ("Address already in use", "timed out during startup", "exited unexpectedly"):
        for name, found in lines.items():
            for i, line in enumerate(found):
                if pattern in line:
                    more = f" {found[i + 1]}" if pattern == "exited unexpectedly" and i + 1 < len(found) else ""
                    return f"{name}: {line}{more}"[:300]
    last = [line for line in lines[log_path.name] if line]
    return (last[-1] if last else f"no output, exit status {returncode}")[:300]


@dataclass
class NodeLaunch:
    """One attempt at starting a node: the command, its environment, the GCS it runs or joins
    (``host:port``), the ports it was given (name: port; :func:`wait_until_up` checks them) and
    the node id it was told to take (None: a head, whose id Ray chooses)."""

    cmd: list[str]
    env: dict[str, str]
    gcs_address: str
    ports: dict[str, int] = field(default_factory=dict)
    node_id: str | None = None


def start_ray_node(
    launch: Callable[[], NodeLaunch],
    log_path: Path,
    temp_dir: Path,
    what: str,
    *,
    auth_token: str | None = None,
    timeout_s: float = 120.0,
    attempts: int = 3,
    restarts: list[str] | None = None,
) -> tuple[subprocess.Popen, NodeLaunch]:
    """Start a ``ray start --block`` node and wait until it is up (:func:`wait_until_up`); one
    that dies at start is started again, ``launch`` choosing new ports and a new node id, at
    most ``attempts`` times in all, each time with a line on stderr naming the cause (also
    appended to ``restarts``). A failed worker node is taken off its cluster's GCS
    (:meth:`Gcs.unregister`) before anything can be placed on it. The failed attempt's log is
    kept beside ``log_path`` (``.failed-N.log``). :data:`NODE_START_LOCK` is held from the
    port choice until the node is up. ``auth_token``: the cluster's, for the GCS."""
    logs = Path(temp_dir) / "session_latest" / "logs"
    cause = ""
    for attempt in range(1, attempts + 1):
        with node_start_lock(timeout_s + START_MARGIN_S, what):
            node = launch()
            before = {f.name for f in logs.iterdir()} if logs.is_dir() else set()
            gcs = Gcs(node.gcs_address, auth_token)
            proc = spawn(node.cmd, log_path, node.env)
            try:
                node.node_id = wait_until_up(
                    proc, log_path, temp_dir, what, timeout_s, gcs=gcs, node_id=node.node_id, ports=node.ports
                )
                return proc, node
            except NodeStartError as exc:
                kill_group(proc)
                cause = exc.cause
                if not cause.startswith("port "):  # it exited, or the GCS has it dead: its logs say why
                    logged = start_cause(log_path, temp_dir, before, proc.returncode)
                    cause = f"{logged} ({cause})" if cause else logged
                # A worker node, which may have registered before it died. Only one the GCS has
                # alive is taken off: the call for a node it never saw (a start abandoned as soon
                # as an agent died) or has dead already (a raylet that unregistered itself when
                # it exited: CI) is never answered, and waited out its 10 s.
                if node.node_id and gcs.may_be_alive(node.node_id):
                    not_off = gcs.unregister(node.node_id, f"{what} died while starting: {cause}")
                    cause += f"; {not_off}" if not_off else ""
            except BaseException:
                kill_group(proc)
                raise
            finally:
                gcs.close()
        kept = log_path.with_name(f"{log_path.stem}.failed-{attempt}.log")
        log_path.replace(kept)
        again = f"starting it again{' on new ports' if node.ports else ''} (attempt {attempt + 1} of {attempts})"
        line = f"{what} exited while starting: {cause}; " + (again if attempt < attempts else f"giving up; see {kept}")
        print(line, file=sys.stderr, flush=True)
        if restarts is not None:
            restarts.append(line)
    raise NodeStartError(what, f"{cause} ({attempts} attempts; the last log: {kept})")


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def head_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the head and the CLI: explicit Ray settings, this Python first on PATH
    (a job's ``python`` entrypoint is the first on the head's PATH)."""
    from memprism_ray.cluster.placement import RAY_ENV

    env = dict(os.environ)
    env.update(
        {
            **RAY_ENV,
            "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "disabled"),
            # Keeps every Ray listener on 127.0.0.1 (measured with Ray 2.60; an internal setting).
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    env.pop("RAY_ADDRESS", None)
    env.update(extra or {})
    return env


@dataclass
class LocalHead:
    """A running local head."""

    process: subprocess.Popen
    dashboard_port: int
    metrics_port: int
    temp_dir: Path
    log_path: Path
    auth_token: str | None = None
    token_path: Path | None = None
    restarts: list[str] = field(default_factory=list)
    """a line per start that failed and was retried (:func:`start_ray_node`)"""

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def alive(self) -> bool:
        return not exited(self.process)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the head (:func:`stop_group`; Ray drains for up to 30 s, so ``timeout`` is longer)."""
        stop_group(self.process, timeout)


def start_head(
    temp_dir: Path,
    *,
    num_cpus: int | None = None,
    dashboard_port: int = 8265,
    metrics_port: int = 8080,
    timeout_s: float = 120.0,
    auth_token: str | None = None,
) -> LocalHead:
    """Start ``ray start --head --block`` in a new process group (:func:`start_ray_node`: up,
    or started again on new ports) and wait until the job API answers. Ports that are taken,
    or inside the kernel's ephemeral range, are replaced by free ones (the chosen ports are on
    the returned object)."""
    temp_dir = Path(temp_dir).resolve()
    temp_dir.mkdir(parents=True, exist_ok=True)
    auth_env = token_auth_env(temp_dir, auth_token) if auth_token else {"RAY_AUTH_MODE": "disabled"}
    token_path = Path(auth_env["RAY_AUTH_TOKEN_PATH"]) if auth_token else None

    def launch() -> NodeLaunch:
        # The ports a user or client must know; Ray's other defaults (52365, ...) are fixed
        # ports another Ray of this machine may hold, so the agents bind ports of their own
        # choosing (0), which nothing can take from under them.
        dash, met, gcs, client = free_ports(dashboard_port, metrics_port, 6379, 10001)
        cmd = [
            ray_bin(),
            "start",
            "--head",
            "--block",
            f"--port={gcs}",
            "--dashboard-agent-listen-port=0",
            f"--ray-client-server-port={client}",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            f"--metrics-export-port={met}",
            f"--temp-dir={temp_dir}",
            "--include-dashboard=true",
            "--disable-usage-stats",
        ]
        if num_cpus:
            cmd.append(f"--num-cpus={num_cpus}")
        ports = {"dashboard": dash, "metrics_export": met, "gcs": gcs, "ray_client_server": client}
        return NodeLaunch(cmd, head_env(auth_env), f"127.0.0.1:{gcs}", ports)

    log_path = temp_dir / "head.log"
    deadline = time.monotonic() + timeout_s
    restarts: list[str] = []
    proc, node = start_ray_node(
        launch, log_path, temp_dir, "the Ray head", auth_token=auth_token, timeout_s=timeout_s, restarts=restarts
    )
    head = LocalHead(
        proc, node.ports["dashboard"], node.ports["metrics_export"], temp_dir, log_path, auth_token or None,
        token_path, restarts,
    )  # fmt: skip
    while time.monotonic() < deadline:
        if not head.alive():
            raise RuntimeError(f"the Ray head exited while starting; see {log_path}:\n{log_path.read_text()[-2000:]}")
        try:
            req = urllib.request.Request(f"{head.address}/api/version", headers=auth_headers(head.auth_token))
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return head
        except OSError:
            time.sleep(1.0)
    head.stop()
    raise TimeoutError(f"the Ray head did not answer on {head.address} within {timeout_s:.0f}s; see {log_path}")


def submit_and_wait(
    address: str,
    entrypoint: str,
    working_dir: Path,
    *,
    timeout_s: float = 3600.0,
    echo: bool = True,
    env_vars: dict[str, str] | None = None,
    on_poll: Callable[[str], None] | None = None,
    auth_token: str | None = None,
    agent_wait_s: float = 600.0,
) -> tuple[str, str]:
    """Submit a job through the Job API, stream its logs, wait for a terminal status:
    ``(status, logs)``. ``agent_wait_s``: how long the head's job agent may take to accept it."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    from memprism_ray.cluster.placement import RAY_ENV

    client = JobSubmissionClient(address, headers=auth_headers(auth_token) or None)
    runtime_env = {
        "working_dir": str(working_dir),
        # The head's own auth mode applies to the job: never the default "disabled".
        "env_vars": {**{k: v for k, v in RAY_ENV.items() if k != "RAY_AUTH_MODE"}, **(env_vars or {})},
        "excludes": [".venv", "runs", ".git", "**/__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache"],
    }
    job_id = None
    start = time.monotonic()
    next_note = start + 30.0
    while job_id is None:
        try:
            job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
        except RuntimeError as exc:
            if "status code 413" in str(exc):
                # Ray reads .gitignore and the excludes above, not .git/info/exclude: a large
                # untracked folder in the checkout made the upload 726 MiB (measured).
                raise RuntimeError(
                    f"{exc}\nthe job uploads {working_dir} as its working_dir and the upload is too large: "
                    "move large files out of the checkout, or list them in its .gitignore or a .rayignore"
                ) from exc
            # The job API answers before the head's dashboard agent is up: retry that one case.
            # On a loaded 2-core machine the agent took over 120 s to come up (a make run
            # beside the test suite), so the wait is agent_wait_s, with a note every 30 s.
            if "No available agent" not in str(exc):
                raise
            waited = time.monotonic() - start
            if waited > agent_wait_s:
                raise RuntimeError(
                    f"the Ray head at {address} has no job agent after {waited:.0f} s (agent_wait_s="
                    f"{agent_wait_s:.0f}); is the machine overloaded? The head's logs are under its temp dir"
                ) from exc
            if echo and time.monotonic() >= next_note:
                print(f"waiting for the head's job agent ({waited:.0f} s so far)", flush=True)
                next_note += 30.0
            time.sleep(2.0)
    if echo:
        print(f"submitted job {job_id} to {address}; dashboard: {address}/#/jobs/{job_id}", flush=True)
    deadline = time.monotonic() + timeout_s
    shown = 0
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    try:
        while True:
            logs = client.get_job_logs(job_id)
            if echo and len(logs) > shown:
                sys.stdout.write(logs[shown:])
                sys.stdout.flush()
                shown = len(logs)
            status = client.get_job_status(job_id)
            if on_poll is not None:
                on_poll(str(status))
            if status in terminal:
                break
            if time.monotonic() > deadline:
                client.stop_job(job_id)
                raise TimeoutError(f"job {job_id} did not finish within {timeout_s:.0f}s")
            time.sleep(2.0)
    except KeyboardInterrupt:  # Ctrl-C stops what it started (`ray job submit` would leave it running)
        if client.stop_job(job_id):  # False: it had ended, and its status says how
            raise
        status = client.get_job_status(job_id)
    logs = client.get_job_logs(job_id)
    if echo and len(logs) > shown:
        sys.stdout.write(logs[shown:])
    return str(status.value if hasattr(status, "value") else status), logs
