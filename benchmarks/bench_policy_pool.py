"""Does the policy pool keep the GPU busy? (issue 9 item 7; docs/gpu.md "Measured").

Side by side on one GPU (or on the CPU with ``--engine fake``):

* solo: one engine decides one batch of 128 prompts at once (``vllm.LLM.generate`` through
  ``VLLMPolicy``, the offline engine's best case);
* pool: one :class:`~memprism_ray.actors.workers.PolicyReplica` (``AsyncLLM``, one request
  per decision) while 8 rollout-worker-like Ray actors each send groups of 16 decisions,
  step-synchronously (a worker waits for its 16 answers before its next step), through
  :class:`~memprism_ray.actors.services.PolicyPool` exactly as rollout workers do.

Every prompt is distinct -- a MemPrism view of a different seeded ALFWorld-like stream in
the paper's ALFWorld prompt (appendix E.3) -- and nothing is timed twice: repeated prompts
hit vLLM's prefix and image caches and read 3-8x faster (shared/gpu/README.md). Each side
is warmed up on its own prompts first (engine start, torch.compile and CUDA graphs are not
timed). Target: pool decisions/s >= 0.8 x solo. Last line: ``RESULT {json}``.

    python benchmarks/bench_policy_pool.py --engine vllm --model /tmp/memprism-dummy-qwen25vl-7b
    python benchmarks/bench_policy_pool.py --engine fake          # CPU: the same plumbing
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")

import ray  # noqa: E402

from memprism_ray.policy.base import HistoryRecord, PolicyInput  # noqa: E402
from memprism_ray.policy.fake_vllm import fake_engine_factory  # noqa: E402


def make_inputs(n: int, base_seed: int, tag: str, events: int = 20) -> list[PolicyInput]:
    """``n`` distinct decisions: the view of a different seeded stream each, as the agent
    builds its prompt (goal, observation, admissible actions, two history steps, view)."""
    from memprism_ray.composer import compose
    from memprism_ray.composer.synthetic import alfworld_like_stream
    from memprism_ray.render import RenderConfig, render
    from memprism_ray.view_space import ALL_ACTIONS

    cfg = RenderConfig()
    out = []
    for i in range(n):
        seed = base_seed + i
        stream = alfworld_like_stream(events, seed=seed)
        goal = stream.meta.get("goal") or "put a clean mug in cabinet 1"
        records = stream.records
        view = compose(records, ALL_ACTIONS[(seed * 7) % len(ALL_ACTIONS)], goal)
        rendered = render(view, cfg)
        last = records[-1].raw
        history = tuple(
            HistoryRecord(k, r.raw.o_pre, r.raw.action_text, r.raw.feedback)
            for k, r in enumerate(records[-2:], start=len(records) - 2)
        )
        out.append(
            PolicyInput(
                benchmark="alfworld",
                goal=goal,
                observation=f"{last.feedback} (decision {tag}-{i})",
                admissible=("look", "inventory", "go to cabinet 1", "open drawer 2", f"examine mug {seed % 9 + 1}"),
                history=history,
                step=len(records),
                view_image=rendered.image,
                meta={"episode_id": f"{tag}-e{i}"},
            )
        )
    return out


@ray.remote
class Caller:
    """A rollout-worker stand-in: plays its groups step-synchronously through the pool."""

    def __init__(self, handles: list[Any], name: str, timeout_s: float) -> None:
        from memprism_ray.actors.services import PolicyPool

        self.pool = PolicyPool(handles, timeout_s, caller=name)

    def run(self, steps: list[list[PolicyInput]]) -> dict[str, Any]:
        t0 = time.perf_counter()
        valid = failed = 0
        for batch in steps:  # one decision step of the group: wait for all its answers
            for out in self.pool.act(batch):
                if isinstance(out, BaseException):
                    failed += 1
                elif out.valid:
                    valid += 1
        return {"start": t0, "end": time.perf_counter(), "valid": valid, "failed": failed}


@ray.remote
class Solo:
    """One offline engine (``vllm.LLM``) deciding a whole batch, or the fake engine."""

    def __init__(self, vllm_cfg: Any, fake: bool) -> None:
        if fake:
            from memprism_ray.policy.fake_vllm import FakeAsyncEngine
            from memprism_ray.policy.vllm_async import AsyncVLLMPolicy

            self.async_policy = AsyncVLLMPolicy(vllm_cfg, engine=FakeAsyncEngine(**FAKE), sampling_factory=dict)
            self.policy = None
        else:
            from memprism_ray.policy.vllm_backend import VLLMPolicy

            self.policy = VLLMPolicy(vllm_cfg)

    def close(self) -> None:
        """Stop the offline engine's core process so the pool's engine gets the GPU memory."""
        if self.policy is not None:
            self.policy.shutdown()

    def decide(self, inputs: list[PolicyInput]) -> dict[str, Any]:
        import asyncio

        t0 = time.perf_counter()
        if self.policy is not None:
            outs = self.policy.act(inputs)
        else:
            outs = asyncio.run(self.async_policy.act(inputs))
        dt = time.perf_counter() - t0
        prompt_tokens = [o.prompt_tokens for o in outs if getattr(o, "prompt_tokens", None)]
        visual = [o.visual_tokens for o in outs if getattr(o, "visual_tokens", None)]
        return {
            "seconds": dt,
            "n": len(outs),
            "prompt_tokens_mean": statistics.fmean(prompt_tokens) if prompt_tokens else None,
            "visual_tokens_mean": statistics.fmean(visual) if visual else None,
        }


#: Fake engine on the H100's time scale (shared/gpu/README.md: a batch of 256 decisions of 48
#: tokens took ~9 s, ~0.19 s per decode step): 0.15 s + 0.3 ms per running sequence per step.
FAKE = {"step_s": 0.15, "seq_s": 0.0003, "tokens": 48}


def _progress(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("vllm", "fake"), default="vllm")
    p.add_argument("--model", default="/tmp/memprism-dummy-qwen25vl-7b", help="model dir (built if missing)")
    p.add_argument("--workers", type=int, default=8, help="rollout-worker-like callers")
    p.add_argument("--group", type=int, default=16, help="decisions per caller per step (group size)")
    p.add_argument("--steps", type=int, default=2, help="measured decision steps per caller")
    p.add_argument("--max-tokens", type=int, default=48, help="completion tokens (ignore_eos: exactly this many)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="engines without torch.compile and CUDA graphs: a start of seconds instead of about a minute, "
        "for a short device lease; solo and pool both run eager, so the ratio stays side by side",
    )
    args = p.parse_args()

    from memprism_ray.actors.workers import PolicyReplica, stop_policy_replicas
    from memprism_ray.policy.config import PolicyConfig, VLLMConfig

    fake = args.engine == "fake"
    if not fake:
        from memprism_ray.policy.dummy_qwen import build_dummy_qwen25vl

        build_dummy_qwen25vl(args.model)
    vcfg = VLLMConfig(
        model=args.model,
        tokenizer=args.model,
        load_format="dummy",
        chat_template="model" if not fake else "qwen2_vl",
        max_model_len=8192,
        gpu_memory_utilization=args.gpu_memory_utilization,
        limit_mm_per_prompt=1,
        max_pixels=451584,
        max_tokens=args.max_tokens,
        ignore_eos=True,
        enforce_eager=args.enforce_eager,
    )
    policy_cfg = PolicyConfig(backend="vllm", gpus_per_replica=1.0, vllm=vcfg)
    gpus = 0 if fake else 1
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    n_solo = args.workers * args.group

    # Prompts: every timed prompt distinct, warm-up prompts distinct from both.
    t0 = time.perf_counter()
    solo_warm = make_inputs(16, 10_000, "solo-warm")
    solo_inputs = make_inputs(n_solo, 20_000, "solo")
    pool_warm = [make_inputs(args.group, 30_000 + 1000 * w, f"w{w}-warm") for w in range(args.workers)]
    pool_steps = [
        [make_inputs(args.group, 40_000 + 1000 * w + 100 * s, f"w{w}-s{s}") for s in range(args.steps)]
        for w in range(args.workers)
    ]
    prep_s = time.perf_counter() - t0
    # Progress on stdout: an engine start is about a minute, and a run cut short by its time
    # limit should still say how far it got.
    _progress(f"prompts built in {prep_s:.1f}s; starting the solo engine")

    # Solo: one engine, one batch of workers x group prompts.
    solo = Solo.options(num_gpus=gpus, num_cpus=1).remote(vcfg, fake)
    ray.get(solo.decide.remote(solo_warm), timeout=args.timeout)
    _progress(f"solo engine started and warmed up at {time.perf_counter() - t0:.0f}s; timing one batch")
    solo_r = ray.get(solo.decide.remote(solo_inputs), timeout=args.timeout)
    _progress(f"solo: {solo_r['n']} decisions in {solo_r['seconds']:.2f}s; starting the pool's replica")
    ray.get(solo.close.remote(), timeout=120)  # frees the GPU memory for the pool's engine
    ray.kill(solo)
    time.sleep(0 if fake else 5)

    # Pool: one async replica, workers x groups, step-synchronous callers.
    factory = functools.partial(fake_engine_factory, **FAKE)
    replica = PolicyReplica.options(num_gpus=gpus, num_cpus=1, max_concurrency=1024).remote(
        policy_cfg, factory if fake else None
    )
    ray.get(replica.load.remote(), timeout=args.timeout)
    callers = [Caller.options(num_cpus=0.01).remote([replica], f"w{w}", args.timeout) for w in range(args.workers)]
    ray.get([c.run.remote([pool_warm[w]]) for w, c in enumerate(callers)], timeout=args.timeout)
    _progress(f"pool replica started and warmed up at {time.perf_counter() - t0:.0f}s; timing the callers")
    refs = [c.run.remote(pool_steps[w]) for w, c in enumerate(callers)]
    runs = ray.get(refs, timeout=args.timeout)
    pool_s = max(r["end"] for r in runs) - min(r["start"] for r in runs)
    stats = ray.get(replica.stats.remote(), timeout=60)
    record = ray.get(replica.engine_record.remote(), timeout=60) if fake else {}
    decisions = args.workers * args.group * args.steps

    solo_rate = solo_r["n"] / solo_r["seconds"]
    pool_rate = decisions / pool_s
    result = {
        "engine": args.engine,
        "device": _device(fake),
        "model": "7B-shaped Qwen2.5-VL, load_format=dummy" if not fake else f"fake engine {FAKE}",
        "workers": args.workers,
        "group": args.group,
        "steps": args.steps,
        "max_tokens": args.max_tokens,
        "enforce_eager": args.enforce_eager,
        "solo_batch": solo_r["n"],
        "solo_decisions_per_s": round(solo_rate, 2),
        "pool_decisions_per_s": round(pool_rate, 2),
        "ratio": round(pool_rate / solo_rate, 3),
        "target_ratio": 0.8,
        "pool_failed": sum(r["failed"] for r in runs),
        "pool_max_in_flight": stats["max_in_flight"],
        "engine_max_running": record.get("max_running"),
        "prompt_tokens_mean": solo_r["prompt_tokens_mean"],
        "visual_tokens_mean": solo_r["visual_tokens_mean"],
        "prompt_prep_s": round(prep_s, 1),
    }
    print(f"solo: {solo_r['n']} decisions in {solo_r['seconds']:.2f}s = {solo_rate:.1f}/s")
    print(f"pool: {decisions} decisions in {pool_s:.2f}s = {pool_rate:.1f}/s ({args.workers} callers x {args.group})")
    print(f"ratio pool/solo = {pool_rate / solo_rate:.3f} (target >= 0.8)")
    print("RESULT " + json.dumps(result), flush=True)
    stop_policy_replicas([replica])
    ray.shutdown()
    return 0


def _device(fake: bool) -> str:
    if fake:
        return "cpu (fake engine)"
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
