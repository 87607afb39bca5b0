"""The Serve app (memprism_ray/serve/app.py, issue 43) under a local Ray with real HTTP calls:
the library's views over HTTP, one 4xx line for every bad input, and a replica killed
mid-session losing nothing."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import httpx
import pytest
import yaml
from net_listeners import comm, listeners, loopback, tree

from memprism_ray.benchmark import get_benchmark
from memprism_ray.memory import Memory

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = [
    ("You are in the middle of a room.", "go to countertop 1", "On the countertop 1, you see a mug 1, and a knife 1."),
    ("On the countertop 1, you see a mug 1.", "take mug 1 from countertop 1", "You pick up the mug 1."),
    ("You pick up the mug 1.", "go to sinkbasin 1", "On the sinkbasin 1, you see nothing."),
    ("On the sinkbasin 1, you see nothing.", "clean mug 1 with sinkbasin 1", "You clean the mug 1."),
]
GOAL = "Your task is to: put a clean mug in coffeemachine."
TOKEN = "test-token"


@pytest.fixture(scope="module")
def served(ray_session):
    """The app as ``serve run clusters/serve_memory.yaml`` starts it, with a token, a 6-step limit
    and 2 sessions held by a replica."""
    from ray import serve

    from memprism_ray.cluster.head import free_ports
    from memprism_ray.serve.app import build

    (port,) = free_ports(None)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    args = yaml.safe_load((ROOT / "clusters" / "serve_memory.yaml").read_text())["applications"][0]["args"]
    # A replica keeps 2 sessions in memory: every test here also reads sessions back from the store.
    settings = {**args, "token": TOKEN, "max_events": "6", "cached_sessions": "2"}
    serve.run(build(settings), name="memprism", route_prefix="/")
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
    )
    yield client
    client.close()
    serve.shutdown()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"checkpoint": "/nonexistent"}, "checkpoint /nonexistent: no such directory"),
        ({"view": "fixed:Nope"}, "unknown view tau 'Nope'; valid tau names: TemporalTrace, "),
        ({"view": "TemporalTrace"}, "view 'TemporalTrace': name a fixed view, e.g. fixed:TemporalTrace"),
        ({"marginal": "/nonexistent.json"}, "frequency-matched marginal: /nonexistent.json does not exist"),
        ({"benchmark": "nope", "view": "fixed:TemporalTrace"}, "unknown benchmark 'nope'; known benchmarks: "),
    ],
)
def test_the_builder_refuses_what_every_replica_would(args: dict, message: str) -> None:
    """``serve run memprism_ray.serve.app:build checkpoint=/nonexistent``: three replicas failed
    in tracebacks before Serve said "Deploying application default failed" (40 s here); the
    builder says it first, in one line, as :class:`Memory` would."""
    from memprism_ray.serve.app import build

    with pytest.raises(ValueError) as err:
        build(args)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert type(build({"view": "fixed:TemporalTrace"})).__name__ == "Application"


def _local() -> Memory:
    return Memory(get_benchmark("alfworld").phi_spec(), view="fixed:TemporalTrace")


def _without_replica(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "replica"}


def test_http_views_are_the_librarys(served: httpx.Client) -> None:
    sid = served.post("/sessions", json={"goal": GOAL}).json()["session_id"]
    session = _local().session(GOAL, session_id=sid)
    for observation, action, feedback in STEPS:
        got = served.post(f"/sessions/{sid}/view", json={"observation": observation})
        assert got.status_code == 200, got.text
        hinted = served.post(f"/sessions/{sid}/view", json={"observation": observation, "steps": session.steps})
        assert hinted.json() == got.json()  # the client's step count lets the replica skip the store
        asked = served.get(f"/sessions/{sid}/view", params={"observation": observation, "steps": session.steps})
        assert asked.json() == got.json()  # the same question in a GET's query
        assert asked.headers["cache-control"] == "no-store"  # the same URL answers anew after a record
        want = session.view(observation)
        body = got.json()
        assert (body["view"], body["index"], body["step"]) == (want.view, want.index, want.step)
        assert base64.b64decode(body["png"]) == want.png and body["text"] == want.text
        assert (body["visual_tokens"], body["text_tokens"]) == (want.visual_tokens, want.text_tokens)
        rec = served.post(f"/sessions/{sid}/events", json={"observation": observation, "action": action,
                                                          "feedback": feedback})  # fmt: skip
        assert rec.status_code == 200 and rec.json() == {"steps": want.step + 1}, rec.text
        session.record(observation, action, feedback)
    png = served.post(f"/sessions/{sid}/view.png", json={"observation": "o"})
    assert png.headers["content-type"] == "image/png" and png.content == session.view("o").png
    got_png = served.get(f"/sessions/{sid}/view.png", params={"observation": "o"})
    assert got_png.content == png.content and got_png.headers["cache-control"] == "no-store"
    assert served.delete(f"/sessions/{sid}").json() == {"closed": True}
    assert served.post(f"/sessions/{sid}/view", json={"observation": "o"}).status_code == 404


def test_only_the_replicas_grpc_servers_listen_off_loopback(served: httpx.Client) -> None:
    """The app on a Ray started the loopback way (``init_ray``; for ``serve run`` the setting
    docs/memory.md gives): GCS, raylet, Serve's controller and its HTTP proxy listen on
    127.0.0.1. Ray 2.60 binds each replica's inter-deployment gRPC server to ``[::]``, whatever
    the node address (serve/_private/replica.py, ``"[::]:0"``), checked against the cluster's
    token under ``RAY_AUTH_MODE=token``: the one listener off loopback, said in docs/memory.md.
    This fails when a Ray upgrade moves it, or anything else, so that the docs follow."""
    found = [(comm(pid), address, port) for pid, address, port in listeners(tree(os.getpid()))]
    assert {"gcs_server", "raylet"} <= {name for name, *_ in found}
    assert ("ray::ProxyActor", "127.0.0.1", served.base_url.port) in found, found
    exposed = [(name, address) for name, address, _ in found if not loopback(address)]
    assert exposed and {name for name, _ in exposed} == {"ray::ServeRepli"}, exposed
    assert {address for _, address in exposed} == {"::"}


def test_a_replica_holds_its_last_sessions_and_reads_the_others_back(served: httpx.Client) -> None:
    """Sessions a replica dropped from memory (2 held here) answer as the library does."""
    sids = [served.post("/sessions", json={"goal": GOAL}).json()["session_id"] for _ in range(4)]
    local = [_local().session(GOAL, session_id=sid) for sid in sids]
    for step, (observation, action, feedback) in enumerate(STEPS[:2]):
        for sid, session in zip(sids, local, strict=True):
            event = {"observation": observation, "action": action, "feedback": f"{feedback} {sid}"}
            assert served.post(f"/sessions/{sid}/events", json=event).json() == {"steps": step + 1}
            session.record(observation, action, event["feedback"])
    assert served.get("/healthz").json()["cached"] == 2
    for sid, session in zip(sids, local, strict=True):  # the first two come back from the store
        got = served.post(f"/sessions/{sid}/view", json={"observation": STEPS[2][0]}).json()
        want = session.view(STEPS[2][0])
        assert (got["step"], got["text"], base64.b64decode(got["png"])) == (2, want.text, want.png)
    for sid in sids:
        assert served.delete(f"/sessions/{sid}").json() == {"closed": True}


def test_every_bad_input_is_a_4xx_with_one_line(served: httpx.Client) -> None:
    sid = served.post("/sessions", json={"goal": GOAL, "session_id": "bad-input"}).json()["session_id"]
    ok = {"observation": "o", "action": "look", "feedback": "You see a room."}
    cases = [
        (served.post("/sessions", json={"goal": GOAL, "session_id": "bad-input"}), 409, "exists already"),
        (served.post("/sessions", json={"goal": GOAL, "session_id": "a b"}), 400, "session_id must be"),
        (served.post("/sessions", json={"goal": ""}), 400, "goal must be"),
        (
            served.post("/sessions", json={"goal": GOAL, "task": "x"}),
            400,
            "unknown field(s): task; this request takes goal, session_id, task_type",
        ),
        (served.post(f"/sessions/{sid}/events", json={**ok, "rewrd": 1.0}), 400, "unknown field(s): rewrd"),
        (served.post(f"/sessions/{sid}/view", json={"observation": "o", "step": 0}), 400, "unknown field(s): step;"),
        (served.get(f"/sessions/{sid}/view", params={"observation": "o", "step": "0"}), 400, "unknown field(s): step;"),
        (
            served.get(f"/sessions/{sid}/view", params={"observation": "o", "steps": "1"}),
            409,
            "holds 0 steps, fewer than the 1 this request says were recorded",
        ),
        (served.post("/sessions", content=b"{not json"), 400, "JSON object"),
        (served.post("/sessions", json=["goal"]), 400, "JSON object"),
        (served.post(f"/sessions/{sid}/events", json={"observation": "o"}), 400, "missing field(s): action, feedback"),
        (served.post(f"/sessions/{sid}/events", json={**ok, "reward": "much"}), 400, "reward must be a finite number"),
        (served.post(f"/sessions/{sid}/events", json={**ok, "action": 7}), 400, "action must be text"),
        (served.post(f"/sessions/{sid}/events", json={**ok, "image": "%%"}), 400, "image must be a base64 PNG"),
        (served.post("/sessions/nope/events", json=ok), 404, "no session 'nope'"),
        (served.post("/sessions/nope/view", json={"observation": "o"}), 404, "no session 'nope'"),
        (served.post(f"/sessions/{sid}/view", json={"observation": 3}), 400, "observation must be text"),
        (served.post(f"/sessions/{sid}/view", json={"observation": "o", "steps": -1}), 400, "steps must be the number"),
        (served.get(f"/sessions/{sid}/view"), 400, "missing field(s): observation"),
        (served.get(f"/sessions/{sid}/view", params={"observation": "o", "steps": "2x"}), 400, "steps must be the"),
        (served.get(f"/sessions/{sid}/view?observation=o&observation=p"), 400, "observation is given 2 times"),
        (served.get(f"/sessions/{sid}/view", params={"observation": "o", "steps": "9" * 5000}), 400, "steps must"),
        (served.get("/sessions/nope/view.png", params={"observation": "o"}), 404, "no session 'nope'"),
        (httpx.get(f"{served.base_url}/sessions/{sid}/view", params={"observation": "o"}), 401, "bearer token"),
        (served.delete("/sessions/nope"), 404, "no session 'nope'"),
        (httpx.post(f"{served.base_url}/sessions", json={"goal": GOAL}), 401, "bearer token"),
    ]
    for response, status, message in cases:
        detail = response.json()["detail"]
        assert (response.status_code, "\n" in detail) == (status, False) and message in detail, (status, detail)
    assert served.post(f"/sessions/{sid}/view", json={"observation": "o"}).json()["step"] == 0  # nothing recorded
    for _ in range(6):
        assert served.post(f"/sessions/{sid}/events", json=ok).status_code == 200
    full = served.post(f"/sessions/{sid}/events", json=ok)
    assert full.status_code == 413 and "holds 6 steps" in full.json()["detail"]


def test_a_replica_killed_mid_session_loses_nothing(served: httpx.Client, ray_session) -> None:
    sid = served.post("/sessions", json={"goal": GOAL}).json()["session_id"]
    for observation, action, feedback in STEPS[:3]:
        rec = served.post(f"/sessions/{sid}/events", json={"observation": observation, "action": action,
                                                          "feedback": feedback})  # fmt: skip
        assert rec.status_code == 200
    before = served.post(f"/sessions/{sid}/view", json={"observation": STEPS[3][0]}).json()
    replicas = [
        a for a in ray_session.util.list_named_actors(all_namespaces=True) if "MemoryServer" in a["name"]
    ]  # fmt: skip
    assert len(replicas) == 1
    ray_session.kill(ray_session.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"]), no_restart=True)
    deadline, after = time.monotonic() + 120, None
    while time.monotonic() < deadline:  # Serve starts a new replica; until then the proxy answers 5xx
        got = served.post(f"/sessions/{sid}/view", json={"observation": STEPS[3][0]})
        if got.status_code == 200:
            after = got.json()
            break
        time.sleep(0.5)
    assert after["replica"] != before["replica"]  # drawn by another process
    assert _without_replica(after) == _without_replica(before)  # the same 3 steps, the same view
    observation, action, feedback = STEPS[3]
    rec = served.post(f"/sessions/{sid}/events", json={"observation": observation, "action": action,
                                                      "feedback": feedback})  # fmt: skip
    assert rec.json() == {"steps": 4}


def test_concurrent_records_of_one_session_each_take_their_own_step(served: httpx.Client) -> None:
    from concurrent.futures import ThreadPoolExecutor

    sid = served.post("/sessions", json={"goal": GOAL}).json()["session_id"]

    def record(i: int) -> httpx.Response:
        return served.post(f"/sessions/{sid}/events", json={"observation": f"o{i}", "action": "look",
                                                            "feedback": f"You see {i}."})  # fmt: skip

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(record, range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    assert sorted(a.json()["steps"] for a in answers) == [1, 2, 3, 4, 5, 6]
    assert served.post(f"/sessions/{sid}/view", json={"observation": "o"}).json()["step"] == 6


def test_replicas_added_by_autoscaling_answer_every_session_whole(served: httpx.Client, ray_session) -> None:
    """The app's deployment with a small autoscaling target beside the module's app: clients
    keep four sessions busy until Serve adds a second replica, then every view (whichever
    replica computes it, reading the others' steps from the store) is the library's."""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    from memprism_ray.serve.app import ServeSettings, application

    scaling = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1, "upscale_delay_s": 0,
               "downscale_delay_s": 600, "metrics_interval_s": 0.5, "look_back_period_s": 1}  # fmt: skip
    app = application(ServeSettings(view="fixed:TemporalTrace", max_sessions=100), autoscaling_config=scaling)
    serve.run(app, name="scaled", route_prefix="/scaled")
    http = httpx.Client(base_url=str(served.base_url).rstrip("/") + "/scaled", timeout=120)

    def replicas() -> int:
        states = serve.status().applications["scaled"].deployments["MemoryServer"].replica_states
        return states.get("RUNNING", 0)

    sessions = [http.post("/sessions", json={"goal": GOAL}).json()["session_id"] for _ in range(4)]
    local = {sid: _local().session(GOAL, session_id=sid) for sid in sessions}
    answered: dict[str, set[str]] = {sid: set() for sid in sessions}

    def play(sid: str, step: int) -> None:
        observation, action, feedback = STEPS[step % len(STEPS)]
        got = http.post(f"/sessions/{sid}/view", json={"observation": observation})
        assert got.status_code == 200, got.text
        want = local[sid].view(observation)
        body = got.json()
        assert (body["view"], body["step"], body["text"]) == (want.view, want.step, want.text)
        assert base64.b64decode(body["png"]) == want.png
        answered[sid].add(body["replica"])
        event = {"observation": observation, "action": action, "feedback": f"{feedback} ({step})"}
        rec = http.post(f"/sessions/{sid}/events", json=event)
        assert rec.json() == {"steps": step + 1}, rec.text
        local[sid].record(observation, action, event["feedback"])

    deadline, step, scaled_at = time.monotonic() + 150, 0, None
    with ThreadPoolExecutor(len(sessions)) as pool:
        while time.monotonic() < deadline and (scaled_at is None or step < scaled_at + 6):
            list(pool.map(play, sessions, [step] * len(sessions)))
            step += 1
            if scaled_at is None and replicas() == 2:
                scaled_at = step
    http.close()
    serve.delete("scaled")
    assert scaled_at is not None, "Serve never added the second replica"
    assert len(set().union(*answered.values())) == 2  # both replicas computed views
    assert any(len(r) == 2 for r in answered.values())  # a session recorded on one, viewed on the other
