"""``LocalCluster.add_node`` called from several threads at once (the chaos monkey starts each
replacement node from a thread of its own), without starting Ray: every node gets its own
number and log file. The real starts are exercised by tests/cluster."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from memprism_ray.testing import local_cluster
from memprism_ray.testing.local_cluster import LocalCluster


def test_nodes_added_from_threads_at_once_get_their_own_numbers_and_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs: list[Path] = []
    both_starting = threading.Barrier(2)

    def start_ray_node(launch, log_path: Path, temp_dir: Path, what: str, **_: object):
        node = launch()
        if what != "the Ray head":
            logs.append(log_path)
            if len(logs) <= 2:
                both_starting.wait(timeout=10)  # the two threads' starts in flight before either returns
        proc = subprocess.Popen(["true"])  # a process that has exited, as LocalNode holds one
        proc.wait()
        return proc, node

    monkeypatch.setattr(local_cluster, "start_ray_node", start_ray_node)
    cluster = LocalCluster(tmp_path, auth=False)
    try:
        threads = [threading.Thread(target=cluster.add_node, args=(1,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert sorted(p.name for p in logs) == ["node-0.log", "node-1.log"]
        assert sorted(n.log_path.name for n in cluster.nodes) == ["node-0.log", "node-1.log"]
        cluster.add_node(1)  # the next one after them
        assert cluster.nodes[-1].log_path.name == "node-2.log"
    finally:
        shutil.rmtree(cluster.ray_dir, ignore_errors=True)
