"""D1 on Ray: expert trajectories -> view-teacher labels -> supervised Router (paper
"Adapter", decision-conditioned initialisation; appendix A.3 "Cold-start distillation").

Each stage is a Ray task so the driver stays light: expert play and labelling are spread
over CPU workers, the SFT update runs on ``rollout.learner_gpus`` of a GPU or on CPU.
Labelling tasks never build a model: with a vLLM (or hf) task policy they reach the policy
pool's replicas (docs/gpu.md), which also serve the LLM view teacher
(``label.teacher: llm``, ``label.llm_source: pool``); the number of policy calls is printed
before labelling starts.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import ray

from memprism_ray.actors import waits
from memprism_ray.actors.placement import learner_options, set_ray_env
from memprism_ray.actors.workers import replicas_for, stop_policy_replicas
from memprism_ray.pipeline.run_dir import write_files


@ray.remote(num_cpus=1, max_retries=1)
def expert_task(
    games: list[dict[str, str]],
    max_steps: int = 120,
    phi_config: Any = None,
    pool: list[Any] | None = None,
    key: str = "phi-d1",
    timeout_s: float = 300.0,
    rollin: list[dict[str, str]] | None = None,
    cfg: Any = None,
) -> bytes:
    """Play ``games`` with ALFWorld's handcoded expert; the trajectories as Parquet bytes,
    re-extracted by the LLM Phi when ``phi_config`` asks for one (``phi.kind: llm``; served by
    ``pool`` with ``phi.llm_source: pool``). ``rollin`` games are then played by the scripted
    task policy under a random view per step (``label.rollin_games``; ``cfg`` gives its
    temperature, seed, steps and render settings)."""
    set_ray_env()
    import tempfile

    from memprism_ray.envs.alfworld import collect_expert_trajectories
    from memprism_ray.envs.base import GameRef

    rollin_args: dict[str, Any] = {}
    if rollin:
        from memprism_ray.pipeline.labels import rollin_chooser

        rollin_args = {
            "rollin_games": [GameRef.from_dict(g) for g in rollin],
            "choose": rollin_chooser(
                scripted_label_policy(cfg), cfg.render, seed=cfg.run.seed, short_history=cfg.agent.short_history
            ),
            "rollin_steps": cfg.agent.max_steps,
        }

    phi = None
    if phi_config is not None and phi_config.kind != "rules":
        from memprism_ray.actors.services import build_actor_phi

        phi = build_actor_phi("alfworld", phi_config, pool, timeout_s=timeout_s, key=key)
    with tempfile.TemporaryDirectory() as tmp:
        path = collect_expert_trajectories(
            [GameRef.from_dict(g) for g in games],
            tmp,
            max_steps=max_steps,
            progress=False,
            phi=phi,
            **rollin_args,
        )
        return Path(path).read_bytes()


#: Backends whose model lives in the policy pool's replicas (never in a labelling task).
POOL_BACKENDS = ("vllm", "hf")


def phi_uses_pool(cfg: Any) -> bool:
    """Whether an LLM Phi is served by the policy pool (``phi.llm_source: pool``)."""
    return cfg.phi.kind == "llm" and cfg.phi.llm_source == "pool"


def uses_pool(cfg: Any) -> bool:
    """Whether D1 labelling needs the policy pool (a model-backed policy, or the LLM teacher
    served by the pool)."""
    if cfg.label.teacher == "llm":
        return cfg.label.llm_source == "pool"
    return cfg.policy.backend in POOL_BACKENDS


def scripted_label_policy(cfg: Any) -> Any:
    """The scripted task policy D1 labels with and plays its roll-ins with: the labelling
    temperature (``label.policy_temperature``) and the run's seed."""
    from memprism_ray.policy.config import PolicyConfig
    from memprism_ray.policy.factory import make_policy

    scripted = {"temperature": cfg.label.policy_temperature, "seed": cfg.run.seed}
    return make_policy(PolicyConfig(backend="scripted", scripted=scripted))


