"""``jobs/label_views.py`` (the D1 data alone) builds what the GRPO job's D1 builds for the same
config: the expert's games *and* the roll-ins (``label.rollin_games``), under the same key, so
the GRPO job that later reuses that directory trains on the data its config names. Runs on the
in-process Ray session."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]


def _label_job():
    spec = importlib.util.spec_from_file_location("label_views_job", ROOT / "jobs" / "label_views.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_label_views_plays_the_rollins_its_config_names(
    ray_session, memprism_tiny_corpus: Path, memprism_tiny_overrides, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.config import load_config
    from memprism_ray.trainer.run_dir import d1_dir

    overrides = memprism_tiny_overrides(memprism_tiny_corpus, tmp_path, "labels")  # 2 expert games, 1 roll-in
    assert _label_job().main(["--config", "configs/local.yaml", *overrides]) == 0
    cfg = load_config("configs/local.yaml", overrides)
    key_dir = d1_dir(cfg.run.dir, cfg, get_benchmark("alfworld"))  # the directory the GRPO job would reuse
    table = pq.read_table(key_dir / "expert_trajectories.parquet")
    sources = table.column("reference_source").to_pylist()
    episodes = {src: set() for src in sources}
    for src, ep in zip(sources, table.column("episode").to_pylist(), strict=True):
        episodes[src].add(ep)
    assert len(episodes.get("rollin", ())) == 1
    assert len(episodes.get("handcoded_expert", set()) | episodes.get("walkthrough", set())) == 2
    assert (key_dir / "labels.parquet").exists()
