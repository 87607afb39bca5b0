"""The sessions of the Serve app, kept by one deployment (one replica) beside the app's
replicas: a replica of the app that dies loses nothing (the next request, on its replacement
or another replica, reads the session back); every replica sees the same sessions, so Serve
may route each request anywhere.

A step is kept as its raw event and Phi's event (JSON-able dicts, :meth:`Session.records
<memprism_ray.memory.Session.records>`), so a replica rebuilds a session without calling Phi
again. An append names the step count it extends: two replicas recording the same session at
once cannot interleave (the second one is refused and the client told to retry). The methods
are coroutines without an ``await``: Serve runs them one at a time on the replica's loop.

The store keeps the sessions in its memory: were its own process lost, its sessions would be
too (Serve starts it again, empty; a client then gets 404 and opens the session again)."""

from __future__ import annotations

from typing import Any

from ray import serve


@serve.deployment(
    num_replicas=1,
    max_ongoing_requests=1000,
    ray_actor_options={"num_cpus": 0},
    logging_config={"enable_access_log": False},  # as the app's replicas (app.py)
)
class SessionStore:
    """Sessions by id: goal, task type and recorded steps. At most ``max_sessions`` open."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.sessions: dict[str, dict[str, Any]] = {}

    async def create(self, session_id: str, goal: str, task_type: str) -> str:
        """``"ok"``, ``"exists"`` or ``"full"``."""
        if session_id in self.sessions:
            return "exists"
        if len(self.sessions) >= self.max_sessions:
            return "full"
        self.sessions[session_id] = {"goal": goal, "task_type": task_type, "records": []}
        return "ok"

    async def read(self, session_id: str, since: int = 0) -> dict[str, Any] | None:
        """The session's goal, task type, step count and its steps from ``since`` on; None if unknown."""
        s = self.sessions.get(session_id)
        if s is None:
            return None
        return {
            "goal": s["goal"],
            "task_type": s["task_type"],
            "steps": len(s["records"]),
            "records": s["records"][since:],
        }

    async def append(self, session_id: str, steps: int, records: list[dict[str, Any]]) -> int | None:
        """Append ``records`` to a session that holds ``steps`` steps: its new count; -1 when it
        holds another count (recorded meanwhile elsewhere); None if unknown."""
        s = self.sessions.get(session_id)
        if s is None:
            return None
        if len(s["records"]) != steps:
            return -1
        s["records"].extend(records)
        return len(s["records"])

    async def close(self, session_id: str) -> bool:
        return self.sessions.pop(session_id, None) is not None

    async def count(self) -> int:
        return len(self.sessions)