def _pool(handles: list[Any], cfg: Any, key: str) -> Any:
    from memprism_ray.actors.services import PolicyPool

    return PolicyPool(handles, cfg.run.call_timeout_s, caller=key)


@ray.remote(num_cpus=1, max_retries=1)
def label_task(
    table_bytes: bytes, episodes: list[int], cfg: Any, pool: list[Any] | None = None, key: str = ""
) -> bytes:
    """Counterfactual-teacher labels of some expert episodes; an SFT dataset as Parquet bytes.
    With ``pool`` (replica handles) every policy call goes to the pool as group ``key``."""
    set_ray_env()
    import pyarrow.parquet as pq

    from memprism_ray.pipeline.labels import counterfactual_labels, expert_states
    from memprism_ray.policy.factory import make_policy
    from memprism_ray.policy.factory import needs_view_text as policy_needs_view_text
    from memprism_ray.router.encoder import TextEncoder
    from memprism_ray.router.features import FeatureExtractor

    table = pq.read_table(io.BytesIO(table_bytes))
    states = expert_states(table, episodes)
    if pool:
        from memprism_ray.actors.services import PoolPolicy

        policy: Any = PoolPolicy(_pool(pool, cfg, key), key, policy_needs_view_text(cfg.policy))
    elif cfg.policy.backend == "scripted":
        policy = scripted_label_policy(cfg)
    elif cfg.policy.backend in POOL_BACKENDS:
        raise ValueError(f"policy.backend={cfg.policy.backend}: D1 labelling runs on the policy pool, none was given")
    else:
        policy = make_policy(cfg.policy)  # an HTTP client (openai backend): no model in this task
    dataset, _counts = counterfactual_labels(
        states,
        FeatureExtractor(TextEncoder(cfg.encoder)),
        policy,
        render_config=cfg.render,
        short_history=cfg.agent.short_history,
        samples_per_view=cfg.label.samples_per_view,
        cost_temperature=cfg.label.cost_temperature,
        uninformative=cfg.label.uninformative,
        tie_break_temperature=cfg.label.tie_break_temperature,
        page_token_temperature=cfg.label.page_token_temperature,
    )
    buf = io.BytesIO()
    if len(dataset):
        pq.write_table(dataset.to_arrow(), buf)
    return buf.getvalue()


def llm_teacher_config(cfg: Any) -> Any:
    from memprism_ray.router.teacher import LLMTeacherConfig

    lab = cfg.label
    return LLMTeacherConfig(
        base_url=lab.llm_base_url,
        model=lab.llm_model if lab.llm_source == "endpoint" else (lab.llm_model or "policy-pool"),
        prompt="generic",
        top_k=lab.top_k,
        max_tokens=lab.llm_max_tokens,
        timeout_s=cfg.run.call_timeout_s,
    )


@ray.remote(num_cpus=1, max_retries=1)
def llm_label_task(
    table_bytes: bytes, episodes: list[int], cfg: Any, pool: list[Any] | None = None, key: str = ""
) -> tuple[bytes, dict[str, int]]:
    """LLM-view-teacher labels of some expert episodes (one teacher call per decision,
    paper appendix D.2): an SFT dataset as Parquet bytes and the labelling counts."""
    set_ray_env()
    import pyarrow.parquet as pq

    from memprism_ray.pipeline.labels import expert_states
    from memprism_ray.pipeline.llm_labels import llm_labels
    from memprism_ray.router.encoder import TextEncoder
    from memprism_ray.router.features import FeatureExtractor
    from memprism_ray.router.teacher import LLMViewTeacher

    table = pq.read_table(io.BytesIO(table_bytes))
    states = expert_states(table, episodes)
    complete_many = None
    if pool:
        policy_pool = _pool(pool, cfg, key)

        def complete_many(prompts: list[str]) -> list[Any]:
            return policy_pool.complete(prompts, max_tokens=cfg.label.llm_max_tokens, temperature=0.0, group=key)

    with LLMViewTeacher(llm_teacher_config(cfg)) as teacher:
        dataset, counts = llm_labels(
            states,
            FeatureExtractor(TextEncoder(cfg.encoder)),
            teacher,
            complete_many=complete_many,
            concurrency=cfg.label.llm_concurrency,
        )
    buf = io.BytesIO()
    if len(dataset):
        pq.write_table(dataset.to_arrow(), buf)
    return buf.getvalue(), counts


