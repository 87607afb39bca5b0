"""A Ray cluster of several nodes on this machine (issue 34), for the multi-node tests and
``benchmarks/bench_scaling.py``: a head and worker nodes started with ``ray start``; as root,
a worker node starts in its own mount namespace with an empty tmpfs over each private folder,
as on separate machines. Measured here with Ray 2.60: a head of 0 CPUs up in 3 s, a worker node
in 5-6 s; two nodes started at the same moment can time out, so nodes start one at a time
(:func:`~memprism_ray.cluster.head.start_ray_node`, which also starts a node that dies at start
again). Every node is stopped by its process group, never with ``ray stop`` (every Ray process
of the machine, other tests' included).

**Token auth** is on by default (a fresh token per cluster, 0600): :meth:`LocalCluster.driver_env`
is what a driver that joins needs.

**Loopback only** (issue 40): every node is ``--node-ip-address=127.0.0.1`` and every listener
of the cluster, and so every connection between its nodes, is on 127.0.0.1. Ray 2.60 would
not allow it by itself. Where it forces the interface address:

- ``ray start`` (``ray/scripts/scripts.py``, ``start()``) passes ``--node-ip-address`` and the
  ``--address`` of the head through ``services.resolve_ip_for_localhost``, which turns
  ``127.0.0.1`` into ``services.get_node_ip_address()``: the interface address
  (``node_ip_address_from_perspective``), unless ``ray_constants.ENABLE_RAY_CLUSTER`` is off;
- ``ENABLE_RAY_CLUSTER`` is read from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` (default on, on
  Linux), and with it off the same ``start()`` refuses to start a worker node ("Multi-node Ray
  clusters are not supported on Windows and OSX");
- the GCS, the raylets and the agents' gRPC servers listen on 127.0.0.1 only when the node's
  address is exactly ``127.0.0.1``, else on ``*`` (``ss -ltnp``; 127.0.0.2 gave ``*`` too).

So every process here runs with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (nothing resolves
127.0.0.1 to the interface address; a driver needs it too: :meth:`LocalCluster.driver_env`),
and a worker node's ``ray start`` runs Ray's own CLI through :data:`LOOPBACK_WORKER`, which
lets that one process past the refusal and keeps 127.0.0.1 as given. Measured with
``ss -ltnp`` and ``ss -tnp`` (docs/cluster.md "Tried"), a head and two worker nodes with a
driver and an actor on each worker node: before, 27 listeners, 13 on ``*``, 3 on 0.0.0.0, 7
on the interface address, and 64 of 84 connections over it; with this, 23 listeners and 86
connections, all on 127.0.0.1. Two of Ray's internal names are relied on
(``services.resolve_ip_for_localhost``, ``ray_constants.ENABLE_RAY_CLUSTER``):
``tests/cluster/test_local_cluster.py`` re-checks every listener on upgrades.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from memprism_ray.cluster.head import (
    NodeLaunch,
    exited,
    free_ports,
    head_env,
    kill_group,
    new_auth_token,
    ray_bin,
    start_ray_node,
    stop_group,
    token_auth_env,
)


def can_isolate_disks() -> str:
    """``""`` when worker nodes can get disks of their own here, else why not (a test's skip reason)."""
    if os.geteuid() != 0:
        return "separate disks per node need root (a mount namespace with tmpfs mounts)"
    if shutil.which("unshare") is None:
        return "separate disks per node need util-linux's unshare"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare -m with a tmpfs mount failed here: {probe.stderr.decode(errors='replace').strip()[:200]}"
    return ""


#: A worker node's ``ray start``: Ray's own CLI with the two settings that force the
#: interface address (module docstring) undone for this one process; its children get
#: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` from the environment like every other node's.
LOOPBACK_WORKER = """
import sys
from ray._private import ray_constants, services
from ray.scripts.scripts import main
if not hasattr(services, "resolve_ip_for_localhost") or not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
    sys.exit("memprism_ray.testing.local_cluster: this Ray lacks services.resolve_ip_for_localhost or "
             "ray_constants.ENABLE_RAY_CLUSTER; update LOOPBACK_WORKER for it")
ray_constants.ENABLE_RAY_CLUSTER = True  # lets `ray start` add a worker node ...
services.resolve_ip_for_localhost = lambda host: host  # ... on 127.0.0.1, as given
sys.argv[0] = "ray"
sys.exit(main())
"""


@dataclass
class LocalNode:
    """One ``ray start --block`` process group: the head or a worker node."""

    process: subprocess.Popen
    log_path: Path
    num_cpus: float
    private_dirs: tuple[Path, ...] = ()
    resources: dict[str, float] = field(default_factory=dict)
    node_id: str = ""
    """the Ray node id (chosen here, so a test knows which node holds which actor)"""

    def alive(self) -> bool:
        return not exited(self.process)

    def kill(self) -> None:
        """SIGKILL the whole group: the raylet and every worker of the node die at once, as when
        a machine is lost or a preemptible node is taken back."""
        kill_group(self.process)

    def stop(self, timeout: float = 30.0) -> None:
        """:func:`~memprism_ray.cluster.head.stop_group`: SIGTERM to ``ray start``, then a SIGKILL sweep."""
        stop_group(self.process, timeout)


class LocalCluster:
    """A head (``head_cpus`` CPUs: 0, as docs/cluster.md prescribes) and worker nodes added with
    :meth:`add_node`, all on 127.0.0.1 (module docstring). ``env``: variables for every node.
    ``autoscale``: worker node types (``{name: {"resources": {...}, "max_workers": n}}``) for
    Ray's fake multi-node autoscaler, whose nodes are processes of the head's monitor, on the
    machine's own disk. ``auth``: Ray token auth, a fresh token (or ``auth_token``) in a 0600
    file for every node; a driver joins with :meth:`driver_env` (a driver in this process sets
    those variables before it first imports ``ray``, which reads them then, and passes its
    token as ``auth_token``). ``start_attempts``: how often a node that dies at start is
    started (:func:`~memprism_ray.cluster.head.start_ray_node`); ``restarts`` says why."""

    def __init__(
        self,
        temp_dir: Path,
        *,
        head_cpus: float = 0,
        env: dict[str, str] | None = None,
        autoscale: dict[str, dict[str, object]] | None = None,
        timeout_s: float = 120.0,
        auth: bool = True,
        auth_token: str | None = None,
        start_attempts: int = 3,
    ) -> None:
        self.temp_dir = Path(temp_dir).resolve()
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        # Ray's session folder holds Unix sockets, whose paths may not exceed 107 bytes: a short
        # folder of its own under /tmp, whatever temp_dir (a pytest tmp path is too long).
        self.ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        self.env = dict(env or {})
        self.auth_token = (auth_token or new_auth_token()) if auth else None
        self.auth_env = {"RAY_AUTH_MODE": "disabled"}
        if self.auth_token:
            self.auth_env = token_auth_env(self.ray_dir, self.auth_token)
        self.timeout_s = timeout_s
        self.start_attempts = start_attempts
        self.nodes: list[LocalNode] = []
        self._numbered = 0
        self._numbering = threading.Lock()
        self.restarts: list[str] = []
        """a line per node start that failed and was retried"""
        head_vars = dict(self.env)
        if autoscale is not None:
            head_vars |= {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}

        def launch() -> NodeLaunch:
            # The two ports a head must be told (the GCS, which the nodes and drivers join, and
            # the Ray client server, 10001 by default); the agents choose theirs (0).
            gcs, client = free_ports(None, None)
            self.port = gcs  # before the autoscaler's config, which names the GCS address
            cmd = [
                ray_bin(), "start", "--head", "--block", f"--port={gcs}", f"--num-cpus={head_cpus:g}",
                "--node-ip-address=127.0.0.1", f"--temp-dir={self.ray_dir}", "--disable-usage-stats",
                f"--ray-client-server-port={client}", "--dashboard-agent-listen-port=0", "--include-dashboard=false",
            ]  # fmt: skip
            if autoscale is not None:
                cmd.append(f"--autoscaling-config={self._autoscaling_config(autoscale, head_cpus)}")
            return NodeLaunch(cmd, self._node_env(head_vars), self.address, {"gcs": gcs, "ray_client_server": client})

        log = self.temp_dir / "head.log"
        try:
            proc, _ = start_ray_node(
                launch, log, self.ray_dir, "the Ray head", auth_token=self.auth_token, timeout_s=timeout_s,
                attempts=start_attempts, restarts=self.restarts,
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(self.ray_dir, ignore_errors=True)
            raise
        self.head = LocalNode(proc, log, head_cpus)

    def _node_env(self, extra: dict[str, str]) -> dict[str, str]:
        """A node's environment: :func:`~memprism_ray.cluster.head.head_env` (Ray's settings,
        ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), the cluster's auth, ``extra``."""
        return head_env({**self.auth_env, **extra})

    def driver_env(self) -> dict[str, str]:
        """What a driver joining this cluster needs in its environment (before it imports ``ray``):
        the address, the auth settings, and ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (with it on,
        Ray turns 127.0.0.1 into the interface address, where no node listens)."""
        return {"RAY_ADDRESS": self.address, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **self.auth_env}

    def _autoscaling_config(self, node_types: dict[str, dict[str, object]], head_cpus: float) -> Path:
        """The fake autoscaler's cluster config (the Ray 2.60 wheel lacks the example file
        ``AutoscalingCluster`` reads): the head at ``max_workers: 0``, ``node_types`` from 0."""
        import yaml

        types: dict[str, object] = {
            "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0}
        }
        for name, spec in node_types.items():
            types[name] = {"node_config": {}, "min_workers": 0, **spec}
        config = {
            "cluster_name": "memprism-local",
            "max_workers": sum(int(t.get("max_workers", 1)) for t in node_types.values()),
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": 1,
            "provider": {
                "type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                "disable_launch_config_check": True, "gcs_address": self.address,
            },
            "available_node_types": types,
            "head_node_type": "ray.head.default",
            "auth": {"ssh_user": "ray"},
            "docker": {},
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            **{k: [] for k in ("initialization_commands", "setup_commands", "head_setup_commands",
                               "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")},
        }  # fmt: skip
        path = self.temp_dir / "autoscaling.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        return path

    @property
    def address(self) -> str:
        """The GCS address a driver joins (``RAY_ADDRESS``)."""
        return f"127.0.0.1:{self.port}"

    def add_node(
        self,
        num_cpus: float,
        *,
        private_dirs: tuple[Path, ...] = (),
        resources: dict[str, float] | None = None,
    ) -> LocalNode:
        """Start a worker node and wait until it is up (started again if it dies at start); safe
        to call from several threads at once (each node its own number and log ``node-<k>.log``).
        ``private_dirs``: folders this node sees empty (its own tmpfs; they must exist),
        needing :func:`can_isolate_disks`."""
        import json

        if private_dirs:
            why = can_isolate_disks()
            if why:
                raise RuntimeError(why)
        # Numbered when asked for, not by the nodes already up: the chaos monkey starts its
        # replacements from threads of its own, and two of them counting the nodes at once got
        # the same number and wrote one log file (the second start truncated the first's).
        with self._numbering:
            k = self._numbered
            self._numbered += 1
        mounts = " && ".join(f"mount -t tmpfs tmpfs {shlex.quote(str(Path(d).resolve()))}" for d in private_dirs)

        def launch() -> NodeLaunch:
            ports = self._worker_ports()
            ray_cmd = [
                sys.executable, "-c", LOOPBACK_WORKER, "start", "--block", f"--address={self.address}",
                f"--num-cpus={num_cpus:g}", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                *(f"--{flag}={port}" for flag, port in ports.items()),
            ]  # fmt: skip
            if resources:
                ray_cmd.append(f"--resources={json.dumps(resources)}")
            cmd = ray_cmd
            if private_dirs:
                cmd = ["unshare", "-m", "sh", "-c", f"{mounts} && exec {shlex.join(ray_cmd)}"]
            node_id = secrets.token_hex(28)  # a new one per attempt: a failed attempt's may be dead in the GCS
            # Ray's switch for a chosen node id (its fake multi-node provider sets it the same way).
            env = self._node_env({**self.env, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": node_id})
            return NodeLaunch(cmd, env, self.address, {flag: port for flag, port in ports.items() if port}, node_id)

        log = self.temp_dir / f"node-{k}.log"
        proc, launched = start_ray_node(
            launch, log, self.ray_dir, f"worker node {k}", auth_token=self.auth_token, timeout_s=self.timeout_s,
            attempts=self.start_attempts, restarts=self.restarts,
        )  # fmt: skip
        node = LocalNode(
            proc, log, num_cpus, tuple(Path(d) for d in private_dirs), dict(resources or {}), launched.node_id or ""
        )
        self.nodes.append(node)
        return node

    def _worker_ports(self) -> dict[str, int]:
        """A worker node's port flags: none chosen here, every one Ray's (0: its agents bind a port
        of the kernel's choice themselves, so none can be taken between a check and the bind;
        the dashboard agent's must be said, its default is the fixed 52365)."""
        return {"dashboard-agent-listen-port": 0}

    def shutdown(self) -> None:
        # The worker nodes drain at once, then the head: each `ray start` takes about a second
        # to stop its processes, so stopping them one by one cost a second per node (head + 3
        # nodes, 2 cores, 3 rounds side by side: 4.73 s one by one, 3.28 s together).
        try:
            with ThreadPoolExecutor(max(1, len(self.nodes)), thread_name_prefix="stop-node") as pool:
                stops = [pool.submit(node.stop) for node in self.nodes]  # not map: it cancels the rest on an error
            errors = [e for e in (stop.exception() for stop in stops) if e is not None]
            if errors:  # the first raised, every other one named on it: none dropped
                for other in errors[1:]:
                    errors[0].add_note(f"another worker node's stop failed too: {type(other).__name__}: {other}")
                raise errors[0]
        finally:  # a node whose stop raised leaves neither the head nor the token behind
            self.head.stop()
            # A fake autoscaler's nodes are children of the head's monitor, in its session: swept with it.
            shutil.rmtree(self.ray_dir, ignore_errors=True)  # the auth token with it

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
