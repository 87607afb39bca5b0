"""Ray overhead and scaling of GRPO rollouts (issue 6 item 5; docs/architecture.md "Distributed
rollout").

Plays the same groups (same games, trajectory ids, seeds and Router weights, hence the
same episodes) three ways, side by side in one run:

* in-process: the decision loop with local env slots, Phi, view service and policy;
* on Ray with 1 rollout worker: env, Phi, view and policy actors as the GRPO job places them;
* on Ray with 2 rollout workers.

Prints the Ray overhead ``T_ray1 / T_local - 1`` (target <= 10%) and the scaling
efficiency ``T_ray1 / (2 * T_ray2)``, and checks that the three runs took identical
actions. Actor start-up (model loading) is excluded: each side is warmed up on one group
first. Last line: ``RESULT {json}``, recorded in ``benchmarks/results/bench_rollout.json``
(``--layout local``: ``bench_rollout.layout-local.json``).

    python benchmarks/bench_rollout.py [--groups 4] [--group-size 4] [--max-steps 15]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _results import write_result

from memprism_ray.config_tree import int_at_least

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int_at_least(1), default=4, help="groups per measured run")
    p.add_argument("--group-size", type=int_at_least(1), default=4, help="trajectories per group")
    p.add_argument("--max-steps", type=int_at_least(1), default=15, help="steps per trajectory")
    p.add_argument("--repeats", type=int_at_least(1), default=2, help="measured runs per side (median reported)")
    p.add_argument(
        "--layout",
        default="pools",
        choices=("pools", "local"),
        help="pools: Phi, view and policy actors as in the paper preset; local: only envs are actors",
    )
    args = p.parse_args()

    import numpy as np
    import ray
    import torch

    from memprism_ray.actors.learner import state_to_numpy
    from memprism_ray.actors.rollout import RolloutWorker
    from memprism_ray.actors.workers import PhiWorker, PolicyReplica, ViewWorker
    from memprism_ray.agent import Agent, EpisodeSpec, LocalServices
    from memprism_ray.baselines import RouterSelector
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.benchmark.alfworld import AlfworldEnv, list_games
    from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
    from memprism_ray.cluster.fleet import RolloutFleet
    from memprism_ray.config import load_config
    from memprism_ray.envs.base import GameRef
    from memprism_ray.policy.factory import make_policy, needs_view_text
    from memprism_ray.router.encoder import TextEncoder
    from memprism_ray.router.features import FeatureExtractor
    from memprism_ray.router.model import ViewPolicyModel
    from memprism_ray.trainer.rollouts import run_groups, sample_groups
    from memprism_ray.views import ViewService

    torch.set_num_threads(1)
    g, s = args.group_size, args.max_steps
    cfg = load_config(
        ROOT / "configs" / "local.yaml",
        [
            "--grpo.groups_per_iteration",
            str(args.groups),
            "--grpo.group_size",
            str(g),
            "--agent.max_steps",
            str(s),
            "--rollout.env_slots_per_worker",
            str(g),
        ],
    )
    cfg = get_benchmark("alfworld").prepare(cfg, lambda m: print(m, file=sys.stderr))
    games = list_games("train", cfg.corpus.data_root)
    torch.manual_seed(0)
    model = ViewPolicyModel(cfg.router).eval()
    specs_of = [sample_groups(games, cfg, it) for it in range(args.repeats + 1)]

    # In-process.
    env = AlfworldEnv(num_slots=g)
    contract = get_benchmark("alfworld").task_contract()
    policy = make_policy(cfg.policy, contract)
    needs_text = needs_view_text(cfg.policy, contract)
    services = LocalServices(env, AlfworldPhi(), policy, ViewService(cfg.render))
    features = FeatureExtractor(TextEncoder(cfg.encoder))

    def local_run(specs) -> tuple[float, list[list[str]]]:
        t0 = time.perf_counter()
        actions = []
        for spec in specs:
            sel = RouterSelector(model, greedy=False, temperature=1.0, seed=spec.seed)
            agent = Agent(services, sel, cfg.agent, features=features, record_features=True)
            res = agent.run([EpisodeSpec(e, GameRef.from_dict(spec.game)) for e in spec.episode_ids])
            actions.append([row["action"] for r in res for row in r.rows])
        return time.perf_counter() - t0, actions

    local_run(specs_of[0][:1])  # warm-up
    local = [local_run(specs_of[k + 1]) for k in range(args.repeats)]

    # On Ray.
    from memprism_ray.cluster.placement import init_ray

    init_ray("local", os.cpu_count() or 2, log_to_driver=False)  # every listener on 127.0.0.1
    full = ray.put(state_to_numpy(model.state_dict()))
    ro = cfg.rollout
    pools = args.layout == "pools"
    phi = [PhiWorker.options(num_cpus=ro.helper_cpus).remote(get_benchmark(cfg.corpus.benchmark))] if pools else []
    views = [ViewWorker.options(num_cpus=ro.helper_cpus).remote(cfg.render, ro.view_cache_size)] if pools else []
    replicas = [PolicyReplica.options(num_cpus=ro.policy_cpus).remote(cfg.policy)] if pools else []
    workers = [
        RolloutWorker.options(num_cpus=ro.rollout_cpus).remote(
            cfg, i, full, phi, views, replicas, needs_text, "bench", benchmark=get_benchmark(cfg.corpus.benchmark)
        )
        for i in range(2)
    ]
    ray.get([w.ping.remote() for w in workers], timeout=600)

    def ray_run(n: int, specs) -> tuple[float, list[list[str]]]:
        t0 = time.perf_counter()
        result = run_groups(RolloutFleet(workers[:n]), specs, None, 0, cfg)
        seconds = time.perf_counter() - t0  # the driver holds refs to the step tables, as in the job
        assert result.failed_trajectories == 0
        tables = ray.get([g.steps for g in result.groups], timeout=600)  # fetched only to compare actions
        return seconds, [t.column("action").to_pylist() for t in tables]

    ray_run(2, specs_of[0][:2])  # warm-up: both workers load their models
    ray1 = [ray_run(1, specs_of[k + 1]) for k in range(args.repeats)]
    ray2 = [ray_run(2, specs_of[k + 1]) for k in range(args.repeats)]
    ray.shutdown()

    identical = all(local[k][1] == ray1[k][1] == ray2[k][1] for k in range(args.repeats))
    t_local = float(np.median([t for t, _ in local]))
    t_ray1 = float(np.median([t for t, _ in ray1]))
    t_ray2 = float(np.median([t for t, _ in ray2]))
    decisions = sum(len(a) for a in local[0][1])
    overhead = t_ray1 / t_local - 1.0
    efficiency = t_ray1 / (2 * t_ray2)
    print(f"{'run':<22}{'seconds':>10}{'decisions/s':>14}")
    for name, t in (("in-process", t_local), ("ray, 1 rollout worker", t_ray1), ("ray, 2 rollout workers", t_ray2)):
        print(f"{name:<22}{t:>10.2f}{decisions / t:>14.1f}")
    print(f"Ray overhead (1 worker vs in-process): {100 * overhead:+.1f}%  (target <= 10%)")
    print(f"scaling efficiency, 2 workers: {efficiency:.2f}  (cpus: {os.cpu_count()})")
    print(f"identical actions across the three runs: {identical}; layout: {args.layout}")
    result = {
        "layout": args.layout,
        "t_local_s": round(t_local, 3),
        "t_ray1_s": round(t_ray1, 3),
        "t_ray2_s": round(t_ray2, 3),
        "ray_overhead": round(overhead, 4),
        "scaling_efficiency_2": round(efficiency, 3),
        "decisions": decisions,
        "episodes_identical": identical,
        "cpus": os.cpu_count(),
        "overhead_target_met": overhead <= 0.10,
    }
    print("RESULT " + json.dumps(result))
    write_result("bench_rollout", result, variant="" if args.layout == "pools" else f"layout-{args.layout}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