@ray.remote(max_retries=0)
def sft_task(dataset_bytes: bytes, cfg: Any) -> dict[str, Any]:
    """Train the Router on the labels (D1); returns statistics and the checkpoint files."""
    set_ray_env()
    import tempfile

    import pyarrow.parquet as pq
    import torch

    from memprism_ray.adapter.checkpoint import checkpoint_sha256, save_checkpoint
    from memprism_ray.adapter.sft import SFTDataset, SFTTrainer
    from memprism_ray.pipeline.run_dir import read_files
    from memprism_ray.router.model import ViewPolicyModel

    device = cfg.sft.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    from dataclasses import replace

    t0 = time.perf_counter()
    sft_cfg = replace(cfg.sft, device=device)
    if cfg.rollout.learner_threads > 0:  # D1 runs alone: nothing else computes until it ends
        torch.set_num_threads(cfg.rollout.learner_threads)
    torch.manual_seed(sft_cfg.seed)
    dataset = SFTDataset.from_arrow(pq.read_table(io.BytesIO(dataset_bytes)))
    model = ViewPolicyModel(cfg.router)
    trainer = SFTTrainer(model, dataset, sft_cfg)
    history = []
    while not trainer.done:
        history.append(trainer.train_epoch())
    final = trainer.evaluate()
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(Path(tmp), model, trainer=trainer, stage="d1", metrics={"final": final})
        return {
            "epochs": history,
            "final": final,
            "sha256": checkpoint_sha256(tmp),
            "files": read_files(Path(tmp)),
            "torch_threads": torch.get_num_threads(),
            "seconds": time.perf_counter() - t0,
        }


