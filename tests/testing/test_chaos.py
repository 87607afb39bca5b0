"""The chaos monkey kills only what belongs to its own cluster (memprism_ray/testing/chaos.py)."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from memprism_ray.cluster.head import kill_group, proc_stat
from memprism_ray.testing.chaos import ChaosMonkey, titled

TITLE = "ray::EnvWorker"


@dataclass
class _Node:
    process: subprocess.Popen

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class _Cluster:
    head: _Node
    nodes: list[_Node]


def _titled_process(new_session: bool) -> subprocess.Popen:
    """A process whose command line starts as Ray titles an EnvWorker; with ``new_session``
    it leads a session of its own (as a node's ``ray start`` does), else the title runs in
    the session of a leader that waits on it."""
    if new_session:
        return subprocess.Popen(["bash", "-c", f"exec -a {TITLE} sleep 60"], start_new_session=True)
    return subprocess.Popen(["bash", "-c", f"(exec -a {TITLE} sleep 60) & sleep 60"], start_new_session=True)


def _wait_titled(sessions: set[int], n: int) -> list[int]:
    for _ in range(100):
        pids = titled(TITLE, sessions)
        if len(pids) >= n:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"no {TITLE} process appeared in {sessions}")


def test_an_env_worker_of_another_ray_on_the_machine_is_never_killed(tmp_path: Path) -> None:
    node = _titled_process(new_session=False)  # our cluster's node: an EnvWorker in its session
    stray = _titled_process(new_session=True)  # a second Ray's EnvWorker (another test's, a user's)
    try:
        ours = _wait_titled({node.pid}, 1)
        assert stray.pid not in ours and len(ours) == 1
        assert proc_stat(ours[0])[3] == node.pid  # type: ignore[index]
        head = _Node(subprocess.Popen(["sleep", "60"], start_new_session=True))
        monkey = ChaosMonkey(_Cluster(head, [_Node(node)]), tmp_path, add_node=lambda: None, log=lambda _: None)
        fired = monkey._target("env_worker")
        assert fired == {"pid": ours[0]}
        for _ in range(100):
            stat = proc_stat(ours[0])  # read once: its parent may reap it between two reads
            if stat is None or stat[1] in ("Z", "X"):
                break
            time.sleep(0.05)
        else:
            pytest.fail("our EnvWorker was not killed")
        assert stray.poll() is None, "the other Ray's EnvWorker was killed"
        assert not monkey._ours(stray.pid) and monkey._ours(node.pid)
        kill_group(head.process)
    finally:
        kill_group(node)
        kill_group(stray)
