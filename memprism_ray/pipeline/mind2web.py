"""What the Mind2Web jobs do besides the shared actors (paper appendix "Training dataset
setup": "Mind2Web uses its official training split to construct teacher-forced human
trajectories and action-conditioned view-teacher records"; docs/mind2web.md).

* :func:`resolve_corpus`: the release root (``corpus.data_root`` / ``$MIND2WEB_DATA``), or the
  generated fixture when ``mind2web.fixture`` is on.
* :func:`plan_episodes`: the ordered evaluation plan over the test splits, with each task's
  recorded length (the denominators of step accuracy).
* :func:`human_streams` / :func:`label_states`: the human trajectories of training tasks as
  event streams (rule Phi on the recorded actions) and their decision states, each with the
  human next action as the reference ``u_t^ref`` (action-conditioned teacher records).
* :func:`counterfactual_labels`: the counterfactual teacher with the task policy reading
  Mind2Web prompts (CPU runs); :class:`Mind2WebLLMTeacher`: the LLM teacher with the
  Mind2Web view-teacher prompt of appendix E.2 (GPU runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memprism_ray.agent import EpisodeSpec
from memprism_ray.envs.base import GameRef, cache_base
from memprism_ray.pipeline import labels as alfworld_labels
from memprism_ray.pipeline.labels import LabelState, ViewConditionedActor
from memprism_ray.recorder.stream import EventStream, StreamRecord
from memprism_ray.router.teacher import DecisionState, LLMViewTeacher, serialize_stream
from memprism_ray.view_space import ViewAction


def fixture_root(cfg: Any) -> Path:
    """Where the fixture of ``cfg`` lives: ``corpus.data_root`` if set, else the cache."""
    if cfg.corpus.data_root:
        return Path(cfg.corpus.data_root)
    name = f"mind2web-fixture-s{cfg.corpus.seed}-k{cfg.mind2web.fixture_tasks_per_site}"
    return Path(cfg.corpus.cache_dir or cache_base()) / name


def resolve_corpus(cfg: Any, log: Any = print) -> Any:
    """``cfg`` with ``corpus.data_root`` set to a checked Mind2Web root (see module docstring)."""
    from memprism_ray.envs.mind2web.data import resolve_data_root
    from memprism_ray.envs.mind2web.fixture import ensure_fixture

    if cfg.mind2web.fixture:
        root = ensure_fixture(fixture_root(cfg), cfg.mind2web.fixture_tasks_per_site, cfg.corpus.seed)
        log(f"data: the generated Mind2Web fixture at {root} (not Mind2Web data: smoke runs only)")
    else:
        root = resolve_data_root(cfg.corpus.data_root or None)
        log(f"data: Mind2Web release at {root}")
    return dataclasses.replace(cfg, corpus=dataclasses.replace(cfg.corpus, data_root=str(root)))


def check_benchmark(cfg: Any) -> None:
    """The Mind2Web jobs need ``corpus.benchmark`` and ``agent.benchmark`` both ``mind2web``."""
    for key, value in (("corpus.benchmark", cfg.corpus.benchmark), ("agent.benchmark", cfg.agent.benchmark)):
        if value != "mind2web":
            raise ValueError(f"{key}={value!r}: the Mind2Web jobs need mind2web (see configs/mind2web_smoke.yaml)")


def plan_episodes(
    root: str | Path, splits: Sequence[str], tasks_per_split: int = 0
) -> tuple[list[EpisodeSpec], dict[str, int]]:
    """Every task of each split in file order (the first ``tasks_per_split`` when > 0), as
    episodes ``<split>/<annotation_id>``, and each episode's recorded number of steps."""
    from memprism_ray.envs.mind2web.data import load_file, split_files

    specs: list[EpisodeSpec] = []
    expected: dict[str, int] = {}
    for split in splits:
        n = 0
        for f in split_files(split, root):
            for aid, task in load_file(f, split).items():
                if tasks_per_split and n >= tasks_per_split:
                    break
                # The episode-id form of eval/episodes.py ("<split>/<game_id>#<round>") with one
                # plan-wide split name, so one manifest records the plan over all test splits.
                eid = f"mind2web/{split}/{aid}#0"
                specs.append(EpisodeSpec(eid, GameRef(aid, f, task.domain or "unknown", split)))
                expected[eid] = len(task.steps)
                n += 1
    return specs, expected


def train_games(cfg: Any) -> list[GameRef]:
    """The training tasks that form GRPO groups and D1 records (``mind2web.train_tasks`` first ones)."""
    from memprism_ray.envs.mind2web.data import list_games

    games = list_games("train", cfg.corpus.data_root)
    return games[: cfg.mind2web.train_tasks] if cfg.mind2web.train_tasks else games


