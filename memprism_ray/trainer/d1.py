"""D1, one path for every benchmark (paper "Adapter", decision-conditioned initialisation;
appendix A.3 "Cold-start distillation"; Table A.4 "D1, ALFWorld", "D1, ALFRED path",
"D1, Mind2Web"): reference trajectories, the view teacher's labels (the LLM teacher is
appendix E.2) and the supervised Router, each stage reused when its file exists.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from memprism_ray.actors.d1_tasks import label_task, reference_task, sft_task
from memprism_ray.actors.workers import replicas_for, stop_policy_replicas
from memprism_ray.adapter.checkpoint import CONFIG_FILE
from memprism_ray.benchmark import Benchmark
from memprism_ray.cluster import waits
from memprism_ray.cluster.node_data import NodeData
from memprism_ray.cluster.placement import learner_options
from memprism_ray.io_atomic import write_files
from memprism_ray.trainer.run_dir import checkpoint_extra
from memprism_ray.view_space import ALL_ACTIONS

if TYPE_CHECKING:
    from memprism_ray.config import ExperimentConfig


#: D1's stages under its directory, each reused when there: the labels, then the checkpoint.
LABELS = "labels.parquet"


def labelled(d1_dir: Path) -> bool:
    """Whether D1 under ``d1_dir`` is past labelling (its labels or its checkpoint are there)."""
    return (d1_dir / LABELS).exists() or (d1_dir / "checkpoint" / CONFIG_FILE).exists()


def policy_calls_per_decision(cfg: ExperimentConfig) -> int:
    """Policy (or teacher) calls per reference decision (144 x S for the counterfactual teacher)."""
    from memprism_ray.adapter.d1_labels import policy_calls

    cf = cfg.label.counterfactual
    views = len(cf.candidates or ALL_ACTIONS)
    return policy_calls(cfg.label.teacher, 1, samples_per_view=cf.samples_per_view, candidates=views)


def d1_cost_line(cfg: ExperimentConfig, benchmark: Benchmark) -> str:
    """What D1 labelling will cost, printed before D1 starts."""
    lab = cfg.label
    where = {
        "endpoint": f"the endpoint {lab.llm.base_url}",
        "pool": f"the policy pool ({cfg.policy.num_replicas} {cfg.policy.backend} replicas)",
    }[lab.llm.source]
    served = where if lab.teacher == "llm" else f"the task policy ({cfg.policy.backend})"
    cf = lab.counterfactual
    views = len(cf.candidates or ALL_ACTIONS)
    how = "one call per decision" if lab.teacher == "llm" else f"{views} views x {cf.samples_per_view} samples"
    rollins = benchmark.rollins_apply(cfg)
    return (
        f"D1: {lab.teacher} view teacher on {served}: {policy_calls_per_decision(cfg)} policy call(s) per "
        f"reference decision ({how}) over the {benchmark.reference_source} of {lab.games} {benchmark.task_noun}"
        + (f" and the task policy's roll-ins on {lab.rollin_games} more" if rollins else "")
        + "; the exact count follows once they are played"
    )


def collect_reference(
    cfg: ExperimentConfig,
    benchmark: Benchmark,
    games: list[Any],
    rollin_games: list[Any],
    d1_dir: Path,
    log: Any = print,
    pool: list[Any] | None = None,
    data: NodeData | None = None,
) -> Path:
    """``d1_dir/expert_trajectories.parquet``: the reference trajectories of ``games`` and the
    roll-ins on ``rollin_games``, over ``label.workers`` tasks (reused when present)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = d1_dir / "expert_trajectories.parquet"
    if path.exists():
        log(f"D1: reusing {path}")
        return path
    workers = max(1, min(cfg.label.workers, len(games)))
    chunks = [games[i::workers] for i in range(workers)]
    rollins = [rollin_games[i::workers] for i in range(workers)]
    extra = f" and the task policy's own play of {len(rollin_games)} more (roll-in)" if rollin_games else ""
    log(f"D1: {benchmark.reference_source} of {len(games)} {benchmark.task_noun}{extra} ({workers} tasks)")
    refs = [
        reference_task.remote(
            cfg, benchmark, [g.to_dict() for g in c], [g.to_dict() for g in rollins[i]], pool, f"phi-d1-{i}", data
        )
        for i, c in enumerate(chunks)
        if c
    ]
    # bound: one call timeout per game of the largest task
    bound = cfg.run.call_timeout_s * max(len(c) + len(r) for c, r in zip(chunks, rollins, strict=True))
    parts = waits.get_reporting(refs, bound, "D1: reference-trajectory tasks", log)
    tables, offset = [], 0
    for blob in parts:  # episode numbers are per task: make them global
        t = pq.read_table(io.BytesIO(blob))
        eps = t.column("episode").to_pylist()
        col = pa.array([e + offset for e in eps], pa.int32())
        t = t.set_column(t.column_names.index("episode"), "episode", col)
        offset += (max(eps) + 1) if eps else 0
        tables.append(t.replace_schema_metadata(None))
    merged = pa.concat_tables(tables)
    say_phi_fallbacks(merged, log)
    tmp = path.with_suffix(".tmp")
    pq.write_table(merged, tmp)
    tmp.replace(path)
    return path


