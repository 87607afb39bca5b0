"""Reference trajectories of ALFWorld's handcoded expert, in D1's reference-table format
(:mod:`memprism_ray.adapter.reference_table`; issue 3, item 6; paper appendix "Training
dataset setup", D1). When the expert (a heuristic) cannot win a game, its stored
``walkthrough`` is replayed instead; a game neither wins is left out and reported.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memprism_ray.adapter.reference_table import OUTPUT_NAME, ExpertEpisode, episodes_to_arrow, follow, play_episode
from memprism_ray.benchmark.alfworld.env import AlfworldEnv
from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
from memprism_ray.envs.base import GameRef
from memprism_ray.recorder import EventStream
from memprism_ray.recorder.phi.base import Phi

log = logging.getLogger(__name__)

#: ``choose(stream, observation, goal, admissible, step) -> command``: who acts in a roll-in.
Chooser = Callable[[EventStream, str, str, tuple[str, ...], int], str]


def _play(
    env: AlfworldEnv, game: GameRef, commands: Sequence[str] | None, max_steps: int, choose: Chooser | None = None
) -> ExpertEpisode:
    """Play ``game`` following the expert (``commands is None``), the given commands, or
    ``choose`` (a roll-in: ``choose`` acts, the expert's next command is each state's
    reference; it ends when the expert has none or fails)."""

    def expert(t: int, meta: Any, *state: Any) -> tuple[str, str] | None:
        ref = meta.get("expert_action")
        if not ref:
            return None
        return (ref if choose is None else choose(*state, t)), ref

    source = "rollin" if choose is not None else "handcoded_expert" if commands is None else "walkthrough"
    next_action = expert if commands is None else follow(commands)
    return play_episode(env, game, "alfworld", AlfworldPhi(), next_action, max_steps, source)


def record_rollin_episode(env: AlfworldEnv, game: GameRef, choose: Chooser, max_steps: int) -> ExpertEpisode | None:
    """The task policy's own play of ``game`` (``choose`` acts) with the handcoded expert's
    next command as every state's reference, won or not; ``None`` when the expert fails
    before the first decision."""
    try:
        episode = _play(env, game, None, max_steps, choose)
    except Exception as exc:  # the expert signals failure with NameError subclasses and Exception("Timeout")
        log.info("handcoded expert failed during the roll-in on %s: %s", game.game_id, exc)
        return None
    return episode if len(episode.stream) else None


def _walkthrough(game: GameRef) -> list[str] | None:
    try:
        data = json.loads(Path(game.path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    walk = data.get("walkthrough") if isinstance(data, dict) else None
    return [str(c) for c in walk] if isinstance(walk, list) and walk else None


def record_expert_episode(env: AlfworldEnv, game: GameRef, max_steps: int = 120) -> ExpertEpisode | None:
    """The expert's winning episode on ``game`` (walkthrough fallback), or ``None``."""
    try:
        episode = _play(env, game, None, max_steps)
    except Exception as exc:  # the expert signals failure with NameError subclasses and Exception("Timeout")
        log.info("handcoded expert failed on %s: %s", game.game_id, exc)
        episode = None
    if episode is not None and episode.won:
        return episode
    walk = _walkthrough(game)
    if walk:
        episode = _play(env, game, walk, max(max_steps, len(walk)))
        if episode.won:
            return episode
    return None


def collect_expert_trajectories(
    games: Sequence[GameRef],
    out_dir: str | Path,
    *,
    max_steps: int = 120,
    expert_seed: int = 0,
    progress: bool = True,
    phi: Phi | None = None,
    rollin_games: Sequence[GameRef] = (),
    choose: Chooser | None = None,
    rollin_steps: int = 25,
) -> Path:
    """Play every game with the expert and write ``out_dir/expert_trajectories.parquet`` (its
    path), then ``rollin_games`` played by ``choose`` for at most ``rollin_steps`` steps. ``phi``
    (an LLM Phi, docs/phi.md) re-extracts every stream recorded by the rules, so D1 data and
    rollouts are recorded by the same Phi."""
    import pyarrow.parquet as pq

    from memprism_ray.progress import progress_bar

    if not games:
        raise ValueError("no games given to collect expert trajectories from")
    if rollin_games and choose is None:
        raise ValueError("rollin_games needs a chooser (the task policy that plays them)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    episodes: list[ExpertEpisode] = []
    skipped: list[str] = []
    rollin_failed: list[str] = []
    with AlfworldEnv(1, expert=True, expert_seed=expert_seed) as env:
        for game in progress_bar(games, desc="expert", unit="game", disable=not progress, file=sys.stderr):
            ep = record_expert_episode(env, game, max_steps=max_steps)
            if ep is None:
                skipped.append(game.game_id)
            else:
                episodes.append(ep)
        for game in progress_bar(rollin_games, desc="roll-in", unit="game", disable=not progress, file=sys.stderr):
            ep = record_rollin_episode(env, game, choose, rollin_steps)  # type: ignore[arg-type]
            if ep is None:
                rollin_failed.append(game.game_id)
            else:
                episodes.append(ep)
    if skipped:
        log.warning("no winning reference for %d game(s): %s", len(skipped), ", ".join(skipped[:5]))
    if rollin_failed:
        failed = ", ".join(rollin_failed[:5])
        log.warning("the expert failed at the start of %d roll-in(s): %s", len(rollin_failed), failed)
    if not episodes:
        raise ValueError(f"the expert won none of the {len(games)} game(s); nothing written")
    if phi is not None:
        from memprism_ray.recorder.phi.factory import rerecord

        streams = rerecord([e.stream for e in episodes], phi)
        episodes = [dataclasses.replace(e, stream=st) for e, st in zip(episodes, streams, strict=True)]
    path = out / OUTPUT_NAME
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(episodes_to_arrow(episodes), str(tmp))
    tmp.replace(path)
    summary = {
        "games": len(games),
        "episodes": len(episodes),
        "skipped": skipped,
        "rollin_failed": rollin_failed,
        "steps": sum(len(e.stream) for e in episodes),
        "sources": {s: sum(e.source == s for e in episodes) for s in ("handcoded_expert", "walkthrough", "rollin")},
    }
    (out / "expert_trajectories.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return path
