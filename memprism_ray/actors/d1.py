"""D1 on Ray: expert trajectories -> view-teacher labels -> supervised Router (paper
"Adapter", decision-conditioned initialisation; appendix A.3 "Cold-start distillation").

Each stage is a Ray task so the driver stays light: expert play and labelling are spread
over CPU workers, the SFT update runs where a GPU is (or on CPU).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import ray

from memprism_ray.actors import waits
from memprism_ray.actors.placement import gpu_request, set_ray_env
from memprism_ray.pipeline.run_dir import write_files


@ray.remote(num_cpus=1, max_retries=1)
def expert_task(games: list[dict[str, str]], max_steps: int = 120) -> bytes:
    """Play ``games`` with ALFWorld's handcoded expert; the trajectories as Parquet bytes."""
    set_ray_env()
    import tempfile

    from memprism_ray.envs.alfworld import collect_expert_trajectories
    from memprism_ray.envs.base import GameRef

    with tempfile.TemporaryDirectory() as tmp:
        path = collect_expert_trajectories(
            [GameRef.from_dict(g) for g in games], tmp, max_steps=max_steps, progress=False
        )
        return Path(path).read_bytes()


@ray.remote(num_cpus=1, max_retries=1)
def label_task(table_bytes: bytes, episodes: list[int], cfg: Any) -> bytes:
    """Counterfactual-teacher labels of some expert episodes; an SFT dataset as Parquet bytes."""
    set_ray_env()
    import pyarrow.parquet as pq

    from memprism_ray.pipeline.labels import counterfactual_labels, expert_states
    from memprism_ray.policy.config import PolicyConfig
    from memprism_ray.policy.factory import make_policy
    from memprism_ray.router.encoder import TextEncoder
    from memprism_ray.router.features import FeatureExtractor

    table = pq.read_table(io.BytesIO(table_bytes))
    states = expert_states(table, episodes)
    if cfg.policy.backend == "scripted":
        policy_cfg = PolicyConfig(
            backend="scripted", scripted={"temperature": cfg.label.policy_temperature, "seed": cfg.run.seed}
        )
    else:
        policy_cfg = cfg.policy
    dataset, _counts = counterfactual_labels(
        states,
        FeatureExtractor(TextEncoder(cfg.encoder)),
        make_policy(policy_cfg),
        render_config=cfg.render,
        short_history=cfg.agent.short_history,
        samples_per_view=cfg.label.samples_per_view,
        cost_temperature=cfg.label.cost_temperature,
    )
    buf = io.BytesIO()
    if len(dataset):
        pq.write_table(dataset.to_arrow(), buf)
    return buf.getvalue()


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

    sft_cfg = replace(cfg.sft, device=device)
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
        return {"epochs": history, "final": final, "sha256": checkpoint_sha256(tmp), "files": read_files(Path(tmp))}


def collect_expert(cfg: Any, games: list[Any], d1_dir: Path, log: Any = print) -> Path:
    """``d1_dir/expert_trajectories.parquet`` from the handcoded expert (reused when present)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = d1_dir / "expert_trajectories.parquet"
    if path.exists():
        log(f"D1: reusing {path}")
        return path
    workers = max(1, min(cfg.label.workers, len(games)))
    chunks = [games[i::workers] for i in range(workers)]
    log(f"D1: expert trajectories on {len(games)} games ({workers} tasks)")
    parts = waits.get(  # bound: one call timeout per game of the largest task
        [expert_task.remote([g.to_dict() for g in c]) for c in chunks if c],
        cfg.run.call_timeout_s * max(len(c) for c in chunks),
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


def label_expert(cfg: Any, expert_path: Path, d1_dir: Path, log: Any = print) -> Path:
    """``d1_dir/labels.parquet``: counterfactual view labels of every expert decision."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = d1_dir / "labels.parquet"
    if path.exists():
        log(f"D1: reusing {path}")
        return path
    table = pq.read_table(expert_path)
    episodes = sorted(set(table.column("episode").to_pylist()))
    workers = max(1, min(cfg.label.workers, len(episodes)))
    log(f"D1: counterfactual view labels for {table.num_rows} decisions ({workers} tasks)")
    ref = ray.put(expert_path.read_bytes())
    parts = waits.get(  # bound: one call timeout per episode of the largest task
        [label_task.remote(ref, episodes[i::workers], cfg) for i in range(workers)],
        cfg.run.call_timeout_s * len(episodes[0::workers]),
        "D1 view-labelling tasks",
    )
    tables = [pq.read_table(io.BytesIO(b)) for b in parts if b]
    if not tables:
        raise RuntimeError("the view teacher labelled no decision: check the task policy and the expert data")
    merged = pa.concat_tables(tables)
    tmp = path.with_suffix(".tmp")
    pq.write_table(merged, tmp)
    tmp.replace(path)
    log(f"D1: {merged.num_rows} labelled decisions")
    return path


def train_d1(cfg: Any, labels_path: Path, ckpt: Path, log: Any = print) -> Path:
    """Supervised Router training on the labels; the checkpoint is written at ``ckpt``."""
    log(f"D1: supervised Router training ({cfg.sft.epochs} epochs)")
    gpus = gpu_request(1.0 if cfg.sft.device in ("auto", "cuda") else 0.0)
    result = waits.get(  # bound: one call timeout per epoch
        sft_task.options(num_gpus=gpus).remote(labels_path.read_bytes(), cfg),
        cfg.run.call_timeout_s * max(1, cfg.sft.epochs),
        "D1 supervised Router training task",
    )
    write_files(result["files"], ckpt)
    log(f"D1: done, final {result['final']}, sha256 {result['sha256'][:12]}")
    return ckpt


def run_d1(cfg: Any, train_games: list[Any], d1_dir: Path, log: Any = print) -> Path:
    """Build the D1 reference policy under ``d1_dir`` (reusing finished stages) and return
    the checkpoint directory."""
    d1_dir.mkdir(parents=True, exist_ok=True)
    ckpt = d1_dir / "checkpoint"
    if (ckpt / "config.json").exists():
        log(f"D1: reusing {ckpt}")
        return ckpt
    expert = collect_expert(cfg, train_games[: cfg.label.games], d1_dir, log)
    labels = label_expert(cfg, expert, d1_dir, log)
    return train_d1(cfg, labels, ckpt, log)
