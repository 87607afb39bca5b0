"""Fixtures shared across test packages.

``memprism_tiny_corpus``: one tiny generated ALFWorld corpus (6 train games, one per task
type, 6 + 6 eval games), built once and cached under ``$MEMPRISM_TEST_CACHE`` (default
``~/.cache/memprism/tests``) so repeated runs and every test package reuse it; its
content is a function of the seed only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY_CORPUS = {"train": 6, "eval": 6, "seed": 11}


def test_cache_dir() -> Path:
    return Path(os.environ.get("MEMPRISM_TEST_CACHE") or Path.home() / ".cache" / "memprism" / "tests")


@pytest.fixture(scope="session")
def memprism_tiny_corpus() -> Path:
    from memprism_ray.envs.alfworld import ensure_default_corpus

    c = TINY_CORPUS
    root = test_cache_dir() / f"alfworld-corpus-s{c['seed']}-t{c['train']}-e{c['eval']}"
    return ensure_default_corpus(root, train=c["train"], eval=c["eval"], seed=c["seed"], workers=2, progress=False)
