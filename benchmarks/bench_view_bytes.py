"""Bytes a rollout worker sends to its ViewWorker pool per episode (issue 9 item 4: "views
are composed where the streams live ... never by shipping a whole stream per step").

An episode is an ALFWorld-like event stream growing one recorded step at a time
(``testing.synthetic_streams``, seeded; the recorder's real ``EventStream``), with one view per
decision drawn uniformly from the 144 view actions (a Router early in GRPO samples widely;
``--window`` restricts the draw). At each step both payloads are serialised with Ray's own
serializer, as ``Pool.map`` ships them:

* before: the ``ViewRequest`` (the whole ``EventStream``, action, goal) that used to travel;
* after: the ``DeltaViewRequest`` (the records appended since the ViewWorker last saw the
  stream, action, goal) that travels now; the receiving ``StreamReplicas`` applies each one
  and its replica is checked against the source stream (content digest) at every step.

For scale, the PNG views coming back are measured too (they were and are the same).

Prints the total per episode at horizons 10, 25 and 50 (the paper's ALFWorld cap) and the
ratio before/after, plus the growth exponent of each (bytes ~ N^k between 25 and 50 steps:
k near 2 is quadratic, near 1 linear). Last line: ``RESULT {json}``, recorded in
``benchmarks/results/bench_view_bytes.json`` (another ``--window``: ``bench_view_bytes.window-W.json``).

    python benchmarks/bench_view_bytes.py [--episodes 8] [--window any|all|recent_short|recent_long]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path

from _results import write_result

from memprism_ray.config_tree import int_at_least

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

HORIZONS = (10, 25, 50)


def _serialized_size(obj: object) -> int:
    """Bytes of ``obj`` as Ray serialises an actor-call argument (in-band pickle plus
    out-of-band buffers), without starting Ray."""
    from ray.cloudpickle import dumps

    buffers: list = []
    data = dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(data) + sum(memoryview(b.raw()).nbytes for b in buffers)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int_at_least(1), default=8, help="seeded episodes per horizon (mean reported)")
    p.add_argument("--window", default="any", choices=("any", "all", "recent_short", "recent_long"))
    args = p.parse_args()

    from memprism_ray.recorder.stream import EventStream
    from memprism_ray.testing.synthetic_streams import alfworld_like_stream
    from memprism_ray.view_space import ALL_ACTIONS
    from memprism_ray.views import DeltaTracker, ViewRequest, ViewService

    actions = [a for a in ALL_ACTIONS if args.window in ("any", a.window)]
    totals: dict[int, dict[str, float]] = {}
    for n in HORIZONS:
        before = after = png = 0
        for seed in range(args.episodes):
            full = alfworld_like_stream(n, seed)
            goal = str(full.meta["goal"])
            rng = random.Random(f"{n}:{seed}")
            stream = EventStream(full.meta)
            tracker = DeltaTracker(1)
            worker = ViewService(cache_size=0, encode_png=True)  # the ViewWorker's side
            for t in range(n):  # the decision at step t sees the t events recorded so far
                req = ViewRequest(stream, rng.choice(actions), goal, want_image=True, want_text=False)
                before += _serialized_size([req])
                _, delta = tracker.request(req)
                after += _serialized_size([delta])
                rv = worker.render_delta(delta)
                tracker.acknowledge(stream, len(stream))
                replica = worker.replicas._streams[delta.stream_id]
                if replica.content_digest != stream.content_digest:
                    raise SystemExit(f"replica differs from its stream at step {t}")
                png += len(rv.png or b"")
                rec = full[t]
                stream.append(rec.raw, rec.event)
        totals[n] = {k: v / args.episodes for k, v in (("before", before), ("after", after), ("png", png))}

    print(f"view request bytes per episode (mean of {args.episodes} episodes; views: window={args.window})")
    print(f"{'steps':>6}{'before (stream)':>18}{'after (deltas)':>18}{'ratio':>8}{'PNG back':>14}")
    for n in HORIZONS:
        b, a = totals[n]["before"], totals[n]["after"]
        print(f"{n:>6}{b:>18,.0f}{a:>18,.0f}{b / a:>8.1f}{totals[n]['png']:>14,.0f}")
    lo, hi = HORIZONS[-2], HORIZONS[-1]

    def exponent(key: str) -> float:
        return math.log(totals[hi][key] / totals[lo][key]) / math.log(hi / lo)

    k_before, k_after = exponent("before"), exponent("after")
    print(f"growth exponent {lo}->{hi} steps: before {k_before:.2f}, after {k_after:.2f} (2 = quadratic, 1 = linear)")
    result = {
        "window": args.window,
        "episodes": args.episodes,
        "bytes_per_episode": {str(n): {k: round(v) for k, v in totals[n].items()} for n in HORIZONS},
        "ratio_at_50": round(totals[50]["before"] / totals[50]["after"], 2),
        "growth_exponent_before": round(k_before, 2),
        "growth_exponent_after": round(k_after, 2),
    }
    print("RESULT " + json.dumps(result))
    write_result("bench_view_bytes", result, variant="" if args.window == "any" else f"window-{args.window}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
