"""A Ray cluster of several nodes on this machine (issue 34), for the multi-node tests and
``benchmarks/bench_scaling.py``: a head and worker nodes started with ``ray start``; as root,
a worker node starts in its own mount namespace with an empty tmpfs over each private folder,
as on separate machines. Measured here with Ray 2.60: a head of 0 CPUs up in 3 s, a worker node
in 5-6 s; two nodes started at the same moment can time out, so :meth:`LocalCluster.add_node`
waits for each. Several nodes listen on the machine's interface address (Ray refuses a second
node while ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``): keep such a machine behind its firewall.
Every node is stopped by its process group, never with ``ray stop`` (every Ray process of the
machine, other tests' included).
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from memprism_ray.local.head import free_ports, head_env, kill_group, ray_bin, spawn, stop_group


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


def _cluster_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = head_env(extra)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # =0 forbids a second node (see the module docstring)
    return env


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
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group: the raylet and every worker of the node die at once, as when
        a machine is lost or a preemptible node is taken back."""
        kill_group(self.process)

    def stop(self, timeout: float = 30.0) -> None:
        """:func:`~memprism_ray.local.head.stop_group`: SIGTERM to ``ray start``, then a SIGKILL sweep."""
        stop_group(self.process, timeout)


def _start(cmd: list[str], log_path: Path, env: dict[str, str], what: str, timeout_s: float) -> subprocess.Popen:
    proc = spawn(cmd, log_path, env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if "Ray runtime started" in text:
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited while starting; see {log_path}:\n{text[-1500:]}")
        time.sleep(0.3)
    kill_group(proc)
    raise TimeoutError(f"{what} did not start within {timeout_s:.0f}s; see {log_path}")


class LocalCluster:
    """A head (``head_cpus`` CPUs: 0, as docs/cluster.md prescribes) and worker nodes added with
    :meth:`add_node`. ``env``: variables for every node. ``autoscale``: worker node types
    (``{name: {"resources": {...}, "max_workers": n}}``) for Ray's fake multi-node autoscaler,
    whose nodes are processes of the head's monitor, on the machine's own disk."""

    def __init__(
        self,
        temp_dir: Path,
        *,
        head_cpus: float = 0,
        env: dict[str, str] | None = None,
        autoscale: dict[str, dict[str, object]] | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self.temp_dir = Path(temp_dir).resolve()
        # Ray's session folder holds Unix sockets, whose paths may not exceed 107 bytes: a short
        # folder of its own under /tmp, whatever temp_dir (a pytest tmp path is too long).
        self.ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        self.env = dict(env or {})
        self.port, client, agent, runtime_env, metrics = free_ports(None, None, None, None, None)
        self.timeout_s = timeout_s
        self.nodes: list[LocalNode] = []
        cmd = [
            ray_bin(), "start", "--head", "--block", f"--port={self.port}", f"--num-cpus={head_cpus:g}",
            "--node-ip-address=127.0.0.1", f"--temp-dir={self.ray_dir}", "--disable-usage-stats",
            f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
            f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
            "--include-dashboard=false",
        ]  # fmt: skip
        head_vars = dict(self.env)
        if autoscale is not None:
            cmd.append(f"--autoscaling-config={self._autoscaling_config(autoscale, head_cpus)}")
            head_vars |= {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
        self.head = LocalNode(
            _start(cmd, self.temp_dir / "head.log", _cluster_env(head_vars), "the Ray head", timeout_s),
            self.temp_dir / "head.log",
            head_cpus,
        )

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
        """Start a worker node and wait until it runs. ``private_dirs``: folders this node sees
        empty (its own tmpfs; they must exist), needing :func:`can_isolate_disks`."""
        import json

        k = len(self.nodes)
        agent, runtime_env, metrics = free_ports(None, None, None)
        ray_cmd = [
            ray_bin(), "start", "--block", f"--address={self.address}", f"--num-cpus={num_cpus:g}",
            "--node-ip-address=127.0.0.1", "--disable-usage-stats", f"--dashboard-agent-listen-port={agent}",
            f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
        ]  # fmt: skip
        if resources:
            ray_cmd.append(f"--resources={json.dumps(resources)}")
        cmd = ray_cmd
        if private_dirs:
            why = can_isolate_disks()
            if why:
                raise RuntimeError(why)
            mounts = " && ".join(f"mount -t tmpfs tmpfs {shlex.quote(str(Path(d).resolve()))}" for d in private_dirs)
            cmd = ["unshare", "-m", "sh", "-c", f"{mounts} && exec {shlex.join(ray_cmd)}"]
        node_id = secrets.token_hex(28)
        # Ray's own switch for a chosen node id (its fake multi-node provider sets it the same way).
        env = _cluster_env({**self.env, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": node_id})
        node = LocalNode(
            _start(cmd, self.temp_dir / f"node-{k}.log", env, f"worker node {k}", self.timeout_s),
            self.temp_dir / f"node-{k}.log",
            num_cpus,
            tuple(Path(d) for d in private_dirs),
            dict(resources or {}),
            node_id,
        )
        self.nodes.append(node)
        return node

    def shutdown(self) -> None:
        for node in [*self.nodes, self.head]:
            node.stop()
        # A fake autoscaler's nodes are children of the head's monitor, in its session: swept with it.
        shutil.rmtree(self.ray_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
