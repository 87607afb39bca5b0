"""The package's cluster (:mod:`cluster_rig`): started once for every multi-node test, skipped
with the reason where worker nodes cannot get disks of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_rig import FAST_HEALTH_CHECKS, ClusterRig


@pytest.fixture(scope="package")
def rig(tmp_path_factory: pytest.TempPathFactory, memprism_tiny_corpus: Path, memprism_test_cache: Path):
    from memprism_ray.testing.local_cluster import LocalCluster, can_isolate_disks

    why = can_isolate_disks()
    if why:
        pytest.skip(f"the multi-node tests need worker nodes with disks of their own: {why}")
    base = tmp_path_factory.mktemp("cluster")
    cache, runs = base / "cache", base / "runs"
    for d in (cache, runs):
        d.mkdir()
    private = (cache, runs, memprism_test_cache)
    cluster = LocalCluster(base / "ray", env={"MEMPRISM_CACHE": str(cache), **FAST_HEALTH_CHECKS})
    try:
        for _ in range(2):
            cluster.add_node(1, private_dirs=private)
        yield ClusterRig(cluster, cache, runs, private)
    finally:
        cluster.shutdown()
