"""MemPrism over HTTP/JSON on Ray Serve (issue 43): the :mod:`memprism_ray.memory` operations for
agents written in any language. Start it with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 serve run
clusters/serve_memory.yaml`` (the variable: a local Ray on loopback; docs/memory.md) (or
``serve run memprism_ray.serve.app:build checkpoint=DIR``); on 127.0.0.1:8000 by default.

=====================================  =======================================================
``POST /sessions``                     ``{"goal", "session_id"?, "task_type"?}`` -> ``{"session_id"}``
``POST /sessions/{id}/events``         ``{"observation", "action", "feedback", "reward"?, "image"?}``
                                       (``image``: base64 PNG) -> ``{"steps"}``
``GET|POST /sessions/{id}/view``       ``?observation=...&steps=N`` or ``{"observation", "steps"?}`` ->
                                       ``{"view", "index", "probability", "png" (base64), "text",
                                       "visual_tokens", "text_tokens", "replica", ...}``
``GET|POST /sessions/{id}/view.png``   the page itself (``image/png``; the view in ``X-MemPrism-*``)
``DELETE /sessions/{id}``              close the session
``GET /healthz``                       ``{"sessions", "replica", "cached", "torch_threads"}``
=====================================  =======================================================

Bad input is a 4xx with ``{"detail": one line}``: 400 a malformed body, field or an unknown field,
401 a missing or wrong token (``Authorization: Bearer``, when the app has one), 404 an unknown
session, 409 a session id taken, a view's ``steps`` beyond the session's, or a record that other
requests beat on other replicas three times (retry),
413 a session at its step limit, 429 the session limit. Sessions live in
:class:`~memprism_ray.serve.store.SessionStore`, outside the replicas, so Serve's autoscaling
adds and removes replicas freely and a replica that dies loses nothing (docs/memory.md "As a
service").
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations at run time.
import asyncio
import base64
import binascii
import hmac
import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from ray import serve

from memprism_ray.config_tree import Seed, field, from_dict
from memprism_ray.memory import MAX_EVENTS, Memory, MemoryView, Session, SessionFull
from memprism_ray.registry import DEFAULT_BENCHMARK
from memprism_ray.serve.store import SessionStore

#: Where a client's own session ids are allowed (they appear in URLs).
SESSION_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
#: Times a record is tried on a fresh copy of its session when another replica recorded it meanwhile.
RECORD_ATTEMPTS = 3
#: On every view: a GET's URL may be asked again after more steps were recorded, and a cache
#: between the agent and the app must not answer it with the older view.
NO_STORE = {"Cache-Control": "no-store"}
#: The token variable read when ``token`` is not given.
TOKEN_ENV = "MEMPRISM_SERVE_TOKEN"


@dataclass
class ServeSettings:
    """The app's settings (``serve run ... key=value`` or the config file's ``args``)."""

    benchmark: str = field(DEFAULT_BENCHMARK, help="whose Phi records the steps (its rules; registry name)")
    checkpoint: str = field("", help="Router checkpoint whose views the app serves")
    view: str = field("", help="a fixed view instead of a Router (fixed:TemporalTrace, fixed:TAU/WINDOW/FILTER/GAMMA)")
    marginal: str = field("", help="views drawn from this marginal instead (a JSON list file or a report.json)")
    token: str = field("", help=f"bearer token every request must carry ('' : ${TOKEN_ENV}, else none)")
    max_sessions: int = field(10_000, help="sessions open at once (429 past it)")
    max_events: int = field(MAX_EVENTS, help="steps one session records (413 past it)")
    cached_sessions: int = field(
        1024, help="sessions a replica keeps in memory, least recently used dropped (the store keeps them all)"
    )
    seed: Seed = field(0, help="seed of a marginal's draws")

    def __post_init__(self) -> None:
        if sum(bool(x) for x in (self.checkpoint, self.view, self.marginal)) != 1:
            raise ValueError("serve: give exactly one of checkpoint, view or marginal")
        if self.max_sessions < 1 or self.max_events < 1 or self.cached_sessions < 1:
            raise ValueError("serve: max_sessions, max_events and cached_sessions must be >= 1")


api = FastAPI(title="MemPrism memory", docs_url=None, redoc_url=None)


class SessionCache:
    """The sessions a replica holds, the least recently used dropped past ``size``: a session
    closed through another replica, or one a client left open, would otherwise stay in every
    replica that saw it. The store keeps every session; a dropped one is read back on its next
    request."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_id: str) -> Session | None:
        session = self.sessions.get(session_id)
        if session is not None:
            self.sessions.move_to_end(session_id)
        return session

    def put(self, session: Session) -> list[str]:
        """Keep ``session``; the ids dropped to make room."""
        self.sessions[session.id] = session
        self.sessions.move_to_end(session.id)
        dropped = []
        while len(self.sessions) > self.size:
            dropped.append(self.sessions.popitem(last=False)[0])
        return dropped

    def pop(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)


