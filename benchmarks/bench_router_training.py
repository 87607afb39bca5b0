"""Router training cost on this machine: one D1 step and one D2 update (paper: appendix A.2
model size, Table A.4 optimisers).

Two side-by-side comparisons, each run interleaved round by round so that machine load
affects both variants alike:

* **D1 step** (:class:`memprism_ray.adapter.sft.SFTTrainer`): forward, backward and AdamW
  over the encoder and planner (12.7M parameters) at ``--sft-batch`` decisions, with
  ``torch.optim.AdamW`` in its default (per-parameter loop) form and with ``fused=True``,
  which the trainer uses.
* **D2 update** (:class:`memprism_ray.adapter.grpo_update.GRPOUpdater`): one iteration's update on
  ``--decisions`` decisions, with the reference model's logits from the shared ``z_t`` (what
  the trainer does while the reference's encoder equals the frozen encoder) and with a full
  second forward pass of the reference model.

    .venv/bin/python benchmarks/bench_router_training.py [--rounds 5] [--threads 2]

The last stdout line is ``RESULT {json}`` with the seconds per step / update of each variant
and the ratios, recorded in ``benchmarks/results/bench_router_training.json`` (another
``--threads N``: ``bench_router_training.threads-N.json``).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from typing import Any

import numpy as np
import torch
from _results import write_result

from memprism_ray.adapter.grpo_update import GRPOBatch, GRPOConfig, GRPOUpdater
from memprism_ray.config_tree import int_at_least
from memprism_ray.router.features import STATS_DIM, TEXT_DIM, WINDOW_DIM
from memprism_ray.router.model import RouterConfig, ViewPolicyModel
from memprism_ray.view_space import NUM_ACTIONS


def features(n: int, rng: np.random.Generator) -> list[torch.Tensor]:
    dims = (TEXT_DIM, TEXT_DIM, WINDOW_DIM, STATS_DIM)
    return [torch.from_numpy(rng.standard_normal((n, d)).astype(np.float32)) for d in dims]


def d1_step_seconds(model: ViewPolicyModel, opt: torch.optim.Optimizer, x: list[torch.Tensor], steps: int) -> float:
    model.train()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = torch.log_softmax(model(*x), dim=-1)[:, 0].mean().neg()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def grpo_batch(n: int, rng: np.random.Generator) -> GRPOBatch:
    obs, goal, window, stats = features(n, rng)
    traj = torch.arange(n) // 20
    return GRPOBatch(
        obs=obs,
        goal=goal,
        window=window,
        stats=stats,
        action=torch.from_numpy(rng.integers(0, NUM_ACTIONS, n)),
        old_logprob=torch.full((n,), -float(np.log(NUM_ACTIONS))),
        traj_id=traj,
        group_id=traj // 8,
        traj_return=torch.from_numpy(rng.integers(0, 2, int(traj[-1]) + 1).astype(np.float32))[traj],
        failed=torch.zeros(n, dtype=torch.bool),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int_at_least(1), default=5, help="interleaved rounds per comparison")
    parser.add_argument("--sft-batch", type=int_at_least(1), default=16, help="D1 batch size (configs/local.yaml: 16)")
    parser.add_argument("--sft-steps", type=int_at_least(1), default=5, help="D1 steps timed per round and variant")
    parser.add_argument(
        "--decisions", type=int_at_least(1), default=631, help="decisions per D2 update (make run: about 630)"
    )
    parser.add_argument("--threads", type=int_at_least(0), default=2, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)

    # D1: one model per optimizer, the same batch.
    models = {"default": ViewPolicyModel(RouterConfig()), "fused": ViewPolicyModel(RouterConfig())}
    opts = {
        name: torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01, fused=(name == "fused"))
        for name, m in models.items()
    }
    x = features(args.sft_batch, rng)
    for name in models:  # warm-up: allocate optimizer state
        d1_step_seconds(models[name], opts[name], x, 1)
    d1: dict[str, list[float]] = {name: [] for name in models}
    for r in range(args.rounds):
        for name in models:
            d1[name].append(d1_step_seconds(models[name], opts[name], x, args.sft_steps))
        print(f"D1 round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.3f} s/step" for k, v in d1.items()))

    # D2: two trainers on the same batch. "shared z": the reference is a copy of the model, so its
    # encoder is the model's own; "full ref forward": one encoder weight of the reference is
    # nudged, so the trainer must run the reference's own encoder.
    trainers: dict[str, GRPOUpdater] = {}
    for name in ("shared z", "full ref forward"):
        model = ViewPolicyModel(RouterConfig())
        ref = copy.deepcopy(model)
        if name != "shared z":
            with torch.no_grad():
                ref.parameter_groups()["encoder"][0].add_(1e-3)
        trainers[name] = GRPOUpdater(model, ref, GRPOConfig(device="cpu", update_batch_size=512))
    assert trainers["shared z"].ref_shares_encoder() and not trainers["full ref forward"].ref_shares_encoder()
    batch = grpo_batch(args.decisions, rng)
    d2: dict[str, list[float]] = {name: [] for name in trainers}
    for r in range(args.rounds):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            trainer.update(batch)
            d2[name].append(time.perf_counter() - t0)
        print(f"D2 round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in d2.items()))

    med = {f"d1_{k}_s_per_step": statistics.median(v) for k, v in d1.items()}
    med.update({f"d2_{k.replace(' ', '_')}_s_per_update": statistics.median(v) for k, v in d2.items()})
    result: dict[str, Any] = {
        **{k: round(v, 4) for k, v in med.items()},
        "d1_fused_speedup": round(med["d1_default_s_per_step"] / med["d1_fused_s_per_step"], 2),
        "d2_shared_z_speedup": round(med["d2_full_ref_forward_s_per_update"] / med["d2_shared_z_s_per_update"], 2),
        "sft_batch": args.sft_batch,
        "decisions": args.decisions,
        "threads": args.threads,
    }
    print("RESULT " + json.dumps(result))
    write_result("bench_router_training", result, variant="" if args.threads == 2 else f"threads-{args.threads}")


if __name__ == "__main__":
    main()
