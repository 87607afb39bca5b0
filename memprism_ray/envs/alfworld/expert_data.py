"""Reference trajectories of ALFWorld's handcoded expert, as Parquet (issue 3, item 6; paper
appendix "Training dataset setup", D1).

One row per decision state: exactly the stream's Arrow columns (so one episode's rows give back
its ``EventStream``), plus ``episode``, ``game_id``, ``task_type``, ``split``, ``goal``,
``admissible``, ``reference_action``, ``reference_source``, ``won`` and ``done``. When the
expert (a heuristic) cannot win a game, its stored ``walkthrough`` is replayed instead; a game
neither wins is left out and reported.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.envs.alfworld.env import AlfworldEnv
from memprism_ray.envs.base import GameRef, took_step
from memprism_ray.recorder import EventStream, RawEvent
from memprism_ray.recorder.phi import record_event
from memprism_ray.recorder.phi.alfworld import AlfworldPhi
from memprism_ray.recorder.phi.base import Phi

log = logging.getLogger(__name__)

OUTPUT_NAME = "expert_trajectories.parquet"


@dataclass(frozen=True)
class ExpertEpisode:
    """One recorded expert episode."""

    game: GameRef
    goal: str
    stream: EventStream
    admissible: tuple[tuple[str, ...], ...]
    reference: tuple[str, ...]
    source: str
    won: bool


#: ``choose(stream, observation, goal, admissible, step) -> command``: who acts in a roll-in.
Chooser = Callable[[EventStream, str, str, tuple[str, ...], int], str]


def play_episode(
    env: Any,
    game: GameRef,
    benchmark: str,
    phi: Phi,
    next_action: Callable[..., tuple[str, str] | None],
    max_steps: int,
    source: str,
    meta_keys: Sequence[str] = (),
) -> ExpertEpisode:
    """Play ``game``, recording every step through ``phi``: ``next_action(t, meta, stream,
    o_pre, goal, admissible)`` gives ``(action, reference)``, or ``None`` to stop; at most
    ``max_steps`` steps the env takes (:data:`~memprism_ray.envs.base.STEP_TAKEN`)."""
    obs = env.reset(game)
    stream = EventStream({"benchmark": benchmark, "game_id": game.game_id, "goal": obs.goal})
    o_pre, admissible, meta = obs.text, obs.admissible, obs.meta
    offered: list[tuple[str, ...]] = []
    reference: list[str] = []
    won, taken = False, 0
    while taken < max_steps:
        got = next_action(len(reference), meta, stream, o_pre, obs.goal, tuple(admissible))
        if got is None:
            break
        action, ref = got
        offered.append(tuple(admissible))
        reference.append(ref)
        tr = env.step(action)
        taken += took_step(tr)
        raw_meta = {"step": len(reference), "game_id": game.game_id, "task_type": game.task_type, "won": tr.won}
        raw_meta.update({k: tr.meta[k] for k in meta_keys if k in tr.meta})
        record_event(stream, RawEvent(o_pre, action, tr.feedback, tr.reward, raw_meta), phi)
        o_pre, admissible, meta = tr.feedback, tr.admissible, tr.meta
        if tr.done:
            won = tr.won
            break
    return ExpertEpisode(game, obs.goal, stream, tuple(offered), tuple(reference), source, won)


def follow(commands: Sequence[str]) -> Callable[..., tuple[str, str] | None]:
    """A ``next_action`` of :func:`play_episode` that plays ``commands`` in order."""
    return lambda t, *_: (commands[t], commands[t]) if t < len(commands) else None


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


def episodes_to_arrow(episodes: Sequence[ExpertEpisode]) -> Any:
    """One row per decision state, as a ``pyarrow.Table``."""
    import pyarrow as pa

    tables = []
    for i, ep in enumerate(episodes):
        table = ep.stream.to_arrow()
        n = table.num_rows
        constant = {"game_id": ep.game.game_id, "task_type": ep.game.task_type, "split": ep.game.split, "goal": ep.goal}
        extra = {
            "episode": pa.array([i] * n, pa.int32()),
            **{name: pa.array([value] * n, pa.string()) for name, value in constant.items()},
            "admissible": pa.array([list(a) for a in ep.admissible], pa.list_(pa.string())),
            "reference_action": pa.array(list(ep.reference), pa.string()),
            "reference_source": pa.array([ep.source] * n, pa.string()),
            "won": pa.array([ep.won] * n, pa.bool_()),
            "done": pa.array([j == n - 1 for j in range(n)], pa.bool_()),
        }
        for name, col in extra.items():
            table = table.append_column(name, col)
        tables.append(table.replace_schema_metadata(None))
    if not tables:
        raise ValueError("no expert episode to write")
    return pa.concat_tables(tables).replace_schema_metadata({b"memprism.table": b"alfworld-expert-trajectories"})


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
    from tqdm import tqdm

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
        for game in tqdm(games, desc="expert", unit="game", disable=not progress, file=sys.stderr):
            ep = record_expert_episode(env, game, max_steps=max_steps)
            if ep is None:
                skipped.append(game.game_id)
            else:
                episodes.append(ep)
        for game in tqdm(rollin_games, desc="roll-in", unit="game", disable=not progress, file=sys.stderr):
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


def load_expert_stream(table: Any, episode: int) -> EventStream:
    """The :class:`EventStream` of one episode of an expert-trajectory table."""
    import pyarrow.compute as pc

    rows = table.filter(pc.equal(table["episode"], episode))
    if rows.num_rows == 0:
        raise ValueError(f"no episode {episode} in the expert-trajectory table")
    stream_columns = EventStream().to_arrow().column_names  # the rows hold exactly these, then the extras
    return EventStream.from_arrow(rows.select(stream_columns).replace_schema_metadata(None))
