"""Ray fixtures: one in-process Ray per test session, a tiny job config and a reference
Router checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory: pytest.TempPathFactory):
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def actors_reference_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded, untrained Router saved as a checkpoint (the GRPO reference in tests)."""
    import torch

    from memprism_ray.adapter.checkpoint import save_checkpoint
    from memprism_ray.router.model import RouterConfig, ViewPolicyModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ref") / "ckpt"
    save_checkpoint(path, ViewPolicyModel(RouterConfig()), stage="init")
    return path


def tiny_overrides(corpus: Path, out_dir: Path, name: str) -> list[str]:
    """A job small enough for tests: 2 groups x 3 trajectories, 8 steps, 2 iterations."""
    return [
        "--corpus.data_root",
        str(corpus),
        "--run.out_dir",
        str(out_dir),
        "--run.name",
        name,
        "--run.checkpoint_every",
        "1",
        "--run.tensorboard",
        "false",
        "--run.call_timeout_s",
        "120",
        "--agent.max_steps",
        "8",
        "--grpo.max_steps",
        "8",
        "--grpo.iterations",
        "2",
        "--grpo.groups_per_iteration",
        "2",
        "--grpo.group_size",
        "3",
        "--grpo.update_batch_size",
        "16",
        "--rollout.num_workers",
        "1",
        "--rollout.env_slots_per_worker",
        "3",
        "--label.games",
        "2",
        "--label.workers",
        "1",
        "--sft.epochs",
        "1",
        "--eval.enabled",
        "false",
    ]


@pytest.fixture(scope="session")
def actors_tiny_cfg(memprism_tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory):
    from memprism_ray.config import load_config

    out = tmp_path_factory.mktemp("runs")
    return load_config("configs/local.yaml", tiny_overrides(memprism_tiny_corpus, out, "tiny"))
