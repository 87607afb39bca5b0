"""Expert trajectories of EB-ALFRED episodes for D1 (paper appendix "Training dataset
setup": "The ALFRED path uses the official ALFRED training annotations for learning"): the
fixture's recorded plans or the ALFRED annotations translated to skills, played with the
stage-1 rule Phi into the expert-trajectory table D1 labelling reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memprism_ray.envs.base import GameRef
from memprism_ray.envs.ebalfred.data import (
    default_alfred_root,
    load_splits,
    parse_game_id,
    skills_from_trajectory,
)
from memprism_ray.envs.ebalfred.skills import AlfredNameError
from memprism_ray.recorder.phi.ebalfred import EbAlfredRulePhi


def fixture_plans(fixture: str | Path) -> dict[str, list[str]]:
    """``game_id -> recorded expert skills`` of a fixture."""
    from memprism_ray.formats.ebalfred_fixture import load_transcripts

    return {k: [s["action"] for s in ep["steps"]] for k, ep in load_transcripts(fixture)["episodes"].items()}


def annotation_plans(splits: str | Path, games: Sequence[GameRef], alfred_root: str | Path | None = None) -> dict:
    """``game_id -> expert skills`` from the ALFRED annotation (under ``train`` then
    ``valid_seen``) each splits entry names; a missing one is an error naming the game."""
    root = Path(alfred_root) if alfred_root else default_alfred_root()
    if root is None:
        raise FileNotFoundError("ALFRED annotations: set $MEMPRISM_ALFRED_DATA to the unpacked json_2.1.0 folder")
    table = load_splits(splits, sorted({parse_game_id(g.game_id)[0] for g in games}))
    out: dict[str, list[str]] = {}
    for g in games:
        subset, index = parse_game_id(g.game_id)
        task = table[subset][index].get("task", "")
        path = next(
            (p for p in (root / s / task / "traj_data.json" for s in ("train", "valid_seen")) if p.is_file()), None
        )
        if path is None:
            raise FileNotFoundError(f"{g.game_id}: no ALFRED annotation for task {task!r} under {root}")
        try:
            out[g.game_id] = skills_from_trajectory(json.loads(path.read_text()))
        except AlfredNameError as exc:
            raise AlfredNameError(f"{g.game_id} ({path}): {exc}", exc.name, exc.known) from None
    return out


def play_expert(env: Any, games: Sequence[GameRef], plans: Mapping[str, Sequence[str]], max_steps: int = 30) -> list:
    """Play each game's plan for at most ``max_steps`` environment steps, as the agent loop counts
    them; ``ExpertEpisode`` records, won or not (the label stage reads the ``won`` column)."""
    from memprism_ray.envs.alfworld.expert_data import follow, play_episode

    phi, keys = EbAlfredRulePhi(), ("last_action_success", "progress")
    episodes = [
        play_episode(env, g, "ebalfred", phi, follow(plans[g.game_id]), max_steps, "alfred", keys) for g in games
    ]
    return [ep for ep in episodes if ep.reference]


def write_expert_table(episodes: Sequence[Any], path: str | Path) -> Path:
    """The expert-trajectory Parquet D1 labelling reads."""
    import pyarrow.parquet as pq

    from memprism_ray.envs.alfworld.expert_data import episodes_to_arrow

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(episodes_to_arrow(episodes), out)
    return out