def human_streams(games: Sequence[GameRef], snapshot: Any = None) -> list[tuple[GameRef, str, EventStream]]:
    """``(game, goal, stream)`` of each task's human trajectory: each recorded action is
    replayed (it is always correct) and recorded with the rule Phi, as the agent records
    events under teacher-forced replay."""
    from memprism_ray.envs.mind2web.data import load_task
    from memprism_ray.envs.mind2web.env import Mind2WebReplayEnv, human_action
    from memprism_ray.envs.mind2web.snapshot import build_snapshot
    from memprism_ray.recorder.events import RawEvent
    from memprism_ray.recorder.phi.base import record_event
    from memprism_ray.recorder.phi.mind2web import Mind2WebPhi

    env = Mind2WebReplayEnv(1, snapshot)
    phi = Mind2WebPhi()
    out = []
    for game in games:
        task = load_task(game)
        obs = env.reset(game)
        stream = EventStream({"goal": task.confirmed_task, "task_id": game.game_id, "benchmark": "mind2web"})
        o_pre = obs.text
        for t, step in enumerate(task.steps):
            action, _ = human_action(step, build_snapshot(step, env.snapshot_config))
            tr = env.step(action)
            raw = RawEvent(o_pre, tr.meta["recorded_action"], tr.feedback, tr.reward, {"step": t})
            record_event(stream, raw, phi)
            o_pre = tr.feedback
        out.append((game, task.confirmed_task, stream))
    return out


def label_states(streams: Sequence[tuple[GameRef, str, EventStream]]) -> list[LabelState]:
    """Action-conditioned decision states: ``(o_t, g, E_<t, u_t^ref = human action)`` with the
    snapshot's refs as the admissible set."""
    from memprism_ray.envs.mind2web.snapshot import parse_snapshot
    from memprism_ray.router.teacher import decision_states

    out = []
    for game, goal, stream in streams:
        for st in decision_states(stream, goal=goal, task_id=game.game_id):
            out.append(LabelState(st, tuple(parse_snapshot(st.observation))))
    return out


class Mind2WebViewActor(ViewConditionedActor):
    """The frozen task policy given one candidate view, with the Mind2Web prompt contract."""

    def _input(self, ls: LabelState, view: ViewAction) -> Any:
        return dataclasses.replace(super()._input(ls, view), benchmark="mind2web")


def counterfactual_labels(
    states: Sequence[LabelState], extractor: Any, policy: Any, **options: Any
) -> tuple[Any, dict[str, int]]:
    """:func:`memprism_ray.pipeline.labels.counterfactual_labels` (same ``options``) with Mind2Web
    prompts: mass on the views under which the policy predicts the human action."""
    return alfworld_labels.counterfactual_labels(states, extractor, policy, actor_cls=Mind2WebViewActor, **options)


def _summary(observation: str, limit: int = 4000) -> str:
    return observation if len(observation) <= limit else observation[: limit - 3] + "..."


class Mind2WebLLMTeacher(LLMViewTeacher):
    """The LLM view teacher with the Mind2Web prompt (appendix E.2 "Mind2Web View Teacher"):
    the current page summary, the prior events, their state deltas, the human next action
    and observation statistics."""

    def state_inputs(self, state: DecisionState) -> dict[str, Any]:
        return mind2web_teacher_inputs(state.history, state.observation, state.goal, state.reference_action)


def mind2web_teacher_inputs(
    history: Sequence[StreamRecord], observation: str, goal: str, reference_next_action: Any
) -> dict[str, Any]:
    """Inputs of the Mind2Web view-teacher prompt for one decision."""
    from memprism_ray.envs.mind2web.snapshot import parse_snapshot

    events = serialize_stream(history)
    for e in events:
        e.pop("feedback", None)  # pages are long; the deltas carry what changed
    elements = parse_snapshot(observation)
    return {
        "goal": goal,
        "current_summary": _summary(observation),
        "prior_summary_events": events,
        "summary_diffs": [
            {"step": rec.event.t, "delta": [d.to_dict() for d in rec.event.delta]} for rec in history if rec.event.delta
        ],
        "reference_next_action": reference_next_action,
        "observation_stats": {
            "elements": len(elements),
            "inputs": sum(e.tag in ("input", "textarea") for e in elements.values()),
            "selects": sum(e.tag == "select" for e in elements.values()),
            "prior_steps": len(history),
        },
    }
