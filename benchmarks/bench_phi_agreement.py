"""Agreement between the rule Phi and the LLM Phi on recorded ALFWorld transcripts (docs/phi.md;
paper appendix D.2 "ALFWorld", prompt E.1 "ALFWorld Phi Event Extraction").

Transcripts: ``--games`` games of the embedded corpus (or ``--data-root``) played by
ALFWorld's handcoded expert, a seeded ``--random-rate`` of its commands replaced by random
admissible ones (so failures and side trips occur), at most ``--max-steps`` steps each; or
the raw events of recorded event streams (``--streams FILE ...``, JSONL or Parquet written
by ``EventStream.save``).

Each transcript is recorded twice: into a stream by the rule Phi and into a stream by the
LLM Phi (``--base-url``/``--model``, the paper's prompt; the episodes advance in lockstep so
every step's events go out as one concurrent batch). Per event it compares:

* ``entity``: the LLM stream's entity vs the rule's (lowercase, whitespace-normalised);
* ``act_type``: the model's own ``act_type`` vs the rule's normalised act (the event's act
  always comes from the rules, so this measures the model, not the event);
* ``outcome``: each stream's outcome (``exception`` / ``state_update`` /
  ``no_observed_change``);
* deltas: the two extractors name keys differently (rule ``drawer 1.open`` vs the prompt's
  ``drawer 1``; ``agent.holding`` vs ``held_object``), so a delta is compared as
  ``(entity of its key, value)`` with :func:`~memprism_ray.recorder.events.split_key`:
  precision, recall and F1 of the LLM's pairs against the rule's, the exact ``(key, value)``
  match rate, and recall per rule key attribute (``location``, ``holding``, ``open``,
  ``contents``, ...).

Also printed: fallbacks by reason, requests, retries and tokens. Without ``--base-url`` it
loads the transcripts, runs the rule Phi over them, says that no endpoint is configured and
exits 0.

    python benchmarks/bench_phi_agreement.py [--games 4] [--max-steps 30] [--random-rate 0.2]
        [--base-url http://127.0.0.1:8000/v1 --model NAME] [--streams FILE ...]

The last line is ``RESULT {json}``; the same figures are recorded in
``benchmarks/results/bench_phi_agreement.json`` (without ``--base-url``:
``bench_phi_agreement.rule-only.json``, so a run without an endpoint never replaces a measured
agreement).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from typing import Any

from _results import write_result

from memprism_ray.config_tree import int_at_least
from memprism_ray.recorder import EventStream, RawEvent, split_key
from memprism_ray.recorder.phi.factory import record_lockstep


def play_transcripts(data_root: str, games: int, max_steps: int, random_rate: float, seed: int) -> list[list[RawEvent]]:
    """Expert episodes with seeded random detours, as the agent records raw events."""
    from memprism_ray.benchmark.alfworld import AlfworldEnv, list_games

    rng = random.Random(seed)
    refs = list_games("train", data_root)
    picked = [refs[i] for i in sorted(rng.sample(range(len(refs)), min(games, len(refs))))]
    episodes: list[list[RawEvent]] = []
    with AlfworldEnv(1, expert=True, expert_seed=seed) as env:
        for game in picked:
            obs = env.reset(game)
            o_pre, admissible, meta = obs.text, obs.admissible, obs.meta
            raws: list[RawEvent] = []
            for step in range(1, max_steps + 1):
                expert = meta.get("expert_action")
                action = rng.choice(admissible) if (rng.random() < random_rate or not expert) else expert
                tr = env.step(action)
                raws.append(RawEvent(o_pre, action, tr.feedback, tr.reward, {"step": step, "game_id": game.game_id}))
                o_pre, admissible, meta = tr.feedback, tr.admissible, tr.meta
                if tr.done:
                    break
            episodes.append(raws)
    return episodes


def load_streams(paths: list[str]) -> list[list[RawEvent]]:
    return [list(EventStream.load(p).raws) for p in paths]


def _norm(text: str) -> str:
    return " ".join(str(text).lower().split())


def agreement(rule_streams: list[EventStream], llm_streams: list[EventStream]) -> dict[str, Any]:
    n = ent = act = out = exact_hits = exact_total = 0
    tp = n_rule = n_llm = 0
    per_attr: dict[str, list[int]] = {}
    act_pairs: Counter[str] = Counter()
    for rs, ls in zip(rule_streams, llm_streams, strict=True):
        for r, m in zip(rs.events, ls.events, strict=True):
            n += 1
            ent += _norm(r.entity) == _norm(m.entity)
            model_act = m.evidence.get("phi_act_type")
            if model_act is not None:
                act += _norm(model_act) == _norm(r.act)
                act_pairs[f"{r.act}->{_norm(model_act)}"] += 1
            out += r.outcome == m.outcome
            rule_pairs = {(_norm(split_key(d.key)[0]), _norm(d.new_value)) for d in r.delta}
            llm_pairs = {(_norm(split_key(d.key)[0]), _norm(d.new_value)) for d in m.delta}
            tp += len(rule_pairs & llm_pairs)
            n_rule += len(rule_pairs)
            n_llm += len(llm_pairs)
            rule_exact = {(d.key, d.new_value) for d in r.delta}
            exact_hits += len(rule_exact & {(d.key, d.new_value) for d in m.delta})
            exact_total += len(rule_exact)
            for d in r.delta:
                attr = split_key(d.key)[1]
                hit = (_norm(split_key(d.key)[0]), _norm(d.new_value)) in llm_pairs
                per_attr.setdefault(attr, [0, 0])
                per_attr[attr][0] += hit
                per_attr[attr][1] += 1
    llm_events = sum(1 for s in llm_streams for e in s.events if e.evidence.get("phi") == "llm")
    p = tp / n_llm if n_llm else 0.0
    r_ = tp / n_rule if n_rule else 0.0
    return {
        "events": n,
        "events_answered_by_llm": llm_events,
        "entity_agreement": ent / n if n else 0.0,
        "act_type_agreement": act / llm_events if llm_events else 0.0,
        "outcome_agreement": out / n if n else 0.0,
        "delta_precision": p,
        "delta_recall": r_,
        "delta_f1": 2 * p * r_ / (p + r_) if p + r_ else 0.0,
        "delta_exact_key_match": exact_hits / exact_total if exact_total else 0.0,
        "delta_recall_by_rule_attribute": {k: round(v[0] / v[1], 4) for k, v in sorted(per_attr.items()) if v[1]},
        "act_type_pairs_top": dict(act_pairs.most_common(12)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--games", type=int_at_least(1), default=4)
    ap.add_argument("--max-steps", type=int_at_least(1), default=30)
    ap.add_argument("--random-rate", type=float, default=0.2)
    ap.add_argument("--seed", type=int_at_least(0), default=0)
    ap.add_argument("--data-root", default="", help="ALFWorld data root ('' : the embedded corpus)")
    ap.add_argument("--streams", nargs="*", default=[], help="recorded event streams instead of playing games")
    ap.add_argument("--base-url", default="", help="OpenAI-compatible endpoint of the LLM Phi ('' : none)")
    ap.add_argument("--model", default="", help="model name the endpoint serves")
    ap.add_argument("--concurrency", type=int_at_least(1), default=16)
    ap.add_argument("--max-tokens", type=int_at_least(1), default=512)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--retries", type=int_at_least(0), default=2)
    args = ap.parse_args(argv)

    from memprism_ray.benchmark.alfworld.phi import AlfworldPhi

    t0 = time.perf_counter()
    if args.streams:
        episodes = load_streams(args.streams)
        source = f"{len(args.streams)} recorded stream(s)"
    else:
        root = args.data_root
        if not root:
            from memprism_ray.benchmark import get_benchmark
            from memprism_ray.config import load_config

            log = lambda m: print(m, file=sys.stderr)  # noqa: E731
            root = get_benchmark("alfworld").prepare(load_config(None, []), log).corpus.data_root
        episodes = play_transcripts(root, args.games, args.max_steps, args.random_rate, args.seed)
        source = f"{len(episodes)} expert game(s) of {root} (random rate {args.random_rate}, seed {args.seed})"
    steps = sum(len(e) for e in episodes)
    if steps == 0:
        print("no transcript events loaded", file=sys.stderr)
        return 1
    rule_streams = record_lockstep(episodes, AlfworldPhi())
    outcomes = Counter(e.outcome.value for s in rule_streams for e in s.events)
    print(f"transcripts: {source}: {len(episodes)} episodes, {steps} events ({time.perf_counter() - t0:.1f}s)")
    print(f"rule Phi outcomes: {dict(outcomes)}")
    result: dict[str, Any] = {"episodes": len(episodes), "events": steps, "rule_outcomes": dict(outcomes)}
    if not args.base_url:
        print("no --base-url given: no LLM Phi endpoint configured, agreement not measured")
        print("RESULT " + json.dumps({**result, "llm": None}))
        # No agreement was measured: a record of its own, so it never replaces a measured one.
        write_result("bench_phi_agreement", {**result, "llm": None}, variant="rule-only", argv=argv)
        return 0

    from memprism_ray.benchmark.alfworld.phi import ALFWORLD_PHI
    from memprism_ray.recorder.phi.config import PhiConfig
    from memprism_ray.recorder.phi.llm import LLMPhi
    from memprism_ray.recorder.phi.llm_client import PhiEndpoint

    cfg = PhiConfig(
        kind="llm",
        base_url=args.base_url,
        model=args.model,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        timeout_s=args.timeout_s,
        max_retries=args.retries,
    )
    phi = LLMPhi(ALFWORLD_PHI, PhiEndpoint(cfg), AlfworldPhi())
    t1 = time.perf_counter()
    llm_streams = record_lockstep(episodes, phi)
    wall = time.perf_counter() - t1
    agree = agreement(rule_streams, llm_streams)
    reasons = Counter(
        e.evidence["phi_fallback"].split(":")[0] for s in llm_streams for e in s.events if "phi_fallback" in e.evidence
    )
    stats = phi.stats()
    print(f"LLM Phi {args.model} at {args.base_url}: {steps} events in {wall:.1f}s ({steps / wall:.2f} events/s)")
    for k, v in agree.items():
        print(f"  {k}: {round(v, 4) if isinstance(v, float) else v}")
    print(f"  fallbacks: {stats['fallback']} ({dict(reasons)})")
    tokens = (stats.get("backend_prompt_tokens", 0), stats.get("backend_completion_tokens", 0))
    print(
        f"  requests {stats.get('backend_requests', 0)}, retries {stats.get('backend_retries', 0)}, "
        f"tokens {tokens[0]} prompt / {tokens[1]} completion"
    )
    result = {**result, "llm": {**agree, "stats": stats, "wall_s": round(wall, 2)}}
    print("RESULT " + json.dumps(result))
    write_result("bench_phi_agreement", result, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
