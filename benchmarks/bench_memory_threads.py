"""Memory-interface conditions: the agent writes and queries the memories of a batch's
episodes on one thread each (``memprism_ray.agent._map_threads``) instead of one after the
other. This measures why, at the paper's scale (16 episodes per eval worker, one LLM call
per write): a local OpenAI-compatible stand-in on 127.0.0.1 answers each request after
``--latency`` seconds (a memory LLM's decode time), through the usage relay the external
baselines use, and a batch of ``--episodes`` writes runs sequentially and threaded.

    python benchmarks/bench_memory_threads.py [--episodes 16] [--latency 0.2] [--rounds 3]

The last line is ``RESULT {json}`` with both wall times and their ratio, recorded in
``benchmarks/results/bench_memory_threads.json`` (``_results.write_result``).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _results import write_result

from memprism_ray.agent import _map_threads, each_request
from memprism_ray.baselines.local import relay_for
from memprism_ray.baselines.memory import MemoryBaselineConfig, MemoryCounters
from memprism_ray.config_tree import int_at_least


def serve(latency: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(latency)
            body = json.dumps(
                {"choices": [{"message": {"role": "assistant", "content": "{}"}}], "usage": {"prompt_tokens": 1}}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int_at_least(1), default=16)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--rounds", type=int_at_least(1), default=3)
    args = ap.parse_args()
    import httpx

    server = serve(args.latency)
    relay = relay_for(MemoryBaselineConfig(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1"))
    urls = [relay.register(MemoryCounters())[1] for _ in range(args.episodes)]
    client = httpx.Client(timeout=60)

    def write(url: str) -> None:  # one memory write = one LLM call
        client.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})

    times = {}
    for name, run in (("sequential", each_request), ("threaded", _map_threads)):
        t0 = time.perf_counter()
        for _ in range(args.rounds):
            run(write, urls)
        times[name] = (time.perf_counter() - t0) / args.rounds
    ratio = times["sequential"] / times["threaded"]
    print(f"{args.episodes} episodes, {args.latency:.2f} s per LLM call")
    seq, thr = times["sequential"], times["threaded"]
    print(f"sequential {seq:.2f} s per decision batch, threaded {thr:.2f} s: {ratio:.1f}x")
    result = {**vars(args), **times, "ratio": ratio}
    print("RESULT " + json.dumps(result))
    write_result("bench_memory_threads", result)
    server.shutdown()


if __name__ == "__main__":
    main()
