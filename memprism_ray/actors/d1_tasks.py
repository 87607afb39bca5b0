"""D1's Ray tasks (paper "Adapter", decision-conditioned initialisation; appendix A.3
"Cold-start distillation"): reference trajectories, view-teacher labels, the supervised
Router; thin shells over the benchmark and :mod:`memprism_ray.adapter.d1_labels`, driven by
:mod:`memprism_ray.trainer.d1`. Labelling tasks never build a model: a vLLM (or hf) task
policy and the LLM view teacher are served by the policy pool's replicas (docs/gpu.md).
"""

from __future__ import annotations

import io
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from memprism_ray.cluster.node_data import NodeData, on_this_node
from memprism_ray.cluster.placement import set_ray_env

if TYPE_CHECKING:
    from memprism_ray.benchmark import Benchmark
    from memprism_ray.config import ExperimentConfig


def _parquet(dataset: Any) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    if len(dataset):
        pq.write_table(dataset.to_arrow(), buf)
    return buf.getvalue()


@ray.remote(num_cpus=1, max_retries=1)
@on_this_node  # the games, fixtures and releases as this node has them
def reference_task(
    cfg: ExperimentConfig,
    benchmark: Benchmark,
    games: list[dict[str, str]],
    rollin: list[dict[str, str]],
    pool: list[Any] | None = None,
    key: str = "",
    data: NodeData | None = None,
) -> bytes:
    """The benchmark's D1 reference trajectories of ``games`` (plus roll-ins on ``rollin``) as
    expert-trajectory Parquet bytes, re-recorded by the LLM Phi when ``cfg.phi`` asks for one."""
    set_ray_env()
    from memprism_ray.envs.base import GameRef

    phi = None
    if cfg.phi.kind != "rules":
        from memprism_ray.actors.services import build_actor_phi

        phi = build_actor_phi(benchmark, cfg.phi, pool, timeout_s=cfg.run.call_timeout_s, key=key)
    refs = [GameRef.from_dict(g) for g in games]
    return benchmark.reference_table(cfg, refs, [GameRef.from_dict(g) for g in rollin], phi)


def label_policy(cfg: ExperimentConfig, benchmark: Benchmark, pool: list[Any] | None, key: str) -> Any:
    """The task policy a labelling task shows the views to: the scripted one at the labelling
    temperature, else the pool's replicas or the HTTP endpoint (``decision_policy``)."""
    from memprism_ray.actors.services import decision_policy

    contract = benchmark.task_contract()
    if not pool and cfg.policy.backend == "scripted":
        from memprism_ray.adapter.d1_labels import scripted_label_policy

        return scripted_label_policy(cfg, contract)
    return decision_policy(cfg, contract, pool, key, "D1 labelling")


@ray.remote(num_cpus=1, max_retries=1)
@on_this_node  # the scripted stand-in's fixture, as this node has it
def label_task(
    table_bytes: bytes,
    episodes: list[int],
    cfg: ExperimentConfig,
    benchmark: Benchmark,
    pool: list[Any] | None = None,
    key: str = "",
    data: NodeData | None = None,
) -> tuple[bytes, dict[str, int]]:
    """View-teacher labels of some reference episodes: an SFT dataset as Parquet bytes and the
    teacher's counts. ``label.teacher: counterfactual`` shows the task policy each of the 144
    views; ``llm`` asks the benchmark's LLM view teacher once per decision."""
    set_ray_env()
    import pyarrow.parquet as pq

    from memprism_ray.adapter.d1_labels import counterfactual_labels, expert_states, llm_labels
    from memprism_ray.adapter.sft import NoDecisionLabelled
    from memprism_ray.router.encoder import TextEncoder
    from memprism_ray.router.features import FeatureExtractor

    states = expert_states(pq.read_table(io.BytesIO(table_bytes)), episodes)
    extractor = FeatureExtractor(TextEncoder(cfg.encoder))
    try:
        if cfg.label.teacher == "llm":
            complete_many = None
            if pool:
                from memprism_ray.actors.services import PolicyPool

                complete_many = partial(PolicyPool(pool, cfg.run.call_timeout_s, caller=key).complete, group=key)
            with benchmark.llm_teacher(cfg.label.llm) as teacher:
                dataset, counts = llm_labels(states, extractor, teacher, complete_many=complete_many)
        else:
            dataset, counts = counterfactual_labels(
                states,
                extractor,
                label_policy(cfg, benchmark, pool, key),
                cfg.label.counterfactual,
                benchmark=benchmark.name,
                render_config=cfg.render,
                short_history=cfg.agent.short_history,
            )
    except NoDecisionLabelled as exc:  # these episodes only: another task may have labelled its own
        return b"", exc.counts
    return _parquet(dataset), counts


@ray.remote(max_retries=0)
def sft_task(dataset_bytes: bytes, cfg: ExperimentConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the Router on the labels (D1); returns statistics and the checkpoint files, whose
    ``extra`` records the run's config (as a D2 checkpoint's does)."""
    set_ray_env()
    import tempfile
    from dataclasses import replace

    import pyarrow.parquet as pq
    import torch

    from memprism_ray.adapter.checkpoint import checkpoint_sha256, save_checkpoint
    from memprism_ray.adapter.sft import SFTDataset, SFTTrainer
    from memprism_ray.io_atomic import read_files
    from memprism_ray.router.model import ViewPolicyModel

    device = cfg.sft.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
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
        save_checkpoint(Path(tmp), model, trainer=trainer, stage="d1", metrics={"final": final}, extra=extra)
        return {
            "epochs": history,
            "final": final,
            "sha256": checkpoint_sha256(tmp),
            "files": read_files(Path(tmp)),
            "torch_threads": torch.get_num_threads(),
            "seconds": time.perf_counter() - t0,
        }
