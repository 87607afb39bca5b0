"""Shared fixtures for the ALFWorld tests: one tiny generated corpus per test session.

Built once (about 20-30 s on 2 cores) in a temporary folder: 6 train games (one per task
type), 6 in-distribution and 6 out-of-distribution eval games.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ALFWORLD_TINY = {"train": 6, "eval": 6, "seed": 11}


@pytest.fixture(scope="session")
def alfworld_tiny_config() -> dict[str, int]:
    return dict(ALFWORLD_TINY)


@pytest.fixture(scope="session")
def alfworld_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from memprism_ray.benchmark.alfworld.corpus import CorpusConfig, build_corpus

    root = tmp_path_factory.mktemp("alfworld-corpus")
    build_corpus(CorpusConfig(out=root, workers=2, **ALFWORLD_TINY), progress=False)
    return root


@pytest.fixture(scope="session")
def alfworld_games(alfworld_corpus: Path) -> dict[str, list]:
    from memprism_ray.benchmark.alfworld.data import SPLITS, list_games

    return {split: list_games(split, alfworld_corpus) for split in SPLITS}


@pytest.fixture(scope="session")
def alfworld_env():
    from memprism_ray.benchmark.alfworld.env import AlfworldEnv

    env = AlfworldEnv(num_slots=2, expert=True)
    yield env
    env.close()
