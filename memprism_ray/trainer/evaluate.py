"""The final evaluation on Ray, for every benchmark (paper appendix C): the benchmark's ordered
plan is split over :class:`~memprism_ray.actors.evaluation.EvalWorker` actors, each playing its
share in waves of ``slots`` episodes with the same decision loop as ``memprism eval``; the
driver gathers the episodes, shows a bar of episodes done / total with the running success
rate, and writes the benchmark's reports. With a model-backed task policy (vllm, hf) the
workers decide through the policy pool's replicas (docs/gpu.md): no evaluation worker builds
a model.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import ray
from tqdm import tqdm

from memprism_ray.actors import waits
from memprism_ray.actors.evaluation import EvalWorker
from memprism_ray.actors.node_data import NodeData
from memprism_ray.actors.placement import actor_name
from memprism_ray.actors.workers import replicas_for, stop_policy_replicas
from memprism_ray.benchmark import Benchmark, EvalPlan
from memprism_ray.benchmark.base import EvalRun, Played
from memprism_ray.trainer.placement_record import PlacementRecord


def router_state_for(cfg: Any, checkpoint: str) -> dict[str, Any] | None:
    """The Router weights (numpy, for the evaluation workers) when ``eval.conditions`` has a
    Router condition, with ``cfg.router`` set to the checkpoint's architecture; ``None``
    otherwise. A Router condition without a checkpoint is a ``ValueError``."""
    if not any(c.startswith(("memprism", "constrained")) for c in cfg.eval.conditions):
        return None
    if not checkpoint:
        raise ValueError("Router conditions need --checkpoint DIR (a D1 or D2 checkpoint directory)")
    from memprism_ray.actors.learner import state_to_numpy
    from memprism_ray.adapter.checkpoint import load_model

    model = load_model(checkpoint)
    cfg.router = model.config
    return state_to_numpy(model.state_dict())


def play_condition(
    workers: list[Any],
    condition: str,
    plan: EvalPlan,
    marginal: list[float] | None,
    timeout_s: float,
    keep_views: int = 0,
    on_results: Any = None,
    on_wait: Any = None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Play ``condition`` on every episode of ``plan``: each worker takes every n-th episode and
    plays its share in waves of ``plan.slots`` (one call per wave, so progress is seen as waves
    finish). Returns one result per planned episode, in plan order, and the step rows. A wave
    whose worker dies or times out (``timeout_s`` per wave of the longest share) fails with the
    reason; a broken game's episodes fail without being played; nothing planned is dropped from
    the denominators. ``on_results(results)`` is called as each wave's results arrive, and
    ``on_wait()`` every 15 s without one (a bar's refresh: no phase is silent)."""
    from memprism_ray.eval.runner import failed_result

    viewed = {s.episode_id for s in plan.specs[:keep_views]}
    specs = [
        {"episode_id": s.episode_id, "game": s.game.to_dict(), "keep_views": s.episode_id in viewed}
        for s in plan.specs
        if s.game.game_id not in plan.broken
    ]
    n = len(workers)
    calls: dict[Any, list[dict[str, Any]]] = {}
    for i, w in enumerate(workers):
        share = specs[i::n]
        for k in range(0, len(share), plan.slots):
            calls[w.play.remote(condition, share[k : k + plan.slots], marginal)] = share[k : k + plan.slots]
    by_spec = {s.episode_id: s for s in plan.specs}
    by_id: dict[str, Any] = {
        s.episode_id: failed_result(s, plan.broken[s.game.game_id]) for s in plan.specs if s.game.game_id in plan.broken
    }
    if on_results and by_id:
        on_results(list(by_id.values()))
    rows: list[dict[str, Any]] = []
    waves = max(1, -(-len(specs[0::n]) // plan.slots)) if specs else 1
    deadline = time.monotonic() + timeout_s * waves
    pending = list(calls)
    while pending:
        left = deadline - time.monotonic()
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, min(15.0, left)))
        if not ready and left > 15.0:
            if on_wait:
                on_wait()
            continue
        if not ready:  # out of time: every wave still out fails
            ready, pending = pending, []
        for ref in ready:
            wave = calls[ref]
            try:
                part = ray.get(ref, timeout=max(0.001, deadline - time.monotonic()))
            except Exception as exc:  # a lost or hung worker: its wave fails, with the reason
                error = f"crashed: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
                part = {"results": [failed_result(by_spec[x["episode_id"]], error) for x in wave], "rows": []}
            by_id.update({r.spec.episode_id: r for r in part["results"]})
            rows.extend(part["rows"])
            if on_results:
                on_results(part["results"])
    lost = "lost: no result came back for this episode"
    return [by_id.get(s.episode_id) or failed_result(s, lost) for s in plan.specs], rows


