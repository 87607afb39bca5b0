"""MemPrism as a service against the library in process (issue 43): views per second and
p50/p99 view latency at 1, 4 and 16 concurrent clients, each replaying one recorded ALFWorld
episode of 50 steps in its own session (ask the view, record the step), through HTTP to the
Ray Serve app (memprism_ray/serve/app.py, a local Ray) and through :class:`memprism_ray.memory.Memory`
called in this process. Both use the same Router checkpoint (``--checkpoint``; default a seeded
untrained Router, whose views cost what a trained one's do) and the embedded corpus.

    python benchmarks/bench_serve.py [--clients 1,4,16] [--steps 50] [--rounds 3] [--checkpoint DIR]

Every round measures them one after the other: the library with the torch threads a replica
computes with (``/healthz``; Ray gives an actor of ``num_cpus`` 0.5 one thread), so the ratio is
the service's own cost, and the library with this process's default threads (what an agent
calling it in process gets). The app's views are asked by ``GET`` (the observation in the query:
no body for the replica to fetch back from the proxy); at one client also by ``POST`` (the JSON
body, which any observation fits), ``serve_post``. The record has, per client count, each round's
views/s, p50 and p99 (ms) with their median and range (``_results.summarize``), and the ratios of
the app's p50 at one client to each library's, round by round.

At one client each round also measures what any Serve app pays on this machine, beside them:
``serve_floor`` and ``serve_floor_post``, a FastAPI deployment of the same resources that reads
the same query or JSON body and answers as many bytes as a view without computing anything
(Serve's HTTP proxy, the replica hop and, for the body, the replica fetching it back from the
proxy); and ``library_paused``, the library with ``--pause-ms`` of idle between steps, as a
replica idles while a request travels (and as an agent that calls its model between views does):
the first view after idle is slower on these machines. What the app adds above Serve's floor is
``serve - serve_floor``.
The last line is ``RESULT {json}``, recorded in
``benchmarks/results/bench_serve.json`` (``_results.write_result``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _results import percentile, summarize, write_result

from memprism_ray.config_tree import int_at_least

Step = tuple[str, str, str, float]


def record_episode(steps: int, seed: int) -> tuple[str, list[Step]]:
    """One ALFWorld game of the embedded corpus played ``steps`` steps by a seeded random
    choice among the admissible commands (a longer history than the expert's short wins)."""
    from memprism_ray.benchmark.alfworld.benchmark import Alfworld
    from memprism_ray.benchmark.alfworld.data import list_games
    from memprism_ray.benchmark.alfworld.env import AlfworldEnv
    from memprism_ray.config import load_config

    cfg = Alfworld().prepare(load_config("configs/local.yaml"), log=lambda m: print(m, flush=True))
    rng = random.Random(seed)
    with AlfworldEnv(1) as env:
        for game in list_games("train", cfg.corpus.data_root):
            obs = env.reset(game)
            observation, admissible, played = obs.text, obs.admissible, []
            for _ in range(steps):
                action = rng.choice([a for a in admissible if a not in ("inventory", "look")] or list(admissible))
                tr = env.step(action)
                played.append((observation, action, tr.feedback, float(tr.reward)))
                if tr.done:
                    break
                observation, admissible = tr.feedback, tr.admissible
            if len(played) == steps:
                return obs.goal, played
    raise SystemExit(f"no game of the corpus lasted {steps} steps")


def run_clients(clients: int, play: Callable[[int, list[float]], None]) -> dict[str, float]:
    """``clients`` threads, each ``play(i, latencies)``-ing its own session; views/s, p50, p99.
    A client that fails fails the round (a thread's exception alone would only be printed, and
    the round timed on what the others measured)."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failed: list[BaseException] = []

    def client(i: int) -> None:
        try:
            play(i, latencies[i])
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if failed:
        raise RuntimeError(f"{len(failed)} of {clients} client(s) failed, the first: {failed[0]!r}") from failed[0]
    every = [x for lat in latencies for x in lat]
    return {
        "views_per_s": len(every) / wall,
        "p50_ms": 1000 * percentile(every, 0.5),
        "p99_ms": 1000 * percentile(every, 0.99),
    }


def library_round(
    memory: Any, goal: str, episode: list[Step], clients: int, tag: str, pause_s: float = 0.0
) -> dict[str, float]:
    def play(i: int, lat: list[float]) -> None:
        session = memory.session(goal, session_id=f"{tag}-{clients}-{i}")
        for observation, action, feedback, reward in episode:
            t0 = time.perf_counter()
            session.view(observation)
            lat.append(time.perf_counter() - t0)
            session.record(observation, action, feedback, reward)
            time.sleep(pause_s)

    return run_clients(clients, play)


def ask_view(http: Any, path: str, method: str, fields: dict[str, Any]) -> Any:
    """A view asked by ``GET`` (``fields`` in the query) or ``POST`` (``fields`` as the JSON body)."""
    return http.get(path, params=fields) if method == "GET" else http.post(path, json=fields)


def http_round(
    url: str,
    goal: str,
    episode: list[Step],
    clients: int,
    tag: str,
    sizes: list[int] | None = None,
    method: str = "GET",
) -> dict[str, float]:
    """``clients`` sessions replaying ``episode`` over HTTP, each view asked by ``method``;
    ``sizes`` gets the first one's answer sizes (bytes), one per step."""
    import httpx

    def play(i: int, lat: list[float]) -> None:
        with httpx.Client(base_url=url, timeout=300) as http:
            sid = http.post("/sessions", json={"goal": goal, "session_id": f"{tag}-{clients}-{i}"}).json()["session_id"]
            for t, (observation, action, feedback, reward) in enumerate(episode):
                t0 = time.perf_counter()
                got = ask_view(http, f"/sessions/{sid}/view", method, {"observation": observation, "steps": t})
                lat.append(time.perf_counter() - t0)
                got.raise_for_status()
                if sizes is not None and i == 0:
                    sizes.append(len(got.content))
                step = {"observation": observation, "action": action, "feedback": feedback, "reward": reward}
                http.post(f"/sessions/{sid}/events", json=step).raise_for_status()
            http.delete(f"/sessions/{sid}")

    return run_clients(clients, play)


def floor_app() -> Any:
    """An app with the view route's shapes and nothing behind them: it reads the query (GET) or
    the JSON body (POST) and answers ``answer_bytes`` (one of the fields) of JSON, on a replica
    of the MemoryServer's resources."""
    from fastapi import FastAPI
    from ray import serve

    from memprism_ray.serve.app import MemoryServer

    api = FastAPI()

    @serve.deployment(ray_actor_options=MemoryServer.ray_actor_options, logging_config={"enable_access_log": False})
    @serve.ingress(api)
    class Floor:
        # Builtin annotations only: this module's are strings, and FastAPI resolves them in the
        # globals cloudpickle gives the replica's copy of the class (a `Request` is not there).
        @api.get("/sessions/{session_id}/view")
        async def asked(self, session_id: str, observation: str, steps: int, answer_bytes: int) -> dict[str, str]:
            return {"png": "A" * answer_bytes}

        @api.post("/sessions/{session_id}/view")
        async def view(self, session_id: str, body: dict) -> dict[str, str]:
            return {"png": "A" * int(body["answer_bytes"])}

    return Floor.bind()


def floor_round(url: str, episode: list[Step], sizes: list[int], method: str = "GET") -> dict[str, float]:
    """One client asking the floor app as :func:`http_round` asks for views: the same fields,
    each answered with as many bytes as the app's view of that step was."""
    import httpx

    def play(i: int, lat: list[float]) -> None:
        with httpx.Client(base_url=url, timeout=300) as http:
            for t, (observation, *_) in enumerate(episode):
                t0 = time.perf_counter()
                fields = {"observation": observation, "steps": t, "answer_bytes": sizes[t]}
                got = ask_view(http, "/sessions/floor/view", method, fields)
                got.json()
                lat.append(time.perf_counter() - t0)
                got.raise_for_status()

    return run_clients(1, play)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,4,16", help="concurrent clients, comma-separated")
    ap.add_argument("--steps", type=int_at_least(1), default=50, help="steps of the recorded episode")
    ap.add_argument("--rounds", type=int_at_least(1), default=3, help="repetitions of the whole comparison")
    ap.add_argument("--checkpoint", default="", help="Router checkpoint ('' : a seeded untrained Router)")
    ap.add_argument("--seed", type=int_at_least(0), default=0)
    ap.add_argument("--pause-ms", type=float, default=20.0, help="idle between the steps of library_paused")
    args = ap.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]

    from ray import serve

    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.cluster.head import free_ports
    from memprism_ray.cluster.placement import init_ray
    from memprism_ray.memory import Memory
    from memprism_ray.serve.app import build

    goal, episode = record_episode(args.steps, args.seed)
    checkpoint = args.checkpoint
    if not checkpoint:
        import torch

        from memprism_ray.adapter.checkpoint import save_checkpoint
        from memprism_ray.router.model import RouterConfig, ViewPolicyModel

        torch.manual_seed(args.seed)
        checkpoint = str(Path(tempfile.mkdtemp(prefix="bench-serve-")) / "router")
        save_checkpoint(checkpoint, ViewPolicyModel(RouterConfig()), stage="init")
    memory = Memory(get_benchmark("alfworld").phi_spec(), checkpoint=checkpoint)
    init_ray("local", 0, log_to_driver=False)
    (port,) = free_ports(None)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build({"checkpoint": checkpoint}), name="bench", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    # One whole episode each before timing: the replica's encoder, caches and the first
    # requests' set-up (a 3-step warm-up left round 1 at 35 ms against 24 ms in rounds 2-3).
    sizes: list[int] = []
    http_round(url, goal, episode, 1, "warm", sizes)
    library_round(memory, goal, episode, 1, "warm")
    serve.run(floor_app(), name="floor", route_prefix="/floor")
    floor_round(f"{url}/floor", episode, sizes)
    import httpx
    import torch

    replica_threads = int(httpx.get(f"{url}/healthz").json()["torch_threads"])
    own_threads = torch.get_num_threads()

    def library_with(threads: int, c: int, tag: str, pause_s: float = 0.0) -> dict[str, float]:
        torch.set_num_threads(threads)
        try:
            return library_round(memory, goal, episode, c, tag, pause_s)
        finally:
            torch.set_num_threads(own_threads)

    modes = ("library", "library_all_threads", "library_paused", "serve", "serve_post")
    modes += ("serve_floor", "serve_floor_post")
    measured: dict[str, dict[int, list[dict[str, float]]]] = {mode: {} for mode in modes}
    for r in range(args.rounds):
        for c in clients:
            got = {
                "library": library_with(replica_threads, c, f"lib{r}"),
                "library_all_threads": library_with(own_threads, c, f"all{r}"),
                "serve": http_round(url, goal, episode, c, f"web{r}"),
            }
            if c == 1:
                got["serve_post"] = http_round(url, goal, episode, c, f"post{r}", method="POST")
                got["serve_floor"] = floor_round(f"{url}/floor", episode, sizes)
                got["serve_floor_post"] = floor_round(f"{url}/floor", episode, sizes, method="POST")
                got["library_paused"] = library_with(replica_threads, c, f"pau{r}", args.pause_ms / 1000)
            for mode, figures in got.items():
                measured[mode].setdefault(c, []).append(figures)
            print(f"round {r + 1}, {c} client(s): {got}", flush=True)
    serve.shutdown()
    result: dict[str, Any] = {
        mode: {str(c): {k: summarize([r[k] for r in rounds]) for k in rounds[0]} for c, rounds in by_clients.items()}
        for mode, by_clients in measured.items()
    }
    at_1 = {mode: by_clients[1] for mode, by_clients in measured.items() if 1 in by_clients}
    for over, mode, key in (
        ("serve", "library", "serve_over_library_p50_at_1"),
        ("serve", "library_all_threads", "serve_over_library_all_threads_p50_at_1"),
        ("serve", "library_paused", "serve_over_library_paused_p50_at_1"),
        ("serve_post", "library", "serve_post_over_library_p50_at_1"),
        ("serve_floor", "library", "serve_floor_over_library_p50_at_1"),
        ("serve_floor_post", "library", "serve_floor_post_over_library_p50_at_1"),
    ):
        if over in at_1 and mode in at_1:
            pairs = zip(at_1[over], at_1[mode], strict=True)
            result[key] = summarize([a["p50_ms"] / b["p50_ms"] for a, b in pairs])
    if "serve" in at_1:
        pairs = zip(at_1["serve"], at_1["serve_floor"], strict=True)
        result["serve_above_floor_p50_ms_at_1"] = summarize([web["p50_ms"] - low["p50_ms"] for web, low in pairs])
    result["torch_threads"] = {"replica": replica_threads, "library_all_threads": own_threads}
    result["steps"], result["rounds"], result["clients"] = len(episode), args.rounds, clients
    result["pause_ms"], result["view_answer_bytes_median"] = args.pause_ms, statistics.median(sizes)
    print("RESULT " + json.dumps(result), flush=True)
    write_result("bench_serve", result, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
