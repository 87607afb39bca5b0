"""The multi-node tests' rig (issue 34 item 5): a Ray cluster of several nodes on this machine,
a head of 0 CPUs (docs/cluster.md) and worker nodes of 1 CPU, each with disks of its own for
the memprism cache, the tests' corpus cache and the run directories (empty tmpfs in its own
mount namespace), so an actor sees nothing the driver built unless the job brings it there.
The jobs run as users run them: ``python jobs/<job>.py`` joining the cluster through
``RAY_ADDRESS``, with the cluster's token (``LocalCluster.driver_env``); every listener and
connection of the cluster is on 127.0.0.1.

Node failures are detected within about a second here (``RAY_health_check_*`` on the head:
Ray's default is 15 s), so the tests see a lost node as lost when its group is re-run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Node-failure detection in about a second (GCS health checks of the raylets).
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "300", "RAY_health_check_failure_threshold": "3"}


@dataclass
class ClusterRig:
    """The running cluster and the folders its worker nodes do not share with the driver."""

    cluster: object
    cache: Path
    runs: Path
    private: tuple[Path, ...]

    def add_node(self, num_cpus: float = 1) -> object:
        return self.cluster.add_node(num_cpus, private_dirs=self.private)

    def ensure_nodes(self, n: int) -> None:
        """At least ``n`` live worker nodes (a test before may have killed some)."""
        alive = [node for node in self.cluster.nodes if node.alive()]
        for _ in range(n - len(alive)):
            self.add_node()

    def env(self) -> dict[str, str]:
        """A driver's environment: the cluster's (address, token auth, loopback; ``driver_env``)."""
        env = dict(os.environ)
        env.update(
            {
                **self.cluster.driver_env(),
                "MEMPRISM_CACHE": str(self.cache),
                "RAY_USAGE_STATS_ENABLED": "0",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            }
        )
        return env

    def start_job(self, script: str, args: list[str], log: Path) -> subprocess.Popen:
        """``python jobs/<script> ARGS`` as a driver of this cluster, output to ``log``."""
        fh = log.open("w")
        return subprocess.Popen(
            [sys.executable, f"jobs/{script}", *args], cwd=ROOT, env=self.env(), stdout=fh, stderr=subprocess.STDOUT
        )

    def run_job(self, script: str, args: list[str], log: Path, timeout_s: float = 600) -> tuple[int, str]:
        proc = self.start_job(script, args, log)
        proc.wait(timeout=timeout_s)
        return proc.returncode, log.read_text()


def wait_for(check: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.2) -> object:
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    pytest.fail(f"{what}: not within {timeout_s:.0f}s")


def placement(run: Path) -> dict:
    """``cluster.json`` of a run ({} until the driver wrote it)."""
    try:
        return json.loads((run / "cluster.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def grpo_rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "grpo"]
