"""Fixtures shared across test packages.

``memprism_tiny_corpus``: one tiny generated ALFWorld corpus (6 train games, one per task
type, 6 + 6 eval games), built once and cached under ``$MEMPRISM_TEST_CACHE`` (default
``~/.cache/memprism/tests``) so repeated runs and every test package reuse it; its
content is a function of the seed only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs on the Ray instances and clusters it starts itself, whatever cluster the shell
# names: with RAY_ADDRESS exported (a stopped cluster's, or a live one), the jobs it runs in
# process would join that one or refuse to start. Tests that join a cluster set it themselves.
os.environ.pop("RAY_ADDRESS", None)

TINY_CORPUS = {"train": 6, "eval": 6, "seed": 11}


def test_cache_dir() -> Path:
    return Path(os.environ.get("MEMPRISM_TEST_CACHE") or Path.home() / ".cache" / "memprism" / "tests")


@pytest.fixture(scope="session")
def memprism_tiny_corpus() -> Path:
    from memprism_ray.benchmark.alfworld import ensure_default_corpus
    from memprism_ray.benchmark.alfworld.corpus import default_cache_dir

    c = TINY_CORPUS
    # Where a job's embedded corpus with these sizes lives under --corpus.cache_dir test_cache_dir():
    # the multi-node tests run jobs on it as the embedded corpus (shipped to the nodes).
    root = default_cache_dir(c["seed"], c["train"], c["eval"], base=test_cache_dir())
    return ensure_default_corpus(root, train=c["train"], eval=c["eval"], seed=c["seed"], workers=2, progress=False)


@pytest.fixture(scope="session")
def memprism_test_cache() -> Path:
    """:func:`test_cache_dir`, for test modules outside this file."""
    return test_cache_dir()


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory: pytest.TempPathFactory):
    import ray

    from memprism_ray.cluster.placement import init_ray

    # The same loopback-only local instance the jobs start (issue 10: no listener off 127.0.0.1).
    init_ray(address="local", num_cpus=2, log_to_driver=False)
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
        "--label.rollin_games",
        "1",
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


@pytest.fixture(scope="session")
def memprism_tiny_overrides():
    """:func:`tiny_overrides`, for test modules outside this file."""
    return tiny_overrides


@pytest.fixture
def linked_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A tree ``real`` holding a file, a folder, a symlinked folder and a symlinked file (both
    pointing outside it), and ``plain``: the same content with no link at all."""
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "c.txt").write_text("c")
    (outside / "d.txt").write_text("d")
    for name in ("real", "plain"):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "a.txt").write_text("a")
        (tmp_path / name / "sub" / "b.txt").write_text("b")
    (tmp_path / "real" / "linked").symlink_to(outside)
    (tmp_path / "real" / "linked-file").symlink_to(outside / "d.txt")
    shutil.copytree(outside, tmp_path / "plain" / "linked")
    shutil.copy(outside / "d.txt", tmp_path / "plain" / "linked-file")
    return tmp_path / "real", tmp_path / "plain"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that start clusters first, then those with other slow tests, then the rest
    (each module's tests together, in their order). ``make test`` runs the suite on two workers
    that take whole modules in this order (pytest-xdist, ``--dist loadfile
    --no-loadscope-reorder``): the long modules start at once and the many short ones fill in
    around them, instead of one long module starting last."""
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        weight = 0 if item.get_closest_marker("cluster") else 1 if item.get_closest_marker("slow") else 2
        rank[module] = min(rank.get(module, 2), weight)
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])