def collect_expert(
    cfg: Any,
    games: list[Any],
    d1_dir: Path,
    log: Any = print,
    pool: list[Any] | None = None,
    rollin_games: list[Any] | None = None,
) -> Path:
    """``d1_dir/expert_trajectories.parquet`` from the handcoded expert (reused when present);
    ``pool``: the replicas an LLM Phi with ``phi.llm_source: pool`` re-extracts the streams on;
    ``rollin_games``: games the scripted task policy plays itself (``label.rollin_games``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = d1_dir / "expert_trajectories.parquet"
    if path.exists():
        log(f"D1: reusing {path}")
        return path
    rollin_games = rollin_games or []
    workers = max(1, min(cfg.label.workers, len(games)))
    chunks = [games[i::workers] for i in range(workers)]
    rollins = [rollin_games[i::workers] for i in range(workers)]
    extra = f" and the task policy's own play of {len(rollin_games)} more (roll-in)" if rollin_games else ""
    log(f"D1: expert trajectories on {len(games)} games{extra} ({workers} tasks)")
    parts = waits.get(  # bound: one call timeout per game of the largest task
        [
            expert_task.remote(
                [g.to_dict() for g in c],
                120,
                cfg.phi,
                pool,
                f"phi-d1-{i}",
                cfg.run.call_timeout_s,
                [g.to_dict() for g in rollins[i]],
                cfg,
            )
            for i, c in enumerate(chunks)
            if c
        ],
        cfg.run.call_timeout_s * max(len(c) + len(r) for c, r in zip(chunks, rollins, strict=True)),
        "D1 expert-trajectory tasks",
    )
    tables, offset = [], 0
    for blob in parts:  # episode numbers are per task: make them global
        t = pq.read_table(io.BytesIO(blob))
        eps = t.column("episode").to_pylist()
        col = pa.array([e + offset for e in eps], pa.int32())
        t = t.set_column(t.column_names.index("episode"), "episode", col)
        offset += (max(eps) + 1) if eps else 0
        tables.append(t.replace_schema_metadata(None))
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.concat_tables(tables), tmp)
    tmp.replace(path)
    return path


def policy_calls_per_decision(cfg: Any) -> int:
    """Policy (or teacher) calls per expert decision: 1 for the LLM teacher, 144 x S for the
    counterfactual teacher."""
    from memprism_ray.pipeline.llm_labels import policy_calls

    return policy_calls(cfg.label.teacher, 1, samples_per_view=cfg.label.samples_per_view)


def rollins_apply(cfg: Any) -> bool:
    """Whether D1 plays ``label.rollin_games`` roll-ins: only the counterfactual teacher on
    the scripted policy has them (a roll-in through the policy pool is not built)."""
    return bool(cfg.label.rollin_games) and cfg.label.teacher == "counterfactual" and cfg.policy.backend == "scripted"


def d1_cost_line(cfg: Any) -> str:
    """What D1 labelling will cost, printed before D1 starts."""
    per = policy_calls_per_decision(cfg)
    where = {
        "endpoint": f"the endpoint {cfg.label.llm_base_url}",
        "pool": f"the policy pool ({cfg.policy.num_replicas} {cfg.policy.backend} replicas)",
    }[cfg.label.llm_source]
    served = where if cfg.label.teacher == "llm" else f"the task policy ({cfg.policy.backend})"
    how = "one call per decision" if cfg.label.teacher == "llm" else f"144 views x {cfg.label.samples_per_view} samples"
    return (
        f"D1: {cfg.label.teacher} view teacher on {served}: {per} policy call(s) per expert decision ({how}) "
        f"over the expert trajectories of {cfg.label.games} games"
        + (f" and the task policy's roll-ins on {cfg.label.rollin_games} more" if rollins_apply(cfg) else "")
        + "; the exact count follows once they are played"
    )


def label_expert(cfg: Any, expert_path: Path, d1_dir: Path, log: Any = print, pool: list[Any] | None = None) -> Path:
    """``d1_dir/labels.parquet``: view-teacher labels of every expert decision.

    With a pool-backed policy or teacher, ``pool`` (replica handles) is used, or replicas
    are started for labelling and stopped afterwards."""
    import pyarrow.parquet as pq

    path = d1_dir / "labels.parquet"
    if path.exists():
        log(f"D1: reusing {path}")
        return path
    table = pq.read_table(expert_path)
    episodes = sorted(set(table.column("episode").to_pylist()))
    workers = max(1, min(cfg.label.workers, len(episodes)))
    calls = table.num_rows * policy_calls_per_decision(cfg)
    log(
        f"D1: {cfg.label.teacher} view labels for {table.num_rows} decisions: {calls} policy calls "
        f"({workers} tasks)"
    )
    handles, started = replicas_for(cfg, pool, uses_pool(cfg), log, "D1 labelling")
    ref = ray.put(expert_path.read_bytes())
    bound = cfg.run.call_timeout_s * len(episodes[0::workers])  # one call timeout per episode of the largest task
    try:
        if cfg.label.teacher == "llm":
            results = waits.get(
                [llm_label_task.remote(ref, episodes[i::workers], cfg, handles, f"d1-{i}") for i in range(workers)],
                bound,
                "D1 LLM view-teacher labelling tasks",
            )
            parts = [b for b, _ in results]
            totals: dict[str, int] = {}
            for _, counts in results:
                for k, v in counts.items():
                    totals[k] = totals.get(k, 0) + v
            log(f"D1: teacher counts {totals}")
        else:
            parts = waits.get(
                [label_task.remote(ref, episodes[i::workers], cfg, handles, f"d1-{i}") for i in range(workers)],
                bound,
                "D1 view-labelling tasks",
            )
    finally:
        stop_policy_replicas(started)
    return write_labels(parts, path, log, "check the task policy and the expert data")


def write_labels(parts: list[bytes], path: Path, log: Any = print, hint: str = "") -> Path:
    """The labelling tasks' Parquet parts (empty ones skipped) written atomically as ``path``;
    a run that labelled nothing is an error (``hint``: what to check)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memprism_ray.io_atomic import atomic_write_bytes

    tables = [pq.read_table(io.BytesIO(b)) for b in parts if b]
    if not tables:
        raise RuntimeError(f"the view teacher labelled no decision: {hint or 'check the task policy'}")
    merged = pa.concat_tables(tables)
    buf = io.BytesIO()
    pq.write_table(merged, buf)
    atomic_write_bytes(path, buf.getvalue(), overwrite=True)
    log(f"D1: {merged.num_rows} labelled decisions")
    return path