def say_phi_fallbacks(table: Any, log: Any) -> None:
    """A line when an LLM Phi fell back to the rules on reference events (their evidence says
    why; docs/phi.md): D1 then labels streams the rules partly wrote."""
    import json

    reasons = [
        json.loads(e).get("phi_fallback")
        for e in table.column("evidence_json").to_pylist()
        if e and "phi_fallback" in e  # the cheap test first: most events have none
    ]
    reasons = [r for r in reasons if r]
    if reasons:
        from memprism_ray.recorder.phi.llm import fallbacks_said

        log(f"D1: {fallbacks_said(len(reasons), reasons[0], f'of {table.num_rows} reference event(s)')}")


class NothingLabelled(RuntimeError):
    """No D1 labelling task labelled a decision (a one-line failure of the job)."""


def label_reference(
    cfg: ExperimentConfig,
    benchmark: Benchmark,
    expert_path: Path,
    d1_dir: Path,
    log: Any = print,
    pool: list[Any] | None = None,
    data: NodeData | None = None,
) -> Path:
    """``d1_dir/labels.parquet``: view-teacher labels of every reference decision, on ``pool`` or
    on replicas started for labelling when the policy or teacher needs them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memprism_ray.io_atomic import atomic_write_bytes
    from memprism_ray.policy.config import POOL_BACKENDS

    path = d1_dir / LABELS
    if path.exists():
        log(f"D1: reusing {path}")
        return path
    table = pq.read_table(expert_path)
    episodes = sorted(set(table.column("episode").to_pylist()))
    workers = max(1, min(cfg.label.workers, len(episodes)))
    calls = table.num_rows * policy_calls_per_decision(cfg)
    log(f"D1: {cfg.label.teacher} view labels for {table.num_rows} decisions: {calls} policy calls ({workers} tasks)")
    # The pool serves a model-backed policy, or the LLM teacher with label.llm.source: pool.
    uses_pool = cfg.label.llm.source == "pool" if cfg.label.teacher == "llm" else cfg.policy.backend in POOL_BACKENDS
    handles, started = replicas_for(cfg, benchmark, pool, uses_pool, log, "D1 labelling", data)
    ref = ray.put(expert_path.read_bytes())
    bound = cfg.run.call_timeout_s * len(episodes[0::workers])  # one call timeout per episode of the largest task
    try:
        results = waits.get_reporting(
            [
                label_task.remote(ref, episodes[i::workers], cfg, benchmark, handles, f"d1-{i}", data)
                for i in range(workers)
            ],
            bound,
            f"D1: {cfg.label.teacher} view-labelling tasks",
            log,
        )
    finally:
        stop_policy_replicas(started)
    totals: dict[str, int] = {}
    for _, counts in results:
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
    log(f"D1: teacher counts {totals}")
    tables = [pq.read_table(io.BytesIO(b)) for b, _ in results if b]  # empty parts skipped
    if not tables:
        raise NothingLabelled(
            f"D1: the view teacher labelled none of the {totals.get('decisions', 0)} reference decisions "
            f"({totals}; fallback_skipped: every view gave the same action): label more games (label.games, "
            "label.rollin_games), or check the task policy and the reference data"
        )
    merged = pa.concat_tables(tables)
    buf = io.BytesIO()
    pq.write_table(merged, buf)
    atomic_write_bytes(path, buf.getvalue(), overwrite=True)
    log(f"D1: {merged.num_rows} labelled decisions")
    return path


def train_d1(cfg: ExperimentConfig, labels_path: Path, ckpt: Path, log: Any = print) -> Path:
    """Supervised Router training on the labels; the checkpoint is written at ``ckpt``."""
    log(f"D1: supervised Router training ({cfg.sft.epochs} epochs)")
    (result,) = waits.get_reporting(  # bound: one call timeout per epoch
        [sft_task.options(**learner_options(cfg)).remote(labels_path.read_bytes(), cfg, checkpoint_extra(cfg))],
        cfg.run.call_timeout_s * max(1, cfg.sft.epochs),
        "D1: supervised Router training task",
        log,
    )
    write_files(result["files"], ckpt)
    log(
        f"D1: done in {result['seconds']:.0f} s on {result['torch_threads']} torch thread(s), final {result['final']}, "
        f"sha256 {result['sha256'][:12]}"
    )
    return ckpt


def run_d1(
    cfg: ExperimentConfig,
    benchmark: Benchmark,
    d1_dir: Path,
    log: Any = print,
    data: NodeData | None = None,
    *,
    train: bool = True,
) -> Path:
    """D1 under ``d1_dir`` (reusing finished stages) on the first ``label.games`` of the
    benchmark's D1 tasks and roll-ins on the next ``label.rollin_games``: the checkpoint dir, or
    without ``train`` ``labels.parquet``'s path. Every job builds D1 here, so a D1 directory
    holds the same data whichever wrote it."""
    d1_dir.mkdir(parents=True, exist_ok=True)
    ckpt = d1_dir / "checkpoint"
    if train and (ckpt / CONFIG_FILE).exists():
        log(f"D1: reusing {ckpt}")
        return ckpt
    # With the LLM Phi on the pool, the replicas started for it also serve the labelling.
    needed = cfg.phi.kind == "llm" and cfg.phi.llm_source == "pool"
    needed = needed and not (d1_dir / "expert_trajectories.parquet").exists()
    phi_pool, started = replicas_for(cfg, benchmark, None, needed, log, "the D1 LLM Phi", data)
    try:
        games = benchmark.d1_games(cfg)
        n = cfg.label.games
        rollin = games[n : n + cfg.label.rollin_games]
        if rollin and not benchmark.rollins_apply(cfg):
            # Roll-ins exist only for the scripted policy under the counterfactual teacher: say so.
            log(
                f"D1: label.rollin_games={cfg.label.rollin_games} skipped: roll-ins need the counterfactual teacher "
                f"on the scripted policy of a benchmark that has them (this run: {benchmark.name}, "
                f"{cfg.label.teacher} teacher, {cfg.policy.backend} policy)"
            )
            rollin = []
        elif len(rollin) < cfg.label.rollin_games:
            log(f"D1: only {len(rollin)} training games left for label.rollin_games={cfg.label.rollin_games}")
        expert = collect_reference(cfg, benchmark, games[:n], rollin, d1_dir, log, phi_pool, data)
        labels = label_reference(cfg, benchmark, expert, d1_dir, log, phi_pool, data)
    finally:
        stop_policy_replicas(started)
    return train_d1(cfg, labels, ckpt, log) if train else labels
