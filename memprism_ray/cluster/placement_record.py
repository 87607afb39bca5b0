"""Where each actor of a run ran: ``<run>/cluster.json`` (issue 34, "placement you can see";
docs/cluster.md), written by the driver whenever the placement changes. A replaced actor keeps
its entry; its successor gets a new one under the same role.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import ray

from memprism_ray.io_atomic import atomic_write_text


class PlacementRecord:
    """The run's ``cluster.json``; every change is written at once (atomic replace)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.actors: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        if path is not None and path.exists():  # a resumed run continues its record
            try:
                old = json.loads(path.read_text())
                self.actors, self.events = list(old.get("actors", [])), list(old.get("events", []))
            except (OSError, ValueError):
                pass  # unreadable: started afresh (the file is only a record)
        for entry in self.actors:  # whatever the last driver left running is gone with it
            if entry.get("gone") is None:
                entry["gone"] = {"time": time.time(), "why": "its driver ended"}
        self.events.append({"event": "driver", "time": time.time()})

    def actor(self, role: str, place: dict[str, Any]) -> None:
        """An actor started as ``role`` at ``place`` (its ``node_place()``)."""
        self.actors.append(
            {"role": role, "name": place.get("actor") or role,
             **{k: place[k] for k in ("node_id", "node_ip", "pid") if k in place}, "started": time.time(), "gone": None}
        )  # fmt: skip
        self.write()

    def gone(self, name: str, why: str) -> None:
        """The latest actor called ``name`` is gone (killed, lost with its node, retired)."""
        for entry in reversed(self.actors):
            if entry["name"] == name and entry["gone"] is None:
                entry["gone"] = {"time": time.time(), "why": why}
                break
        self.write()

    def event(self, kind: str, **fields: Any) -> None:
        """A fleet change (``shrunk``, ``grew``, ``node_lost``) with its iteration and sizes."""
        self.events.append({"event": kind, "time": time.time(), **fields})
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        doc = {"nodes": nodes(), "actors": self.actors, "events": self.events}
        atomic_write_text(self.path, json.dumps(doc, indent=1, default=str) + "\n", overwrite=True)


def nodes() -> list[dict[str, Any]]:
    """The cluster's nodes as Ray lists them (dead ones included, marked)."""
    out = []
    for n in ray.nodes():
        res = {k: v for k, v in n.get("Resources", {}).items() if not k.startswith("node:")}
        out.append(
            {"node_id": n["NodeID"], "node_ip": n.get("NodeManagerAddress", ""), "alive": bool(n.get("Alive")),
             "resources": res}
        )  # fmt: skip
    return out


def node_alive(node_id: str) -> bool:
    """Whether the node ``node_id`` is alive (False for an unknown id)."""
    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())


def free_per_node() -> dict[str, dict[str, float]]:
    """Free resources of each live node (``node:`` address entries left out)."""
    from ray._private.state import available_resources_per_node

    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    return {
        node: {k: float(v) for k, v in res.items() if not k.startswith("node:")}
        for node, res in available_resources_per_node().items()
        if node in alive
    }


@ray.remote(num_cpus=0, max_retries=0)
def _probe() -> str:
    return ray.get_runtime_context().get_node_id()


def node_lost(node_id: str, timeout_s: float = 45.0) -> bool:
    """Whether the node ``node_id`` is gone. A worker's death is seen at once, but Ray marks its
    node dead only after its health checks fail (about 15 s by default: a short iteration used
    to end first and count a lost node's workers as merely replaced). So a node Ray still lists
    as alive is asked to run a probe: one that runs it is alive; for one that does not, Ray's
    verdict is awaited (at most ``timeout_s``, only in an iteration in which a worker died)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not node_alive(node_id):
        return True
    probe = _probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    deadline = time.monotonic() + timeout_s
    pending = [probe]
    while time.monotonic() < deadline:
        done, pending = ray.wait(pending, timeout=1.0) if pending else ([], [])
        if done:
            try:
                ray.get(probe)
                return False  # it ran there
            except Exception:  # unschedulable: the node is going; Ray's verdict decides
                pass
        if not node_alive(node_id):
            return True
        if not pending:
            time.sleep(0.2)
    return False
