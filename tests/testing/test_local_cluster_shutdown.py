"""``LocalCluster.shutdown`` without starting Ray: its worker nodes are stopped together, not one
after another, and the head is stopped and the token removed even when a node's stop raises.
The real cluster's shutdown is exercised by every test of tests/cluster."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from memprism_ray.testing.local_cluster import LocalCluster


class _Node:
    def __init__(self, log: list[str], name: str, barrier: threading.Barrier | None, fail: bool = False) -> None:
        self.log, self.name, self.barrier, self.fail = log, name, barrier, fail

    def stop(self, timeout: float = 30.0) -> None:
        if self.barrier is not None:
            self.barrier.wait(timeout=10)  # breaks (raises) unless every worker node is stopping at once
        self.log.append(self.name)
        if self.fail:
            raise OSError(f"{self.name} could not be stopped")


def _cluster(tmp_path: Path, nodes: list[_Node], head: _Node) -> LocalCluster:
    cluster = LocalCluster.__new__(LocalCluster)  # the fields shutdown reads, no Ray started
    cluster.nodes, cluster.head = nodes, head
    cluster.ray_dir = tmp_path / "ray"
    cluster.ray_dir.mkdir()
    (cluster.ray_dir / "auth_token").write_text("secret")
    return cluster


def test_worker_nodes_stop_together_then_the_head(tmp_path: Path) -> None:
    log: list[str] = []
    together = threading.Barrier(3)
    cluster = _cluster(tmp_path, [_Node(log, f"node-{k}", together) for k in range(3)], _Node(log, "head", None))
    t0 = time.monotonic()
    cluster.shutdown()
    assert time.monotonic() - t0 < 10
    assert sorted(log[:3]) == ["node-0", "node-1", "node-2"] and log[3] == "head"
    assert not cluster.ray_dir.exists()


def test_a_node_whose_stop_raises_leaves_neither_the_head_nor_the_token(tmp_path: Path) -> None:
    log: list[str] = []
    nodes = [_Node(log, "node-0", None, fail=True), _Node(log, "node-1", None)]
    cluster = _cluster(tmp_path, nodes, _Node(log, "head", None))
    with pytest.raises(OSError, match="node-0 could not be stopped"):
        cluster.shutdown()
    assert sorted(log) == ["head", "node-0", "node-1"] and log[-1] == "head"
    assert not cluster.ray_dir.exists()


def test_every_node_whose_stop_raises_is_named(tmp_path: Path) -> None:
    log: list[str] = []
    nodes = [_Node(log, f"node-{k}", None, fail=k != 1) for k in range(3)]
    cluster = _cluster(tmp_path, nodes, _Node(log, "head", None))
    with pytest.raises(OSError) as raised:
        cluster.shutdown()
    said = "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
    assert "node-0 could not be stopped" in said and "node-2 could not be stopped" in said
    assert sorted(log) == ["head", "node-0", "node-1", "node-2"] and log[-1] == "head"
