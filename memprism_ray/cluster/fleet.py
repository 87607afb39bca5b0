"""The elastic fleet of GRPO's rollout workers (paper appendix A.3; docs/cluster.md): one
:class:`Seat` per worker, kept by index, a replacement started when a worker hangs, dies or keeps
failing groups, a seat retired past ``rollout.max_restarts`` or for a permanent cause; with
``rollout.num_workers: auto`` a seat whose node went waits for a node (the pending demand an
autoscaler acts on). What the workers play is :mod:`memprism_ray.trainer.rollouts`'s.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from tqdm import tqdm

from memprism_ray.cluster import waits
from memprism_ray.cluster.node_data import NodeDataError, node_label


def say(msg: str) -> None:
    """A fault or progress line, printed through the progress bar (``tqdm.write``) so it is
    neither overwritten by the bar's ``\\r`` nor lost from a captured log."""
    tqdm.write(f"[grpo] {msg}", file=sys.stdout)
    sys.stdout.flush()


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (Ray's task errors carry a traceback below it)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


@dataclass
class Seat:
    """One place in the fleet, kept by index (a worker waiting for a node stays ``starting``:
    that pending demand is what an autoscaler acts on)."""

    index: int
    worker: Any = None
    starting: Any = None
    placed: Any = None
    """ref of the worker's ``placed()``: ready once Ray started it on a node"""
    place: dict[str, Any] | None = None
    generation: int = 0
    replacements: int = 0
    strikes: int = 0
    retired: bool = False
    name: str = ""


class FleetError(RuntimeError):
    """No rollout worker can play: every seat retired, or none placed in time (one line)."""


class RolloutFleet:
    """The job's rollout workers, one per :class:`Seat`, started by ``make_worker(index,
    generation)``; a replacement joins as soon as its ``start()`` answers, mid-iteration too.
    With ``elastic`` (``rollout.num_workers: auto``) a worker that died (with its node, most
    often) does not count towards ``max_replacements``: its seat waits for a node."""

    def __init__(
        self,
        workers: list[Any] | None = None,
        make_worker: Callable[[int, int], Any] | None = None,
        *,
        max_replacements: int = 3,
        ping_timeout_s: float = 300.0,
        elastic: bool = False,
        record: Any = None,
        seat_request: dict[str, float] | None = None,
        nodes_may_join: bool = True,
    ) -> None:
        """``workers``: already started workers (tests, benchmarks); :meth:`start` starts them.
        ``seat_request``: what one seat asks Ray for, named when seats cannot be placed;
        ``nodes_may_join``: False on a Ray this driver started (no node will come to place a
        waiting seat, so a seat that cannot be placed ends the start at once)."""
        self.seats = [Seat(i, worker=w, place={}) for i, w in enumerate(workers or [])]
        self.make_worker = make_worker
        self.max_replacements = max_replacements
        self.ping_timeout_s = ping_timeout_s
        self.elastic = elastic
        self.record = record
        self.seat_request = dict(seat_request or {})
        self.nodes_may_join = nodes_may_join

    @property
    def workers(self) -> list[Any]:
        return [s.worker for s in self.seats]

    @property
    def generation(self) -> list[int]:
        return [s.generation for s in self.seats]

    @property
    def retired(self) -> set[int]:
        return {s.index for s in self.seats if s.retired}

    def active(self) -> list[int]:
        """Seats that are not retired (started or starting)."""
        return [s.index for s in self.seats if not s.retired]

    def ready(self) -> list[int]:
        """Seats whose worker has started."""
        return [s.index for s in self.seats if not s.retired and s.starting is None and s.worker is not None]

    def size(self) -> int:
        return len(self.ready())

    @classmethod
    def start(
        cls, n: int, make_worker: Callable[[int, int], Any], *, log: Callable[[str], None] | None = None, **options: Any
    ) -> RolloutFleet:
        """Start ``n`` workers (``options``: the constructor's). A fixed fleet waits (bounded) until
        each answers, raising a start failure; an elastic one until one does, retiring seats that
        cannot start."""
        fleet = cls(None, make_worker, **options)
        fleet.seats = [Seat(i) for i in range(n)]
        for seat in fleet.seats:
            fleet._launch(seat)
        if not fleet.elastic:
            fleet._wait_placed(n, log)
            places = waits.get([s.starting for s in fleet.seats], fleet.ping_timeout_s, f"start of {n} rollout workers")
            for seat, place in zip(fleet.seats, places, strict=True):
                fleet._started(seat, place)
            return fleet
        fleet.wait_for_one("the start of the fleet", log=log)
        fleet.settle(log=log)  # the other seats already on a node finish loading; the rest join later
        return fleet

    def _wait_placed(self, n: int, log: Callable[[str], None] | None) -> None:
        """Wait until every seat of a fixed fleet is on a node. After :data:`PLACEMENT_NOTICE_S`
        the seats still waiting are named with the resource they lack: the start ends there
        when no node can join, else that line is said and the wait goes on (an autoscaler may
        be adding a node) until ``ping_timeout_s``, which ends it with the same line."""
        t0 = time.monotonic()
        noticed = False
        while True:
            waiting = [s for s in self.seats if s.placed is not None]
            placed, _ = ray.wait([s.placed for s in waiting], num_returns=len(waiting), timeout=0)
            unplaced = len(waiting) - len(placed)
            if not unplaced:
                return
            waited = time.monotonic() - t0
            if waited >= self.ping_timeout_s:
                raise FleetError(f"{self.shortfall(unplaced)}: not placed within {self.ping_timeout_s:g}s; add nodes")
            if waited >= PLACEMENT_NOTICE_S and not noticed:
                noticed = True
                line = self.shortfall(unplaced)
                if not self.nodes_may_join:
                    raise FleetError(f"{line}: lower rollout.num_workers or the seat's CPUs, or run on a cluster")
                if log is not None:
                    log(f"{line}: waiting for a node to join (at most {self.ping_timeout_s:g}s in all)")
            pending = [s.placed for s in waiting if s.placed not in placed]
            ray.wait(pending, num_returns=len(pending), timeout=min(5.0, max(0.1, PLACEMENT_NOTICE_S - waited)))

    def shortfall(self, unplaced: int) -> str:
        """``2 rollout seats wait for a node: each needs 1 CPU; the cluster has 0.5 CPU free on 1 of 2 nodes``."""
        from memprism_ray.cluster.placement_record import free_per_node

        request = {k: v for k, v in self.seat_request.items() if v > 0}
        free = free_per_node()
        need = " and ".join(f"{v:g} {k}" for k, v in request.items()) or SEAT_REQUEST
        lacking = [
            f"{sum(r.get(k, 0.0) for r in free.values()):g} {k} free on "
            f"{sum(r.get(k, 0.0) >= v for r in free.values())} of {len(free)} node(s) with room for one"
            for k, v in request.items()
        ]
        have = "; ".join(lacking) if lacking else f"{dict(ray.available_resources())} free"
        seats = f"{unplaced} rollout seat{'s' if unplaced != 1 else ''}"
        return f"{seats} cannot be placed: each needs {need} ({SEAT_REQUEST}); the cluster has {have}"

    def _launch(self, seat: Seat) -> None:
        assert self.make_worker is not None
        seat.worker = self.make_worker(seat.index, seat.generation)
        seat.placed = seat.worker.placed.remote()
        seat.starting = seat.worker.start.remote()
        seat.place = None

    def settle(self, log: Callable[[str], None] | None = None) -> None:
        """Adopt what started, then wait (at most ``ping_timeout_s``) for the seats that Ray has
        already placed on a node to finish starting, so an iteration uses every worker the
        cluster holds; a seat still waiting for a node joins when it has started."""
        deadline = time.monotonic() + self.ping_timeout_s
        while True:
            self.poll(log=log)
            starting = [s for s in self.seats if s.starting is not None and not s.retired and s.placed is not None]
            if not starting:
                return
            placed, _ = ray.wait([s.placed for s in starting], num_returns=len(starting), timeout=0)
            loading = [s.starting for s in starting if s.placed in placed]
            left = deadline - time.monotonic()
            if not loading or left <= 0:
                return
            ray.wait(loading, num_returns=1, timeout=min(5.0, left))

    def _started(self, seat: Seat, place: dict[str, Any]) -> None:
        seat.starting = None
        seat.place = dict(place)
        if self.record is not None:
            seat.name = place.get("actor") or ""
            self.record.actor("rollout-worker", place)

    def poll(self, log: Callable[[str], None] | None = None) -> list[tuple[Seat, BaseException]]:
        """Adopt the seats whose worker started (without waiting), replace or retire those whose
        start failed; the failures (seat, error)."""
        starting = {s.starting: s for s in self.seats if s.starting is not None and not s.retired}
        if not starting:
            return []
        done, _ = ray.wait(list(starting), num_returns=len(starting), timeout=0)
        failures = []
        for ref in done:
            seat = starting[ref]
            try:
                place = ray.get(ref, timeout=60)
            except Exception as exc:  # its data missing on its node, its process died starting, ...
                cause = getattr(exc, "cause", None) or exc
                failures.append((seat, cause))
                ray.kill(seat.worker)
                seat.starting = None
                seat.worker = None
                # A permanent cause (data missing on the node, a refused member, a digest
                # mismatch) would refuse the seat again: retired; a transient one (a fetch that
                # timed out, the unpack lock) is retried like any failed start.
                retire = isinstance(cause, NodeDataError) and cause.permanent
                self._replace(seat, f"did not start: {one_line(cause)}", retire=retire, log=log)
                continue
            self._started(seat, place)
            if log is not None and seat.generation:
                log(f"rollout worker {seat.index} started again on {node_label(place)} (generation {seat.generation})")
        return failures

    def replace(self, index: int, reason: str, *, died: bool = False) -> bool:
        """Kill worker ``index`` (hung, dead, failing) and start a fresh one in its place; False
        when the seat is retired instead. ``died``: its process or node died, which an elastic
        fleet does not count against the seat."""
        seat = self.seats[index]
        if seat.worker is not None:
            ray.kill(seat.worker)  # also ends its EnvWorkers (owned by its process)
        if self.record is not None and seat.name:
            self.record.gone(seat.name, reason)
        seat.worker = None
        seat.starting = None
        seat.strikes = 0
        return self._replace(seat, reason, counts=not (died and self.elastic), log=say)

    def _replace(
        self, seat: Seat, reason: str, *, retire: bool = False, counts: bool = True, log: Callable[[str], None] | None
    ) -> bool:
        if retire or self.make_worker is None or (counts and seat.replacements >= self.max_replacements):
            seat.retired = True
            if log is not None:
                log(f"rollout worker {seat.index} retired after {seat.replacements} replacement(s): {reason}")
            return False
        if counts:
            seat.replacements += 1
        seat.generation += 1
        if log is not None:
            log(f"rollout worker {seat.index} replaced (generation {seat.generation}): {reason}")
        self._launch(seat)
        return True

    def wait_for_one(
        self, what: str, watch: Callable[[], None] | None = None, log: Callable[[str], None] | None = say
    ) -> None:
        """Block until some seat has a started worker (at most ``ping_timeout_s``). With no seat
        left to wait for, the first start failure is raised as it is, else a ``FleetError``, as
        for a wait that runs out. ``watch`` is called every few seconds and may raise (a lost
        Learner ends the wait at once)."""
        deadline = time.monotonic() + self.ping_timeout_s
        first_error: BaseException | None = None
        while not self.ready():
            if watch is not None:
                watch()
            starting = [s.starting for s in self.seats if s.starting is not None and not s.retired]
            if not starting:
                raise first_error or FleetError(
                    f"no rollout worker left for {what}: all {len(self.seats)} were retired after repeated failures "
                    f"(rollout.max_restarts={self.max_replacements}); see the [grpo] lines above"
                )
            left = deadline - time.monotonic()
            unplaced = sum(1 for s in self.seats if s.starting is not None and not s.retired)
            if left <= 0 or (not self.nodes_may_join and self.ping_timeout_s - left >= PLACEMENT_NOTICE_S):
                raise FleetError(
                    f"no rollout worker could start within {self.ping_timeout_s - max(0.0, left):.0f}s for {what}: "
                    f"{self.shortfall(unplaced)}; add nodes (or let the autoscaler)"
                )
            ray.wait(starting, num_returns=1, timeout=min(5.0, left))
            for _seat, exc in self.poll(log=log):
                first_error = first_error or exc

    def kill_all(self) -> None:
        for seat in self.seats:
            if seat.worker is not None:
                ray.kill(seat.worker)


#: What one rollout seat asks Ray for, in the refusal when none can be placed.
SEAT_REQUEST = "rollout.rollout_cpus + env_workers_per_rollout x env_cpus"

#: Seconds after which seats still waiting for a node are named with what they lack: Ray
#: places an actor that fits in about a second here (docs/cluster.md), a minute is long enough
#: that a seat still waiting does not fit, and short enough not to leave a user in silence.
PLACEMENT_NOTICE_S = 60.0
