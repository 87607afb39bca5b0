"""Evaluation pages for a policy that reads no pixels (the scripted stand-in).

The final evaluation writes the trajectory viewer of ``eval.artifacts`` episodes per
condition. Every episode used to keep its step views: each page painted and PNG-encoded, then
shipped back to the driver and dropped. Now only the viewer's episodes keep (and paint) their
pages; the others' pages are laid out only, with the same size and visual tokens. This plays
the same evaluation episodes of the embedded corpus both ways (``configs/local.yaml``: 25
steps, scripted policy, one fixed view), interleaved round by round so that machine load
affects both alike, and checks that actions and visual tokens are identical.

    .venv/bin/python benchmarks/bench_eval_pages.py [--episodes 24] [--rounds 2]

The last stdout line is ``RESULT {json}``; the same figures are recorded in
``benchmarks/results/bench_eval_pages.json`` (``_results.write_result``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _results import write_result

from memprism_ray.config_tree import int_at_least

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int_at_least(1), default=24, help="evaluation episodes per round and side")
    p.add_argument("--rounds", type=int_at_least(1), default=2, help="measured rounds (median reported)")
    p.add_argument("--condition", default="fixed:TemporalTrace")
    args = p.parse_args()

    import dataclasses

    from memprism_ray.agent import Agent, LocalServices
    from memprism_ray.baselines import make_selector
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.benchmark.alfworld import AlfworldEnv
    from memprism_ray.benchmark.alfworld.benchmark import plan_episodes
    from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
    from memprism_ray.config import load_config
    from memprism_ray.policy.factory import make_policy

    cfg = get_benchmark("alfworld").prepare(
        load_config(ROOT / "configs" / "local.yaml", []), lambda m: print(m, file=sys.stderr)
    )
    _, plan, _ = plan_episodes(cfg.alfworld.eval_split, cfg.corpus.data_root, args.episodes, cfg.run.seed)
    slots = cfg.eval.slots
    policy = make_policy(cfg.policy, get_benchmark("alfworld").task_contract())
    env, phi = AlfworldEnv(num_slots=slots), AlfworldPhi()
    agent_cfg = dataclasses.replace(cfg.agent, keep_views=cfg.eval.artifacts > 0)
    every = [s.episode_id for s in plan]

    def play(keep_all: bool) -> tuple[float, list[Any]]:
        """The evaluation worker's waves (actors/evaluation.py, EvalWorker.play) in this process."""
        keep = every if keep_all else every[: cfg.eval.artifacts]
        agent = Agent(LocalServices(env, phi, policy), make_selector(args.condition, seed=cfg.run.seed), agent_cfg,
                      keep_views_for=keep)  # fmt: skip
        t0 = time.perf_counter()
        results = [r for start in range(0, len(plan), slots) for r in agent.run(plan[start : start + slots])]
        return time.perf_counter() - t0, results

    play(False)  # warm-up: engine translations, imports
    old_s, new_s, identical = [], [], True
    for r in range(args.rounds):
        for keep_all in (True, False) if r % 2 == 0 else (False, True):
            seconds, results = play(keep_all)
            (old_s if keep_all else new_s).append(seconds)
            trace = [[(row["action"], row["visual_tokens"]) for row in res.rows] for res in results]
            if keep_all:
                old_trace = trace
            else:
                new_trace, viewed = trace, sum(1 for res in results if res.views)
        identical = identical and old_trace == new_trace
        print(f"round {r + 1}: every episode painted {old_s[-1]:.1f} s, viewer only {new_s[-1]:.1f} s", file=sys.stderr)
    env.close()
    old, new = statistics.median(old_s), statistics.median(new_s)
    result = {
        "episodes": len(plan),
        "decisions": sum(len(t) for t in new_trace),
        "viewer_episodes": viewed,
        "every_episode_painted_s": round(old, 2),
        "viewer_only_s": round(new, 2),
        "ratio": round(new / old, 3),
        "actions_and_tokens_identical": identical,
    }
    print(json.dumps(result, indent=1), file=sys.stderr)
    print("RESULT " + json.dumps(result, sort_keys=True))
    write_result("bench_eval_pages", result)
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
