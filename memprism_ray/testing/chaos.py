"""Seeded fault schedules for a GRPO job on a :class:`~memprism_ray.testing.local_cluster.LocalCluster`
(issue 40 item 8): a rollout worker, an EnvWorker, a worker node and the Learner's node killed
at chosen points of one run, as machines and processes fail on a real cluster. The suite's
chaos test plays one fixed schedule; ``benchmarks/bench_chaos.py`` plays N random ones.

A fault fires once ``metrics.jsonl`` holds ``after`` GRPO rows, ``delay_s`` later (so it lands
inside the next iteration, while groups play). What it kills is found from the outside, as an
operator would: the actors' process ids and nodes from the run's ``cluster.json``, EnvWorkers
by the process title Ray gives them, among the processes of this cluster's own nodes only (a
second Ray on the machine, another test's or a user's, is never touched: CI once lost a
parallel test's EnvWorker to a schedule that matched titles machine-wide). A killed node is
replaced by a fresh one (its own empty disks), so the run keeps the room it started with.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memprism_ray.cluster.head import kill_if, proc_stat

#: What a schedule can kill.
KINDS = ("rollout_worker", "env_worker", "worker_node", "learner_node")


@dataclass(frozen=True)
class Fault:
    """Kill one ``kind`` once ``after`` iterations are logged, ``delay_s`` seconds later."""

    kind: str
    after: int
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind must be one of {KINDS}, got {self.kind!r}")
        if self.after < 0 or self.delay_s < 0:
            raise ValueError(f"a fault needs after >= 0 and delay_s >= 0, got {self.after}, {self.delay_s}")


def random_schedule(seed: int, iterations: int, kinds: Sequence[str] = KINDS) -> list[Fault]:
    """Each of ``kinds`` once, in a random order, at random iterations of the first
    ``iterations - 1`` (the last leaves room to finish) and a random 0-3 s into the next."""
    rng = random.Random(seed)
    points = sorted(rng.randrange(0, max(1, iterations - 1)) for _ in kinds)
    order = list(kinds)
    rng.shuffle(order)
    return [Fault(k, a, round(rng.uniform(0.0, 3.0), 2)) for k, a in zip(order, points, strict=True)]


def grpo_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The GRPO rows of ``metrics.jsonl`` (a torn last line, being written, left out)."""
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("kind") == "grpo":
            rows.append(row)
    return rows


def _placement(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return {}


def _live(run_dir: Path, role: str) -> list[dict[str, Any]]:
    return [a for a in _placement(run_dir).get("actors", []) if a["role"] == role and a.get("gone") is None]


def titled(prefix: str, sessions: Collection[int]) -> list[int]:
    """Process ids whose command line (Ray's process title) starts with ``prefix``, of the
    sessions ``sessions`` lead (a :class:`LocalNode`'s ``ray start`` leads its node's session:
    Ray's workers run in process groups of their own within it)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if not cmdline.read_bytes().startswith(prefix.encode()):
                continue
        except OSError:
            continue
        stat = proc_stat(cmdline.parent.name)
        if stat is not None and stat[3] in sessions:
            pids.append(int(cmdline.parent.name))
    return sorted(pids)


class ChaosMonkey:
    """Plays a schedule against one job of ``cluster`` writing ``run_dir``. ``add_node()``
    starts a replacement node; ``log`` gets one line per fault."""

    def __init__(
        self, cluster: Any, run_dir: Path, add_node: Callable[[], Any], log: Callable[[str], None] = print
    ) -> None:
        self.cluster = cluster
        self.run_dir = run_dir
        self.add_node = add_node
        self.log = log
        self.done: list[dict[str, Any]] = []
        self._starting: list[threading.Thread] = []

    def play(self, faults: Sequence[Fault], job: Any, timeout_s: float = 600.0) -> list[dict[str, Any]]:
        """Fire ``faults`` in order while ``job`` (a ``Popen``) runs; what was done, in order. A
        fault whose moment the job never reaches (it ended first) is reported as not fired.
        Replacement nodes start in the background (a node takes seconds to start, an iteration
        of a short run about one): the next fault does not wait for them."""
        deadline = time.monotonic() + timeout_s
        try:
            for fault in faults:
                while len(grpo_rows(self.run_dir)) < fault.after and job.poll() is None:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                time.sleep(fault.delay_s)
                if job.poll() is not None or time.monotonic() > deadline:
                    self.done.append({**asdict(fault), "fired": False, "why": "the job ended or timed out first"})
                    continue
                self.done.append({**asdict(fault), **self._fire(fault, deadline)})
                self.log(f"chaos: {self.done[-1]}")
        finally:
            for thread in self._starting:
                thread.join()
        return self.done

    def _fire(self, fault: Fault, deadline: float) -> dict[str, Any]:
        while time.monotonic() < deadline:
            target = self._target(fault.kind)
            if target is not None:
                return {"fired": True, "at": time.time(), **target}
            time.sleep(0.2)  # e.g. no EnvWorker up yet: a replacement still starting
        return {"fired": False, "why": f"no {fault.kind} to kill"}

    def _target(self, kind: str) -> dict[str, Any] | None:
        if kind == "rollout_worker":
            workers = [w for w in _live(self.run_dir, "rollout-worker") if self._node(w["node_id"]) is not None]
            if not workers:
                return None
            kill_if(int(workers[0]["pid"]), self._ours)
            return {"pid": workers[0]["pid"], "name": workers[0]["name"]}
        if kind == "env_worker":
            pids = titled("ray::EnvWorker", self._sessions())
            if not pids:
                return None
            kill_if(pids[0], self._ours)
            return {"pid": pids[0]}
        learners = _live(self.run_dir, "learner")
        if not learners:
            return None
        held = learners[-1]["node_id"]
        nodes = [n for n in self.cluster.nodes if n.alive()]
        pick = [n for n in nodes if (n.node_id == held) == (kind == "learner_node")]
        if not pick:
            return None
        pick[0].kill()
        thread = threading.Thread(target=self.add_node, name="chaos-add-node", daemon=True)
        thread.start()
        self._starting.append(thread)
        return {"node_id": pick[0].node_id}

    def _sessions(self) -> set[int]:
        return {n.process.pid for n in [self.cluster.head, *self.cluster.nodes] if n.alive()}

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` is a process of one of this cluster's live nodes (checked on the
        process a pidfd pins, so a reused pid is never signalled)."""
        stat = proc_stat(pid)
        return stat is not None and stat[3] in self._sessions()

    def _node(self, node_id: str) -> Any:
        return next((n for n in self.cluster.nodes if n.alive() and n.node_id == node_id), None)