def _check_fields(given: Mapping[str, Any], required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    """A 400 naming the missing fields, or the unknown ones (a misspelt ``reward`` was recorded
    as 0, a misspelt ``steps`` ignored)."""
    missing = [k for k in required if k not in given]
    if missing:
        raise HTTPException(400, f"missing field(s): {', '.join(missing)}")
    unknown = [str(k)[:40] for k in given if k not in required and k not in optional]
    if unknown:
        raise HTTPException(
            400, f"unknown field(s): {', '.join(unknown[:5])}; this request takes {', '.join(required + optional)}"
        )


def _view_json(v: MemoryView, replica: str) -> dict[str, Any]:
    return {
        "replica": replica,
        "session_id": v.session_id,
        "step": v.step,
        "view": v.view,
        "index": v.index,
        "probability": v.probability,
        "png": base64.b64encode(v.png).decode() if v.png is not None else None,
        "text": v.text,
        "width": v.width,
        "height": v.height,
        "visual_tokens": v.visual_tokens,
        "text_tokens": v.text_tokens,
    }


@serve.deployment(
    max_ongoing_requests=16,
    autoscaling_config={"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 4},
    ray_actor_options={"num_cpus": 0.5},
    # No access-log line per request (Serve writes and flushes one per request by default):
    # 2 ms of a 23 ms view at one client (bench_serve.py's episode, measured side by side).
    # `logging_config: {enable_access_log: true}` under the deployment in the config file
    # turns it back on.
    logging_config={"enable_access_log": False},
)
@serve.ingress(api)
class MemoryServer:
    """One replica: a :class:`Memory` (the Router loaded once) and a cache of the sessions it has
    read from the store, brought up to date with every request."""

    def __init__(self, settings: dict[str, Any], store: Any) -> None:
        from memprism_ray.benchmark import get_benchmark

        self.settings = ServeSettings(**settings)
        s = self.settings
        self.token = s.token or os.environ.get(TOKEN_ENV, "")
        self.memory = Memory(
            get_benchmark(s.benchmark).phi_spec(),
            checkpoint=s.checkpoint or None,
            view=s.view or None,
            marginal=s.marginal or None,
            max_events=s.max_events,
            seed=s.seed,
        )
        self.store = store
        self.replica = serve.get_replica_context().replica_id.unique_id  # in answers: who computed a view
        self.cache = SessionCache(s.cached_sessions)
        # One request at a time per session on this replica: a Session is not thread-safe, and
        # two records of one session must not both extend the same cached copy.
        self.locks: dict[str, asyncio.Lock] = {}

    def _remember(self, session: Session) -> None:
        for gone in self.cache.put(session):
            lock = self.locks.get(gone)
            if lock is not None and not lock.locked():
                del self.locks[gone]

    def _lock(self, session_id: str) -> asyncio.Lock:
        return self.locks.setdefault(session_id, asyncio.Lock())

    def _check(self, request: Request) -> None:
        if self.token:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer ...)")

    async def _body(self, request: Request, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, Any]:
        self._check(request)
        try:
            body = await request.json()
        except ValueError:
            raise HTTPException(400, "the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise HTTPException(400, "the body must be a JSON object")
        _check_fields(body, required, optional)
        return body

    async def _session(self, session_id: str, steps: Any = None) -> Session:
        """The session as the store holds it now (the cache extended by what others recorded).
        ``steps``: the count the client says it recorded; a cached copy that holds it is current
        (the client recorded nothing since elsewhere), and the store is not asked."""
        have = self.cache.get(session_id)
        if have is not None and steps is not None and steps == have.steps:
            return have
        got = await self.store.read.remote(session_id, have.steps if have is not None else 0)
        if got is not None and have is not None and got["steps"] < have.steps:
            have, got = None, await self.store.read.remote(session_id, 0)  # closed and opened again: all of it
        if got is None:
            self.cache.pop(session_id)
            raise HTTPException(404, f"no session {session_id!r} (closed, or never created)")
        if have is None:  # one read: the session as the store holds it, not a second read from step 0
            have = self.memory.restore(session_id, got["goal"], got["records"], got["task_type"])
        else:
            have.extend(got["records"])
        self._remember(have)
        return have

    @api.get("/healthz")
    async def healthz(self) -> dict[str, Any]:
        """Open sessions; of the replica that answers: its id, the sessions it holds in memory
        and the torch threads it computes a view with (Ray gives an actor of ``num_cpus`` below
        1 one thread; bench_serve.py compares like with like)."""
        import torch

        sessions = await self.store.count.remote()
        here = {"replica": self.replica, "cached": len(self.cache), "torch_threads": torch.get_num_threads()}
        return {"sessions": sessions, **here}

    @api.post("/sessions")
    async def create(self, request: Request) -> dict[str, str]:
        body = await self._body(request, ("goal",), ("session_id", "task_type"))
        sid = body.get("session_id")
        if sid is not None and (not isinstance(sid, str) or not SESSION_ID.match(sid)):
            raise HTTPException(400, "session_id must be 1 to 128 letters, digits, '.', '_' or '-'")
        try:
            session = self.memory.session(body["goal"], sid, str(body.get("task_type", "")))
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        status = await self.store.create.remote(session.id, session.goal, session.task_type)
        if status == "exists":
            raise HTTPException(409, f"session {session.id!r} exists already")
        if status == "full":
            raise HTTPException(429, f"{self.settings.max_sessions} sessions are open, the most this app holds")
        self._remember(session)
        return {"session_id": session.id}

    @api.post("/sessions/{session_id}/events")
    async def record(self, session_id: str, request: Request) -> dict[str, int]:
        body = await self._body(request, ("observation", "action", "feedback"), ("reward", "image"))
        image = body.get("image")
        if image is not None:
            try:
                image = base64.b64decode(image, validate=True) if isinstance(image, str) else image
            except (binascii.Error, ValueError):
                raise HTTPException(400, "image must be a base64 PNG") from None
        async with self._lock(session_id):
            return await self._record(session_id, body, image)

    async def _record(self, session_id: str, body: dict[str, Any], image: Any) -> dict[str, int]:
        # The cached copy, if any, without asking the store: the append below names the count it
        # extends, so a copy another replica outdated is refused there. Then the step is recorded
        # again on the store's copy: a client whose requests Serve routes to several replicas
        # records one step after another without seeing a conflict (found by the autoscaling test,
        # where a sequential client got a 409 from a replica holding an older copy).
        for _ in range(RECORD_ATTEMPTS):
            session = self.cache.get(session_id) or await self._session(session_id)
            before = session.steps
            try:
                await asyncio.to_thread(
                    session.record,
                    body["observation"],
                    body["action"],
                    body["feedback"],
                    body.get("reward", 0.0),
                    image=image,
                )
            except SessionFull as exc:
                raise HTTPException(413, str(exc)) from None
            except ValueError as exc:
                raise HTTPException(400, str(exc)) from None
            steps = await self.store.append.remote(session_id, before, session.records(before))
            if steps is None:
                self.cache.pop(session_id)
                raise HTTPException(404, f"no session {session_id!r} (closed meanwhile)")
            if steps >= 0:
                return {"steps": steps}
            self.cache.pop(session_id)  # this copy holds the refused step: read the store's
        raise HTTPException(
            409, f"session {session_id!r} was recorded by other requests meanwhile {RECORD_ATTEMPTS} times; retry"
        )

    async def _asked(self, request: Request) -> tuple[Any, Any]:
        """A view's question, ``(observation, steps)``: a POST's JSON body, or a GET's query.
        A GET has no body for the replica to fetch back from the proxy, so it is answered sooner
        (bench_serve.py's record: ``serve`` against ``serve_post``, and the floors of both)."""
        if request.method == "POST":
            body = await self._body(request, ("observation",), ("steps",))
            return body["observation"], body.get("steps")
        self._check(request)
        query = request.query_params
        for name in ("observation", "steps"):
            if len(query.getlist(name)) > 1:
                raise HTTPException(400, f"{name} is given {len(query.getlist(name))} times in the query")
        _check_fields(query, ("observation",), ("steps",))
        steps = query.get("steps")
        if steps is not None and steps.isdecimal() and len(steps) <= 18:  # int() refuses 4,300 digits and more
            return query["observation"], int(steps)
        return query["observation"], steps[:40] if steps is not None else None  # not a count: refused below

    async def _view(self, session_id: str, request: Request) -> MemoryView:
        observation, steps = await self._asked(request)
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
            raise HTTPException(400, f"steps must be the number of steps recorded, got {steps!r}")
        async with self._lock(session_id):
            session = await self._session(session_id, steps)
            if steps is not None and steps > session.steps:  # the store is written before a record answers
                raise HTTPException(
                    409, f"session {session_id!r} holds {session.steps} steps, fewer than the {steps} this request "
                    "says were recorded: closed and opened again, or a record that was not answered 200"
                )  # fmt: skip
            try:
                return (await asyncio.to_thread(self.memory.views, [(session, observation)]))[0]
            except ValueError as exc:
                raise HTTPException(400, str(exc)) from None

    @api.api_route("/sessions/{session_id}/view", methods=["GET", "POST"])
    async def view(self, session_id: str, request: Request, response: Response) -> dict[str, Any]:
        response.headers.update(NO_STORE)
        return _view_json(await self._view(session_id, request), self.replica)

    @api.api_route("/sessions/{session_id}/view.png", methods=["GET", "POST"])
    async def view_png(self, session_id: str, request: Request) -> Response:
        v = await self._view(session_id, request)
        if v.png is None:
            raise HTTPException(404, f"session {session_id!r}: this view ({v.view}) has no image")
        headers = {"X-MemPrism-View": v.view, "X-MemPrism-Index": str(v.index), "X-MemPrism-Replica": self.replica}
        headers["X-MemPrism-Visual-Tokens"] = str(v.visual_tokens)
        headers.update(NO_STORE)
        return Response(v.png, media_type="image/png", headers=headers)

    @api.delete("/sessions/{session_id}")
    async def close(self, session_id: str, request: Request) -> dict[str, bool]:
        self._check(request)
        self.cache.pop(session_id)
        self.locks.pop(session_id, None)
        if not await self.store.close.remote(session_id):
            raise HTTPException(404, f"no session {session_id!r}")
        return {"closed": True}


def build(args: dict[str, Any]) -> Any:
    """The Serve application (``serve run memprism_ray.serve.app:build key=value ...``): the
    settings checked here (typed and validated as every config section is, the benchmark, view,
    marginal or checkpoint as :class:`~memprism_ray.memory.Memory` checks them), before any
    replica starts: a replica refusing them failed three times in tracebacks before ``serve
    run`` said "Deploying application default failed"."""
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.memory import check_source

    settings = from_dict(ServeSettings, args, _where="serve")
    get_benchmark(settings.benchmark)
    check_source(
        checkpoint=settings.checkpoint or None,
        view=settings.view or None,
        marginal=settings.marginal or None,
        seed=settings.seed,
    )
    return application(settings)


def application(settings: ServeSettings, **deployment_options: Any) -> Any:
    """The app of ``settings``: its replicas (:class:`MemoryServer`, with ``deployment_options``
    as Serve's ``.options``) and the session store, one per application."""
    store = SessionStore.bind(settings.max_sessions)
    return MemoryServer.options(**deployment_options).bind(asdict(settings), store)
