"""Router decision throughput on this machine (paper: appendix D.4/D.5 "Router inference is
constant in N_t after its fixed-size summaries are constructed").

A decision is what the agent does before composing a view: embed the current observation
and the goal with frozen MiniLM, summarise the last 8 events and 64-event statistics,
run ViewPolicyModel (A.2 size) and take the greedy view. Every decision has a new
observation text (observations change every step); goals repeat across steps of an episode.
"with cache" uses the encoder's LRU cache (the goal is embedded once per episode), "no cache"
embeds both texts every time. Both variants share one loaded MiniLM and run interleaved,
round by round, so machine load affects them alike.

    .venv/bin/python benchmarks/bench_router.py [--encoder minilm|hashing] [--seconds 4]

The last stdout line is ``RESULT {json}``: decisions/s per batch size and cache mode, the
cache speed-up ratio, and the model-only and feature-only rates for reference; recorded in
``benchmarks/results/bench_router.json`` (``--encoder hashing``: ``bench_router.hashing.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from typing import Any

import torch
from _results import write_result

from memprism_ray.config_tree import int_at_least
from memprism_ray.recorder import EventStream, RawEvent, StateDelta
from memprism_ray.router.encoder import EncoderConfig, HashingEncoder, TextEncoder
from memprism_ray.router.features import FeatureExtractor
from memprism_ray.router.model import RouterConfig, ViewPolicyModel
from memprism_ray.router.sampling import RouterSampler

OBJECTS = ["mug", "apple", "knife", "plate", "bowl", "egg", "lettuce", "tomato", "spatula", "cup", "pan", "potato"]
PLACES = ["countertop", "cabinet", "drawer", "fridge", "sinkbasin", "microwave", "shelf", "stoveburner", "garbagecan"]
TASKS = [
    "put a clean {o} in {p}",
    "heat some {o} and put it in {p}",
    "cool a {o} and put it on {p}",
    "find two {o} and put them in {p}",
    "examine the {o} with the desklamp",
]


def observation(rng: random.Random, serial: int) -> str:
    place = f"{rng.choice(PLACES)} {rng.randint(1, 9)}"
    seen = ", ".join(f"a {rng.choice(OBJECTS)} {rng.randint(1, 4)}" for _ in range(rng.randint(2, 7)))
    return (
        f"Step {serial}. You arrive at {place}. On the {place}, you see {seen}. "
        f"You are carrying nothing. Admissible: go to {rng.choice(PLACES)} {rng.randint(1, 9)}, "
        f"take {rng.choice(OBJECTS)} {rng.randint(1, 4)} from {place}, examine {place}, look, inventory."
    )


def episode_stream(rng: random.Random, length: int) -> EventStream:
    s = EventStream()
    for t in range(length):
        place = f"{rng.choice(PLACES)} {rng.randint(1, 9)}"
        action = rng.choice([f"go to {place}", f"open {place}", f"take mug 1 from {place}", "look"])
        failed = rng.random() < 0.2
        delta = [] if failed else [StateDelta("agent.location", place)]
        s.record(
            RawEvent(f"o{t}", action, "Nothing happens." if failed else "OK"),
            entity=place,
            act=action.split()[0],
            delta=delta,
            failed=failed,
        )
    return s


def measure(fn: Any, batch: int, seconds: float, min_rounds: int) -> float:
    """Decisions per second of ``fn()`` (one call = ``batch`` decisions), after one warm-up call."""
    fn()
    rounds, start = 0, time.perf_counter()
    while rounds < min_rounds or time.perf_counter() - start < seconds:
        fn()
        rounds += 1
    return rounds * batch / (time.perf_counter() - start)


def measure_paired(fns: dict[str, Any], batch: int, seconds: float, min_rounds: int) -> dict[str, dict[str, float]]:
    """Run the variants alternately, round by round, so load changes hit all of them alike.

    Returns per variant the overall rate (decisions / total time) and the median of the
    per-round rates; ratios between variants are taken from the same rounds.
    """
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    begin = time.perf_counter()
    while len(times[next(iter(fns))]) < min_rounds or time.perf_counter() - begin < seconds * len(fns):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {
        name: {"rate": batch * len(ts) / sum(ts), "median_rate": batch / statistics.median(ts), "rounds": len(ts)}
        for name, ts in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoder", choices=("minilm", "hashing"), default="minilm", help="text encoder (minilm)")
    parser.add_argument("--seconds", type=float, default=4.0, help="time per measurement and mode")
    parser.add_argument("--batches", default="1,16,128", help="comma-separated batch sizes")
    parser.add_argument(
        "--episodes", type=int_at_least(1), default=128, help="distinct episodes (goals) decisions come from"
    )
    parser.add_argument("--threads", type=int_at_least(0), default=0, help="torch intra-op threads (0: torch default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]

    torch.manual_seed(0)
    rng = random.Random(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    t0 = time.perf_counter()
    if args.encoder == "minilm":
        cached = TextEncoder(EncoderConfig(cache_size=4096))
        uncached = TextEncoder(EncoderConfig(cache_size=0), model=(cached.tokenizer, cached.model))
    else:
        cached, uncached = HashingEncoder(cache_size=4096), HashingEncoder(cache_size=0)
    print(f"encoder {args.encoder} loaded in {time.perf_counter() - t0:.1f}s")
    model = ViewPolicyModel(RouterConfig()).eval()
    router = RouterSampler(model, greedy=True)  # the rollout and evaluation selectors' sampler
    fx = {"cache": FeatureExtractor(cached), "no_cache": FeatureExtractor(uncached)}

    goals = [rng.choice(TASKS).format(o=rng.choice(OBJECTS), p=rng.choice(PLACES)) for _ in range(args.episodes)]
    streams = [episode_stream(rng, rng.randint(5, 40)) for _ in range(args.episodes)]
    cached.encode(goals)  # the first step of each episode has embedded its goal already
    serial = [0]

    def decide(mode: str, b: int) -> None:
        ep = [rng.randrange(args.episodes) for _ in range(b)]
        obs = []
        for _ in range(b):
            serial[0] += 1
            obs.append(observation(rng, serial[0]))
        feats = fx[mode].features_batch([streams[e] for e in ep], obs, [goals[e] for e in ep])
        router.select(feats)

    results: dict[str, Any] = {
        "encoder": args.encoder,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_avg_start": round(os.getloadavg()[0], 2),
        "decisions_per_s": {},
    }
    for b in batches:
        min_rounds = max(3, 32 // b)
        paired = measure_paired(
            {mode: (lambda m=mode, bb=b: decide(m, bb)) for mode in ("no_cache", "cache")}, b, args.seconds, min_rounds
        )
        rates = {mode: paired[mode]["rate"] for mode in paired}
        x = tuple(torch.randn(b, d) for d in (384, 384, 128, 8))
        model_only = measure(lambda xx=x: router.select(xx), b, args.seconds / 2, min_rounds)
        ep = [rng.randrange(args.episodes) for _ in range(b)]
        summ_only = measure(lambda e=ep: [fx["cache"].summarizer(streams[i]) for i in e], b, args.seconds / 4, 3)
        entry = {
            "cache": round(rates["cache"], 2),
            "no_cache": round(rates["no_cache"], 2),
            "cache_speedup": round(rates["cache"] / rates["no_cache"], 3),
            "cache_speedup_median": round(paired["cache"]["median_rate"] / paired["no_cache"]["median_rate"], 3),
            "rounds": paired["cache"]["rounds"],
            "model_only": round(model_only, 1),
            "summarizer_only": round(summ_only, 1),
        }
        results["decisions_per_s"][str(b)] = entry
        print(
            f"batch {b:>4}: {entry['cache']:>8.1f} dec/s with cache, {entry['no_cache']:>8.1f} without "
            f"(x{entry['cache_speedup']:.2f}); model only {entry['model_only']:.0f}/s, "
            f"window summary only {entry['summarizer_only']:.0f}/s"
        )
    results["cache_info"] = cached.cache_info()
    results["load_avg_end"] = round(os.getloadavg()[0], 2)
    print("RESULT " + json.dumps(results, sort_keys=True))
    write_result("bench_router", results, variant="" if args.encoder == "minilm" else args.encoder)


if __name__ == "__main__":
    main()
