"""The D1 reference-table format (paper "Adapter", appendix A.3 "Cold-start distillation"):
reference trajectories as Parquet, one row per decision state, whatever benchmark played them.

A row holds exactly the stream's Arrow columns (so one episode's rows give back its
``EventStream``: :func:`load_expert_stream`), plus ``episode``, ``game_id``, ``task_type``,
``split``, ``goal``, ``admissible``, ``reference_action``, ``reference_source``, ``won`` and
``done``. A benchmark records its episodes with :func:`play_episode` (its env, its Phi, its
expert or replayed plan) and writes them with :func:`episodes_to_arrow`; D1's labelling
(:mod:`memprism_ray.adapter.d1_labels`) reads them back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memprism_ray.envs.base import Env, GameRef, took_step
from memprism_ray.recorder import EventStream, RawEvent
from memprism_ray.recorder.phi import record_event
from memprism_ray.recorder.phi.base import Phi

#: The file a benchmark's D1 reference table is written to, in the D1 directory.
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


def play_episode(
    env: Env,
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
    return pa.concat_tables(tables).replace_schema_metadata({b"memprism.table": b"d1-reference-trajectories"})


def load_expert_stream(table: Any, episode: int) -> EventStream:
    """The :class:`EventStream` of one episode of an expert-trajectory table."""
    import pyarrow.compute as pc

    rows = table.filter(pc.equal(table["episode"], episode))
    if rows.num_rows == 0:
        raise ValueError(f"no episode {episode} in the expert-trajectory table")
    stream_columns = EventStream().to_arrow().column_names  # the rows hold exactly these, then the extras
    return EventStream.from_arrow(rows.select(stream_columns).replace_schema_metadata(None))
