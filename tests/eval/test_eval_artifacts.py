"""An episode's artifacts on disk (memprism_ray.eval.artifacts; paper appendix C): the event
stream, the step rows and the summary round-trip, and the trajectory viewer is one
self-contained HTML page with every kept view.

Plays the real ALFWorld engine over the shared tiny corpus (tests/conftest.py) with the
scripted policy.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from memprism_ray.agent import Agent, AgentConfig, EpisodeResult, EpisodeSpec, LocalServices
from memprism_ray.baselines import FixedView, make_selector
from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
from memprism_ray.benchmark.alfworld.scripted import ScriptedPolicy
from memprism_ray.eval.artifacts import safe_name, write_episode_artifacts
from memprism_ray.recorder.stream import EventStream
from memprism_ray.view_space import ViewAction


@pytest.fixture(scope="module")
def artifact_games(memprism_tiny_corpus: Path) -> list:
    from memprism_ray.benchmark.alfworld import list_games

    return list_games("eval_out_of_distribution", memprism_tiny_corpus)[:2]


@pytest.fixture(scope="module")
def artifact_env():
    from memprism_ray.benchmark.alfworld import AlfworldEnv

    env = AlfworldEnv(num_slots=2)
    yield env
    env.close()


def _play(env, specs: list[EpisodeSpec], selector, max_steps: int) -> list[EpisodeResult]:
    services = LocalServices(env, AlfworldPhi(), ScriptedPolicy(temperature=0.0, seed=0))
    cfg = AgentConfig(max_steps=max_steps, keep_views=True, token_counter="words")
    return Agent(services, selector, cfg).run(specs)


def test_artifacts_round_trip(artifact_env, artifact_games, tmp_path: Path) -> None:
    specs = [EpisodeSpec(f"ep{i}", g) for i, g in enumerate(artifact_games)]
    action = ViewAction("EntityState", "recent_long", "all", "medium")
    results = _play(artifact_env, specs, FixedView(action), max_steps=6)
    r = max(results, key=lambda x: x.steps)
    root = write_episode_artifacts(r, tmp_path)
    assert root == tmp_path / r.spec.episode_id
    assert EventStream.load(root / "events.parquet") == r.stream
    table = pq.read_table(root / "steps.parquet")
    assert table.num_rows == r.steps
    for row, got in zip(r.rows, table.to_pylist(), strict=True):
        assert got == row
    assert json.loads((root / "episode.json").read_text()) == r.summary()
    pngs = sorted((root / "views").glob("*.png"))
    assert [p.name for p in pngs] == [f"step_{i:03d}.png" for i in range(r.steps)]
    for p, row in zip(pngs, r.rows, strict=True):
        with Image.open(p) as im:
            assert im.size[0] * im.size[1] == row["pixels"]
    page = (root / "trajectory.html").read_text()
    # Self-contained: nothing fetched from elsewhere.
    assert not re.search(r"""(?:src|href)\s*=\s*(?!["']?data:)""", page, re.I)
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert page.count('src="data:image/png;base64,') == r.steps
    for row in r.rows:
        assert f"<b>Action</b> {row['action']}" in page
    assert r.goal in page and ("success" if r.won else "failure") in page
    first = re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1)
    assert base64.b64decode(first) == pngs[0].read_bytes()


def test_text_view_artifacts_and_safe_names(artifact_env, artifact_games, tmp_path: Path) -> None:
    spec = EpisodeSpec("run/../a b?", artifact_games[1])
    (r,) = _play(artifact_env, [spec], make_selector("fixed_text:TemporalTrace"), max_steps=3)
    assert all(row["visual_tokens"] == 0 and row["pixels"] == 0 for row in r.rows)
    root = write_episode_artifacts(r, tmp_path)
    assert root.parent == tmp_path and root.name == "run_.._a_b_" == safe_name(spec.episode_id)
    assert list((root / "views").iterdir()) == []
    page = (root / "trajectory.html").read_text()
    assert page.count("<pre>") == r.steps and "view: TemporalTrace" in page
    assert "&lt;" not in spec.episode_id and "run/../a b?" in page


def test_html_in_the_episode_is_escaped(artifact_games, tmp_path: Path) -> None:
    r = EpisodeResult(EpisodeSpec("<b>x</b>", artifact_games[0]), goal="put <script>alert(1)</script> away")
    r.views.append(
        {"step": 0, "observation": "a & b", "action": "<i>go</i>", "feedback": "ok", "outcome": "state_update",
         "view": None, "png": None, "text": "<table>"}
    )  # fmt: skip
    page = (write_episode_artifacts(r, tmp_path) / "trajectory.html").read_text()
    assert "<script" not in page and "<i>" not in page and "<table>" not in page
    assert "&lt;script&gt;" in page and "a &amp; b" in page and "<pre>&lt;table&gt;</pre>" in page


def test_artifacts_of_a_failed_episode(tmp_path: Path, artifact_games) -> None:
    r = EpisodeResult(EpisodeSpec("broken", artifact_games[0]), status="failed", error="reset: Injected: reset down")
    root = write_episode_artifacts(r, tmp_path)
    assert not (root / "steps.parquet").exists()
    assert len(EventStream.load(root / "events.parquet")) == 0
    assert json.loads((root / "episode.json").read_text())["error"] == "reset: Injected: reset down"
    assert "status failed" in (root / "trajectory.html").read_text()