def evaluate(
    cfg: Any,
    benchmark: Benchmark,
    conditions: tuple[str, ...],
    router_state: dict[str, Any] | None,
    checkpoint: str,
    out_dir: Path,
    *,
    log: Any = print,
    pool: list[Any] | None = None,
    data: NodeData | None = None,
    record: PlacementRecord | None = None,
) -> dict[str, Any]:
    """Evaluate ``conditions`` on the benchmark's plan; every condition plays the same episodes.
    Writes each condition's report and the benchmark's summary under ``out_dir`` and returns the
    summary.

    ``pool``: policy replicas to decide with (a training job passes its own); when the backend
    needs one and none is given, replicas are started here and stopped at the end. ``data``:
    what the workers read, shipped or checked on their nodes; ``record``: where they ran.
    ``freq_random`` samples from the view marginal measured in this run's ``memprism``
    condition (so list ``memprism`` first), as the paper's Frequency-Matched Random does."""
    from memprism_ray.agent import TokenCounter
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.eval.runner import _safe, check_fresh_output, memory_manifest
    from memprism_ray.policy.factory import POOL_BACKENDS
    from memprism_ray.policy.prompts import PROMPT_VERSION
    from memprism_ray.policy.tokens import task_model_of
    from memprism_ray.recorder.phi.factory import phi_id

    check_fresh_output(out_dir)  # before any work: reports are never silently replaced
    plan = benchmark.eval_plan(cfg)
    if plan.broken:
        log(f"{len(plan.broken)} broken game(s) in split {plan.episodes.split!r}: their episodes count as failures")
    log(f"eval: {len(plan.specs)} episodes x {len(conditions)} conditions on {plan.workers} worker(s)")
    needs_router = any(c.startswith(("memprism", "constrained")) for c in conditions)
    state_ref = ray.put(router_state) if (needs_router and router_state is not None) else None
    n_workers = max(1, min(plan.workers, len(plan.specs) or 1))
    handles, started = replicas_for(cfg, pool, cfg.policy.backend in POOL_BACKENDS, log, "the evaluation", data)
    names = [actor_name(cfg.run.name, f"eval-worker-{i}") for i in range(n_workers)]
    workers = [
        # SPREAD: the evaluation's environments share the nodes' cores, as the rollout seats do
        EvalWorker.options(name=name, num_cpus=cfg.rollout.env_cpus, scheduling_strategy="SPREAD").remote(
            cfg, plan.slots, state_ref, handles, f"eval-{i}", data
        )
        for i, name in enumerate(names)
    ]
    try:  # every worker has its data before any episode is dispatched (NodeDataError: one line)
        places = waits.get(
            [w.start.remote() for w in workers], cfg.run.call_timeout_s * 4, "start of the evaluation workers"
        )
    except BaseException:
        for w in workers:
            ray.kill(w)
        stop_policy_replicas(started)
        raise
    if record is not None:
        for name, place in zip(names, places, strict=True):
            record.actor("eval-worker", name, place)
    ctx = EvalRun(plan, cfg, out_dir, TokenCounter(cfg.agent.token_counter, model=task_model_of(cfg.policy)).name)
    reports: list[dict[str, Any]] = []
    played: list[Played] = []
    marginal = None
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for condition in conditions:
            if condition == "freq_random" and marginal is None:
                raise ValueError("freq_random needs a memprism condition before it (its view marginal is sampled)")
            with tqdm(total=len(plan.specs), desc=f"eval {condition}", unit="ep", file=sys.stdout) as bar:
                wins = [0]

                def seen(results: list[Any], bar: Any = bar, wins: list[int] = wins) -> None:
                    wins[0] += sum(bool(r.won and not r.failed) for r in results)
                    bar.update(len(results))
                    bar.set_postfix(sr=f"{wins[0] / max(1, bar.n):.3f}")

                results, rows = play_condition(
                    workers,
                    condition,
                    plan,
                    marginal,
                    cfg.run.call_timeout_s * 20,
                    cfg.eval.artifacts,
                    seen,
                    bar.refresh,
                )
            safe = _safe(condition)
            manifest = RunManifest.create(
                episodes=plan.episodes,
                condition=condition,
                model_ids={"task_policy": cfg.policy.backend, "phi": phi_id(cfg)},
                benchmark=benchmark.name,
                checkpoint_sha256={},
                checkpoints={"router": checkpoint} if (checkpoint and condition.startswith("memprism")) else None,
                prompt_version=PROMPT_VERSION,
                decoding=cfg.policy.decoding(),
                output_paths={"dir": str(out_dir / safe)},
                extra=memory_manifest(condition, cfg.eval.memory),
            )
            played.append(Played(condition, results, rows))
            rep = benchmark.write_condition(played[-1], out_dir / safe, manifest, ctx)
            if condition == "memprism":
                marginal = rep["view_selection"]["view_marginal"]
            reports.append(rep)
            log(f"eval {condition}: {benchmark.condition_line(rep)}")
        return benchmark.write_summary(reports, played, ctx)
    finally:
        for w in workers:
            ray.kill(w)
        stop_policy_replicas(started)