def train_d1(cfg: Any, labels_path: Path, ckpt: Path, log: Any = print) -> Path:
    """Supervised Router training on the labels; the checkpoint is written at ``ckpt``."""
    log(f"D1: supervised Router training ({cfg.sft.epochs} epochs)")
    result = waits.get(  # bound: one call timeout per epoch
        sft_task.options(**learner_options(cfg)).remote(labels_path.read_bytes(), cfg),
        cfg.run.call_timeout_s * max(1, cfg.sft.epochs),
        "D1 supervised Router training task",
    )
    write_files(result["files"], ckpt)
    log(
        f"D1: done in {result['seconds']:.0f} s on {result['torch_threads']} torch thread(s), final {result['final']}, "
        f"sha256 {result['sha256'][:12]}"
    )
    return ckpt


def run_d1(cfg: Any, train_games: list[Any], d1_dir: Path, log: Any = print, pool: list[Any] | None = None) -> Path:
    """Build the D1 reference policy under ``d1_dir`` (reusing finished stages) and return
    the checkpoint directory. ``pool``: policy replicas to label with (else started when
    needed)."""
    d1_dir.mkdir(parents=True, exist_ok=True)
    ckpt = d1_dir / "checkpoint"
    if (ckpt / "config.json").exists():
        log(f"D1: reusing {ckpt}")
        return ckpt
    labels = build_d1_data(cfg, train_games, d1_dir, log, pool)
    return train_d1(cfg, labels, ckpt, log)


def build_d1_data(
    cfg: Any, train_games: list[Any], d1_dir: Path, log: Any = print, pool: list[Any] | None = None
) -> Path:
    """The D1 data under ``d1_dir`` (reusing finished stages): the expert on the first
    ``label.games`` of ``train_games``, the roll-ins on the next ``label.rollin_games``, and
    the view teacher's labels of every decision. Returns ``labels.parquet``'s path. Both the
    GRPO job and ``jobs/label_views.py`` build it here, so a D1 directory (keyed by the
    config) holds the same data whichever wrote it."""
    d1_dir.mkdir(parents=True, exist_ok=True)
    # With the LLM Phi on the pool, the replicas started for it also serve the labelling.
    needed = phi_uses_pool(cfg) and not (d1_dir / "expert_trajectories.parquet").exists()
    phi_pool, started = replicas_for(cfg, pool, needed, log, "the D1 LLM Phi")
    try:
        games = cfg.label.games
        rollin = train_games[games : games + cfg.label.rollin_games]
        if rollin and not rollins_apply(cfg):
            # A roll-in through the policy pool is not built: say so rather than drop it quietly.
            log(
                f"D1: label.rollin_games={cfg.label.rollin_games} skipped: roll-ins need the counterfactual teacher "
                f"on the scripted policy (this run: {cfg.label.teacher} teacher, {cfg.policy.backend} policy)"
            )
            rollin = []
        elif len(rollin) < cfg.label.rollin_games:
            log(f"D1: only {len(rollin)} training games left for label.rollin_games={cfg.label.rollin_games}")
        expert = collect_expert(cfg, train_games[:games], d1_dir, log, phi_pool, rollin)
        return label_expert(cfg, expert, d1_dir, log, pool or phi_pool)
    finally:
        stop_policy_replicas(started)
