"""The decision loop, in-process (paper appendix D.3, "Decision-time compilation and
environment update"; docs/architecture.md "Decision step").

At each decision step of each running episode::

    features z_t  (MiniLM(obs), MiniLM(goal), window summary of the last 8 events,
                   8 global statistics of the last 64)           -- only if the selector needs them
    view action   selector (Router argmax / sample, or a baseline)
    view V_t      Composer.select + compile, Render (optical and/or text)
    action u_t    TaskPolicy(obs, goal, short text history, V_t)
    feedback      env.step(u_t)
    e~_t          Phi(raw event) -> EventStream.append            -- the view is discarded

Memory-interface conditions (external baselines, AgentOCR; baselines/memory.py) replace the
view with what their per-episode memory retrieves before the decision, and are written the
completed step after it.

Episodes run step-synchronously in batches (one GRPO group, or a wave of evaluation
episodes), so every stage sees a batch: one encoder call, one policy call, one env call per
step. The stages are reached through :class:`AgentServices`; :class:`LocalServices` calls
objects in this process, and the Ray rollout worker supplies actor-backed services, so the
loop itself exists once.

Per step the loop records, as one Arrow row: the Router features, view index and log-prob,
action, outcome, prompt and visual tokens, pixels, and the latency of each stage. An
infrastructure failure (a service raising, or returning more or fewer results than it was
given requests) ends only the episodes it touched, which are marked ``failed`` with the
error, so no episode waits for a result that never comes; an invalid policy output is not a failure: the text is
passed to the environment, which answers as it does ("Nothing happens.").

Under teacher-forced replay (Mind2Web) the environment scores the predicted action and
advances with the recorded human action, which it returns as ``Transition.meta
["recorded_action"]``: the raw event and the short history are built from that action
(events come from the human trajectory); the step row keeps the predicted ``action`` and
adds ``recorded_action`` and ``correct``.
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from memprism_ray.baselines.base import FULL_HISTORY, DecisionContext, ViewDecision, ViewSelector
from memprism_ray.config_tree import field as cfg_field
from memprism_ray.envs.base import Env, GameRef, Observation, Transition
from memprism_ray.policy.base import HistoryRecord, PolicyInput, PolicyOutput, TaskPolicy
from memprism_ray.policy.parsing import extract_action_tag
from memprism_ray.policy.tokens import TEXT_COUNTERS, PromptTokenCounter, task_model_of
from memprism_ray.recorder.events import Event, RawEvent
from memprism_ray.recorder.phi.base import Extraction, Phi
from memprism_ray.recorder.stream import EventStream
from memprism_ray.views import RenderedView, ViewRequest, ViewService

# --------------------------------------------------------------------------- settings


@dataclass
class AgentConfig:
    """Settings of the decision loop (paper "Experiment Setup": ALFWorld allows at most 50
    environment steps with binary terminal success as reward)."""

    benchmark: str = cfg_field("alfworld", help="benchmark whose prompt and action contract the policy uses")
    max_steps: int = cfg_field(50, help="environment steps per episode before it is cut off")
    short_history: int = cfg_field(2, help="steps of text history H_short in the prompt for view conditions")
    keep_views: bool = cfg_field(False, help="keep each step's view (PNG/text) for the trajectory viewer")
    token_counter: str = cfg_field(
        "auto", help="prompt text tokens: auto (task model's tokenizer, else MiniLM fallback), task, minilm or words"
    )

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"agent.max_steps must be >= 1, got {self.max_steps}")
        if self.short_history < 0:
            raise ValueError(f"agent.short_history must be >= 0, got {self.short_history}")
        if self.token_counter not in TEXT_COUNTERS:
            raise ValueError(f"agent.token_counter must be one of {TEXT_COUNTERS}, got {self.token_counter!r}")


class TokenCounter(PromptTokenCounter):
    """Counts prompt text tokens with a named tokenizer (appendix C.1 efficiency metrics): the
    task model's tokenizer when one is configured (``auto``/``task``), else the offline
    all-MiniLM-L6-v2 WordPiece tokenizer labelled as a fallback; ``minilm`` and ``words``
    force one. See :class:`memprism_ray.policy.tokens.PromptTokenCounter`. Backends that
    report their own prompt token counts (vLLM, OpenAI-compatible servers) are recorded
    beside this count."""


# --------------------------------------------------------------------------- services


class AgentServices(Protocol):
    """The stages the loop calls, batched. Each returns one result per request, in order;
    a result may be an exception, which fails only that request's episode."""

    def reset(self, requests: Sequence[tuple[int, GameRef]]) -> list[Observation | BaseException]: ...

    def step(self, requests: Sequence[tuple[int, str]]) -> list[Transition | BaseException]: ...

    def extract(
        self, raws: Sequence[RawEvent], states: Sequence[dict[str, str]]
    ) -> list[Extraction | BaseException]: ...

    def views(self, requests: Sequence[ViewRequest]) -> list[RenderedView | BaseException]: ...

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput | BaseException]: ...


class ResultCountError(RuntimeError):
    """A batched stage returned a different number of results than it was given requests."""


def paired_results(stage: str, call: Callable[[], Sequence[Any]], expected: int) -> list[Any]:
    """One result per request from a batched stage call, whatever the stage does.

    A stage that raises, or returns more or fewer results than ``expected``, gives every
    request the error as its result: the results cannot be paired with the requests, and
    an unpaired request would leave its episode waiting for ever (issue 10 item 1)."""
    if expected == 0:
        return []
    try:
        results = list(call())
    except Exception as exc:  # the whole batch failed: every episode in it fails
        return [exc] * expected
    if len(results) != expected:
        err = ResultCountError(f"{stage} returned {len(results)} result(s) for {expected} request(s)")
        return [err] * expected
    return results


def each_request(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``fn`` over a batch; an exception becomes that request's result (one bad request
    fails one episode, not the batch)."""
    out: list[Any] = []
    for item in items:
        try:
            out.append(fn(item))
        except Exception as exc:  # an infrastructure failure of one request
            out.append(exc)
    return out


class LocalServices:
    """Every stage in this process: one env (with slots), one Phi, a ViewService, a policy."""

    def __init__(self, env: Env, phi: Phi, policy: TaskPolicy, view_service: ViewService | None = None) -> None:
        self.env = env
        self.phi = phi
        self.policy = policy
        self.view_service = view_service or ViewService()

    def reset(self, requests: Sequence[tuple[int, GameRef]]) -> list[Observation | BaseException]:
        return each_request(lambda r: self.env.reset(r[1], slot=r[0]), requests)

    def step(self, requests: Sequence[tuple[int, str]]) -> list[Transition | BaseException]:
        return each_request(lambda r: self.env.step(r[1], slot=r[0]), requests)

    def extract(self, raws: Sequence[RawEvent], states: Sequence[dict[str, str]]) -> list[Extraction | BaseException]:
        from memprism_ray.recorder.phi.factory import extract_each  # batched for an LLM Phi (docs/phi.md)

        return extract_each(self.phi, raws, states)

    def views(self, requests: Sequence[ViewRequest]) -> list[RenderedView | BaseException]:
        return each_request(self.view_service.render_one, requests)

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput | BaseException]:
        if not inputs:
            return []
        try:
            return list(self.policy.act(inputs))
        except Exception as exc:
            return [exc for _ in inputs]


# --------------------------------------------------------------------------- episodes


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play: a stable id (used for seeding and pairing) and its game."""

    episode_id: str
    game: GameRef


@dataclass
class EpisodeResult:
    """A played episode: outcome, its event stream, per-step rows and (optionally) views."""

    spec: EpisodeSpec
    won: bool = False
    reward: float = 0.0
    steps: int = 0
    status: str = "ok"
    error: str | None = None
    goal: str = ""
    stream: EventStream = field(default_factory=EventStream)
    rows: list[dict[str, Any]] = field(default_factory=list)
    views: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def summary(self) -> dict[str, Any]:
        return {
            "episode_id": self.spec.episode_id,
            "game_id": self.spec.game.game_id,
            "task_type": self.spec.game.task_type,
            "split": self.spec.game.split,
            "won": self.won,
            "reward": self.reward,
            "steps": self.steps,
            "status": self.status,
            "error": self.error,
        }


@dataclass
class _Live:
    result: EpisodeResult
    slot: int
    obs: str = ""
    admissible: tuple[str, ...] = ()
    history: list[HistoryRecord] = field(default_factory=list)
    done: bool = False
    frame: bytes | None = None  # the latest camera frame (PNG; EB-ALFRED)
    html_field: str | None = None  # Mind2Web: the current snapshot's source, for the prompt
    examples: str = ""  # EB-ALFRED: the episode's in-context example block, for the prompt
    memory: Any = None  # EpisodeMemory of a memory-interface condition (baselines/memory.py)
    memory_counts: dict[str, int] = field(default_factory=dict)  # its counters at the last step row
    keep_views: bool = False  # this episode's views are kept for the trajectory viewer


def _fallback_action(text: str) -> str:
    """What goes to the environment when the policy output is invalid: the tagged text if
    any, else the first line, bounded. The engine answers it ("Nothing happens.")."""
    content, _ = extract_action_tag(text)
    candidate = content if content else (text.strip().splitlines() or [""])[0]
    return candidate.strip()[:200] or "look"


def _recorded(tr: Transition) -> str | None:
    """The recorded action of a teacher-forced replay step (Mind2Web: the human action the
    environment advanced with, paper appendix D.3), or ``None`` for an executed action."""
    recorded = tr.meta.get("recorded_action")
    return recorded if isinstance(recorded, str) and recorded else None


def _history(live: _Live, decision: ViewDecision, default: int) -> tuple[HistoryRecord, ...]:
    k = default if decision.history is None else decision.history
    if k == FULL_HISTORY:
        return tuple(live.history)
    return tuple(live.history[-k:]) if k > 0 else ()


class Agent:
    """Plays episodes step-synchronously through :class:`AgentServices`.

    ``features`` (a :class:`~memprism_ray.router.features.FeatureExtractor`) is needed when
    the selector uses Router features or when ``record_features`` is on (GRPO rollouts
    store the features of each decision for the learner).

    ``config.keep_views`` keeps every episode's views (PNG and text per step), or only those
    of the episode ids in ``keep_views_for`` when given (an evaluation writes the viewer of a
    few episodes). A page is painted only when the policy reads pixels (``needs_view_image``,
    default: the policy's attribute, else true) or its episode keeps its views; otherwise it is
    laid out, so its size and visual tokens are the same.
    """

    def __init__(
        self,
        services: AgentServices,
        selector: ViewSelector,
        config: AgentConfig | None = None,
        *,
        features: Any = None,
        record_features: bool = False,
        needs_view_text: bool | None = None,
        needs_view_image: bool | None = None,
        keep_views_for: Collection[str] | None = None,
        token_counter: TokenCounter | None = None,
        step_meta: dict[str, Any] | None = None,
    ) -> None:
        self.services = services
        self.selector = selector
        self.config = config or AgentConfig()
        self.features = features
        self.record_features = record_features
        if (selector.uses_features or record_features) and features is None:
            raise ValueError(f"selector {selector.name!r} needs a FeatureExtractor (features=...)")
        policy = getattr(services, "policy", None)
        self.needs_view_text = (
            bool(getattr(policy, "needs_view_text", False)) if needs_view_text is None else needs_view_text
        )
        self.needs_view_image = (
            bool(getattr(policy, "needs_view_image", True)) if needs_view_image is None else needs_view_image
        )
        self.keep_views_for = None if keep_views_for is None else frozenset(keep_views_for)
        self.tokens = token_counter or TokenCounter(self.config.token_counter, model=task_model_of(policy))
        self.step_meta = dict(step_meta or {})
        # Memory-interface conditions (external baselines, agentocr) keep one memory per episode.
        self.new_memory = getattr(selector, "new_memory", None)

    # ---- public ---------------------------------------------------------------------
    def run(
        self,
        specs: Sequence[EpisodeSpec],
        slots: Sequence[int] | None = None,
        on_episode: Callable[[EpisodeResult], None] | None = None,
    ) -> list[EpisodeResult]:
        """Play ``specs``; ``slots[i]`` is the env slot of ``specs[i]`` (default ``i``)."""
        slots = list(range(len(specs))) if slots is None else list(slots)
        if len(slots) != len(specs):
            raise ValueError(f"run needs one slot per episode, got {len(slots)} slots for {len(specs)} episodes")
        lives = [
            _Live(EpisodeResult(spec), slot, keep_views=self._keeps_views(spec))
            for spec, slot in zip(specs, slots, strict=True)
        ]
        try:
            self._reset(lives)
            while True:
                active = [lv for lv in lives if not lv.done]
                if not active:
                    break
                self._decide(active)
        finally:  # a memory's store (temp dir, relay key) never outlives its episode, even on a crash
            for lv in lives:
                if lv.memory is not None:
                    close_memory(lv.memory)
        results = [lv.result for lv in lives]
        if on_episode is not None:
            for r in results:
                on_episode(r)
        return results

    def _keeps_views(self, spec: EpisodeSpec) -> bool:
        if not self.config.keep_views:
            return False
        return self.keep_views_for is None or spec.episode_id in self.keep_views_for

    # ---- stages ---------------------------------------------------------------------
    def _fail(self, live: _Live, stage: str, exc: BaseException) -> None:
        live.done = True
        live.result.status = "failed"
        live.result.error = f"{stage}: {type(exc).__name__}: {exc}"

    def _reset(self, lives: list[_Live]) -> None:
        requests = [(lv.slot, lv.result.spec.game) for lv in lives]
        obs = paired_results("env reset", lambda: self.services.reset(requests), len(requests))
        for lv, ob in zip(lives, obs, strict=True):
            if isinstance(ob, BaseException):
                self._fail(lv, "reset", ob)
                continue
            lv.obs = ob.text
            lv.admissible = ob.admissible
            lv.frame = ob.frame
            lv.html_field = ob.meta.get("html_field")
            lv.examples = str(ob.meta.get("examples") or "")
            lv.result.goal = ob.goal
            lv.result.stream = EventStream(
                {
                    "goal": ob.goal,
                    "episode_id": lv.result.spec.episode_id,
                    "game_id": lv.result.spec.game.game_id,
                    "task_type": lv.result.spec.game.task_type,
                    "benchmark": self.config.benchmark,
                }
            )
            if self.new_memory is not None:
                try:
                    lv.memory = self.new_memory(lv.result.spec.episode_id, ob.goal)
                except Exception as exc:  # e.g. the baseline's extra is missing: a clear error per episode
                    self._fail(lv, "memory", exc)

    def _decide(self, active: list[_Live]) -> None:
        cfg = self.config
        t_start = time.perf_counter()
        contexts = [
            DecisionContext(
                lv.result.spec.episode_id, lv.result.steps, lv.result.goal, lv.obs, lv.result.spec.game.task_type
            )
            for lv in active
        ]
        feats = None
        t0 = time.perf_counter()
        if self.features is not None and (self.selector.uses_features or self.record_features):
            try:
                feats = self.features.features_batch(
                    [lv.result.stream for lv in active], [lv.obs for lv in active], [lv.result.goal for lv in active]
                )
                rows = {len(getattr(feats, name)) for name in ("obs", "goal", "window", "stats")}
                if rows != {len(active)}:
                    raise ResultCountError(f"features returned {sorted(rows)} row(s) for {len(active)} episode(s)")
            except Exception as exc:  # no features: every episode of the batch fails, none waits
                for lv in active:
                    self._fail(lv, "features", exc)
                return
        t1 = time.perf_counter()
        decisions = paired_results("view selector", lambda: self.selector.select(contexts, feats), len(active))
        t2 = time.perf_counter()
        for lv, d in zip(active, decisions, strict=True):
            if isinstance(d, BaseException):
                self._fail(lv, "select", d)
        if all(lv.done for lv in active):
            return

        # Views: only for decisions that show one.
        requests, owners = [], []
        for i, (lv, d) in enumerate(zip(active, decisions, strict=True)):
            if lv.done or d.action is None:
                continue
            want_text = d.medium == "text" or self.needs_view_text
            paint = self.needs_view_image or lv.keep_views
            requests.append(
                ViewRequest(lv.result.stream, d.action, lv.result.goal, d.medium == "optical", want_text, paint)
            )
            owners.append(i)
        rendered: list[RenderedView | None] = [None] * len(active)
        views = paired_results("view service", lambda: self.services.views(requests), len(requests))
        for i, rv in zip(owners, views, strict=True):
            if isinstance(rv, BaseException):
                self._fail(active[i], "view", rv)
            else:
                rendered[i] = rv
        t3 = time.perf_counter()
        memviews = self._retrieve(active)
        t3m = time.perf_counter()

        # Policy inputs.
        inputs, idx = [], []
        for i, (lv, d, rv) in enumerate(zip(active, decisions, rendered, strict=True)):
            if lv.done:
                continue
            view_image = rv.pil() if (rv is not None and d.medium == "optical") else None
            unpainted = rv is not None and d.medium == "optical" and view_image is None
            view_text = rv.text if (rv is not None and d.medium == "text") else None
            meta: dict[str, Any] = {"episode_id": lv.result.spec.episode_id}
            if lv.html_field:
                meta["html_field"] = lv.html_field
            if lv.examples:  # EB-ALFRED's in-context examples (envs/ebalfred/examples.py)
                meta["examples"] = lv.examples
            if rv is not None and d.medium == "optical" and self.needs_view_text:
                meta["view_text"] = rv.text
            if memviews[i] is not None:
                view_image, view_text = memviews[i].image, memviews[i].text
                if view_image is not None and self.needs_view_text:
                    meta["view_text"] = memviews[i].image_text
                unpainted = False
            inputs.append(
                PolicyInput(
                    benchmark=cfg.benchmark,
                    goal=lv.result.goal,
                    observation=lv.obs,
                    admissible=lv.admissible,
                    history=_history(lv, d, cfg.short_history),
                    step=lv.result.steps,
                    view_image=view_image,
                    view_text=view_text,
                    camera_image=_camera_image(lv.frame),
                    meta=meta,
                    view_unpainted=unpainted,
                )
            )
            idx.append(i)
        outputs = paired_results("task policy", lambda: self.services.act(inputs), len(inputs))
        t4 = time.perf_counter()

        # Environment.
        env_reqs, env_idx, actions = [], [], {}
        for i, out in zip(idx, outputs, strict=True):
            lv = active[i]
            if isinstance(out, BaseException):
                self._fail(lv, "policy", out)
                continue
            action = out.action if (out.valid and out.action is not None) else _fallback_action(out.text)
            actions[i] = (action, out)
            env_reqs.append((lv.slot, action))
            env_idx.append(i)
        transitions = paired_results("env step", lambda: self.services.step(env_reqs), len(env_reqs))
        t5 = time.perf_counter()

        # Recorder.
        raws, states, rec_idx = [], [], []
        trans_of: dict[int, Transition] = {}
        for i, tr in zip(env_idx, transitions, strict=True):
            lv = active[i]
            if isinstance(tr, BaseException):
                self._fail(lv, "env", tr)
                continue
            trans_of[i] = tr
            action, out = actions[i]
            meta = {
                "step": lv.result.steps,
                "game_id": lv.result.spec.game.game_id,
                "valid_action": out.valid,
                "view": None if decisions[i].action is None else decisions[i].action.name,
                **{k: tr.meta[k] for k in FRAME_META_KEYS if k in tr.meta},
            }
            if _recorded(tr) is not None:  # teacher-forced replay: the event is the human step
                meta["predicted_action"] = action
            raw = RawEvent(
                o_pre=lv.obs,
                action=_recorded(tr) or action,
                feedback=tr.feedback,
                reward=tr.reward,
                meta=meta,
            )
            raws.append(raw)
            states.append(lv.result.stream.state)
            rec_idx.append(i)
        extractions = paired_results("phi", lambda: self.services.extract(raws, states), len(raws))
        t6 = time.perf_counter()

        n = max(len(active), 1)
        shared = {
            "features_ms": (t1 - t0) * 1000 / n,
            "select_ms": (t2 - t1) * 1000 / n,
            "view_ms": (t3 - t2) * 1000 / n,
            "policy_ms": (t4 - t3m) * 1000 / n,
            "env_ms": (t5 - t4) * 1000 / n,
            "phi_ms": (t6 - t5) * 1000 / n,
        }
        input_of = dict(zip(idx, inputs, strict=True))
        stepped: list[_Live] = []
        for i, raw, ex in zip(rec_idx, raws, extractions, strict=True):
            lv = active[i]
            if isinstance(ex, BaseException):
                self._fail(lv, "phi", ex)
                continue
            event = lv.result.stream.record(
                raw,
                entity=ex.entity,
                act=ex.act,
                delta=ex.delta,
                failed=ex.failed,
                outcome=ex.outcome,
                evidence=ex.evidence,
            )
            self._finish_step(lv, decisions[i], rendered[i], input_of[i], actions[i], trans_of[i], event)
            row = lv.result.rows[-1]
            row.update(shared)
            row["step_ms"] = (time.perf_counter() - t_start) * 1000 / n
            if feats is not None:
                for name in ("obs", "goal", "window", "stats"):
                    row[f"feat_{name}"] = np.asarray(getattr(feats, name)[i], dtype=np.float32)
            if memviews[i] is not None:
                self._memory_row(row, memviews[i], (t3m - t3) * 1000 / n)
                stepped.append(lv)
                if lv.keep_views and lv.result.views:
                    kept = lv.result.views[-1]
                    kept["view"] = self.selector.name
                    kept["png"] = _png_of_image(memviews[i].image)
                    kept["text"] = memviews[i].text
        self._write_memories(stepped)

    # ---- memory-interface conditions (baselines/memory.py) ------------------------
    def _retrieve(self, active: list[_Live]) -> list[Any]:
        """Each memory's view for this decision (``None`` without a memory); a memory that
        raises fails its episode. Memories of a batch are queried concurrently: an external
        baseline's calls are I/O bound, one thread per episode (16 episodes, 0.2 s per LLM
        call: 3.37 s sequential vs 0.27 s threaded per batch, 12.4x,
        ``benchmarks/bench_memory_threads.py``)."""
        want = [i for i, lv in enumerate(active) if lv.memory is not None and not lv.done]
        out: list[Any] = [None] * len(active)
        if not want:
            return out
        for i, got in zip(want, _map_threads(lambda i: _retrieve_one(active[i]), want), strict=True):
            if isinstance(got, BaseException):
                self._fail(active[i], "memory", got)
            else:
                out[i] = got
        return out

    def _memory_row(self, row: dict[str, Any], mv: Any, memory_ms: float) -> None:
        from memprism_ray.baselines.memory import ROW_KEYS

        row["view_medium"] = mv.medium
        row["visual_tokens"] = int(mv.visual_tokens)
        row["prompt_tokens"] = int(row["text_tokens"] + mv.visual_tokens)
        row["pixels"] = mv.pixels
        row["memory_ms"] = memory_ms
        for col in ROW_KEYS.values():
            row[col] = 0

    def _write_memories(self, stepped: list[_Live]) -> None:
        """Write each memory's step just completed (skipped after an episode's last step:
        nothing reads it) and charge the counter increments of this decision's retrieve and
        write to the step's row."""
        from memprism_ray.baselines.memory import ROW_KEYS

        todo = [lv for lv in stepped if not lv.done]
        t0 = time.perf_counter()
        results = _map_threads(lambda lv: lv.memory.write(lv.history[-1], lv.result.goal), todo)
        per_ms = (time.perf_counter() - t0) * 1000 / max(len(todo), 1)
        for lv, got in zip(todo, results, strict=True):
            lv.result.rows[-1]["memory_ms"] += per_ms
            if isinstance(got, BaseException):
                self._fail(lv, "memory", got)
        for lv in stepped:
            now = lv.memory.counters.snapshot()
            row = lv.result.rows[-1]
            for key, col in ROW_KEYS.items():
                row[col] = now[key] - lv.memory_counts.get(key, 0)
            lv.memory_counts = now

    def _finish_step(
        self,
        lv: _Live,
        decision: ViewDecision,
        rv: RenderedView | None,
        inp: PolicyInput,
        action_out: tuple[str, PolicyOutput],
        tr: Transition,
        event: Event,
    ) -> None:
        from memprism_ray.policy.prompts import build_prompt_text

        action, out = action_out
        res = lv.result
        text_tokens = self.tokens.count(build_prompt_text(inp))
        visual = rv.visual_tokens if (rv is not None and decision.medium == "optical") else 0
        camera = _camera_tokens(inp)
        row = {
            "episode_id": res.spec.episode_id,
            "game_id": res.spec.game.game_id,
            "task_type": res.spec.game.task_type,
            "step": res.steps,
            "view_index": decision.index,
            "view": None if decision.action is None else decision.action.name,
            "view_medium": decision.medium,
            "view_logprob": float(decision.logprob),
            "history_len": len(inp.history),
            "action": action,
            "policy_text": out.text,
            "valid": bool(out.valid),
            "parse_error": out.error,
            "outcome": event.outcome.value,
            "reward": float(tr.reward),
            "done": bool(tr.done),
            "won": bool(tr.won),
            "text_tokens": text_tokens,
            "visual_tokens": int(visual),
            "camera_visual_tokens": int(camera),
            "prompt_tokens": int(text_tokens + visual + camera),
            "backend_prompt_tokens": out.prompt_tokens,
            "pixels": rv.pixels if (rv is not None and decision.medium == "optical") else 0,
            "view_cached": bool(rv.cached) if rv is not None else False,
            "compose_ms": rv.compose_ms if rv is not None else 0.0,
            "render_ms": rv.render_ms if rv is not None else 0.0,
            "policy_latency_ms": out.latency_s * 1000,
        }
        recorded = _recorded(tr)
        if recorded is not None:  # teacher-forced replay (Mind2Web): the predicted action is scored, not executed
            row["recorded_action"] = recorded
            row["correct"] = bool(tr.meta.get("correct", False))
            for key in REPLAY_SCORE_KEYS:  # Mind2Web's own step metrics (eval/mind2web.py)
                if key in tr.meta:
                    row[key] = tr.meta[key]
        row.update(self.step_meta)
        res.rows.append(row)
        if lv.keep_views:
            res.views.append(
                {
                    "step": res.steps,
                    "observation": lv.obs,
                    "action": action,
                    "feedback": tr.feedback,
                    "outcome": event.outcome.value,
                    "view": row["view"],
                    "png": _png_of(rv) if (rv is not None and decision.medium == "optical") else None,
                    "text": rv.text if rv is not None else None,
                }
            )
        lv.history.append(HistoryRecord(res.steps, lv.obs, recorded or action, tr.feedback))
        res.steps += 1
        res.reward += float(tr.reward)
        lv.obs = tr.feedback
        lv.admissible = tr.admissible
        lv.frame = tr.frame
        lv.html_field = tr.meta.get("html_field") or None
        if tr.won:
            res.won = True
        if tr.done or tr.won or res.steps >= self.config.max_steps:
            lv.done = True


#: Transition meta keys of a teacher-forced replay step copied into its row: Mind2Web's
#: element correctness and operation F1 as its metric.py scores them (envs/mind2web/env.py).
REPLAY_SCORE_KEYS = ("element_correct", "op_f1")

#: Transition meta keys the raw event keeps: the synchronized frame's audit facts and the
#: simulator's success flag, which EB-ALFRED's Phi reads (paper D.2, EB-ALFRED adapter).
FRAME_META_KEYS = ("frame_step", "frame_sha1", "frame_changed", "frame_path", "last_action_success", "progress")


def _camera_image(frame: bytes | None) -> Any:
    if frame is None:
        return None
    import io

    from PIL import Image

    with Image.open(io.BytesIO(frame)) as im:
        return im.convert("RGB")


def _camera_tokens(inp: PolicyInput) -> int:
    # Counted like the optical view (views.py): Qwen2.5-VL's rule on the frame's size.
    if inp.camera_image is None:
        return 0
    from memprism_ray.render.visual_tokens import qwen25vl_tokens

    return int(qwen25vl_tokens(inp.camera_image.width, inp.camera_image.height))


def _retrieve_one(lv: _Live) -> Any:
    return lv.memory.retrieve(lv.result.goal, lv.obs, tuple(lv.history))


def _map_threads(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``fn`` over ``items``, one thread each when there are several; an exception becomes
    that item's result."""
    if len(items) <= 1:
        return each_request(fn, items)
    from concurrent.futures import ThreadPoolExecutor

    def guarded(item: Any) -> Any:
        try:
            return fn(item)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(guarded, items))


def close_memory(memory: Any) -> None:
    """Release an episode memory. A failing close loses nothing recorded (the episode's
    results are complete), so it is reported as a warning, not as an episode failure."""
    try:
        memory.close()
    except Exception as exc:
        import warnings

        warnings.warn(f"closing an episode memory failed: {type(exc).__name__}: {exc}", stacklevel=2)


def _png_of(rv: RenderedView) -> bytes | None:
    if rv.png is not None:
        return rv.png
    return _png_of_image(rv.pil())


def _png_of_image(im: Any) -> bytes | None:
    if im is None:
        return None
    import io

    buf = io.BytesIO()
    im.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


# --------------------------------------------------------------------------- Arrow and artifacts

_FEATURE_DIMS = {"feat_obs": 384, "feat_goal": 384, "feat_window": 128, "feat_stats": 8}


def rows_to_arrow(rows: Sequence[dict[str, Any]]) -> Any:
    """Step rows as a ``pyarrow.Table``; feature vectors as fixed-size float32 lists."""
    import pyarrow as pa

    if not rows:
        return pa.table({})
    names: list[str] = []
    for r in rows:
        for k in r:
            if k not in names:
                names.append(k)
    cols = {}
    for name in names:
        values = [r.get(name) for r in rows]
        if name in _FEATURE_DIMS:
            dim = _FEATURE_DIMS[name]
            flat = np.concatenate(
                [np.asarray(v, dtype=np.float32) if v is not None else np.zeros(dim, np.float32) for v in values]
            )
            cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), dim)
        else:
            cols[name] = pa.array(values)
    return pa.table(cols)


def write_episode_artifacts(result: EpisodeResult, out_dir: str | Path) -> Path:
    """Write an episode's event stream (Parquet), step rows (Parquet), step views (PNG) and
    a self-contained HTML trajectory viewer; returns the episode directory."""
    import pyarrow.parquet as pq

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in result.spec.episode_id)
    root = Path(out_dir) / safe
    (root / "views").mkdir(parents=True, exist_ok=True)
    result.stream.to_parquet(root / "events.parquet")
    if result.rows:
        pq.write_table(rows_to_arrow(result.rows), root / "steps.parquet")
    (root / "episode.json").write_text(json.dumps(result.summary(), indent=2))
    cards = []
    for v in result.views:
        img_html = ""
        if v.get("png"):
            name = f"step_{v['step']:03d}.png"
            (root / "views" / name).write_bytes(v["png"])
            b64 = base64.b64encode(v["png"]).decode()
            img_html = f'<img alt="view at step {v["step"]}" src="data:image/png;base64,{b64}">'
        elif v.get("text"):
            img_html = f"<pre>{html.escape(v['text'])}</pre>"
        outcome = html.escape(v["outcome"])
        cards.append(
            f'<section class="step {outcome}"><h2>Step {v["step"] + 1}</h2>'
            f'<p class="obs"><b>Observation</b> {html.escape(v["observation"])}</p>'
            f'<p class="view"><b>View</b> {html.escape(str(v["view"]))}</p>{img_html}'
            f'<p class="act"><b>Action</b> {html.escape(v["action"])}</p>'
            f'<p class="out"><b>Outcome</b> {outcome}: {html.escape(v["feedback"])}</p></section>'
        )
    summary = result.summary()
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(result.spec.episode_id)}</title><style>"
        "body{font-family:sans-serif;max-width:1000px;margin:auto}section{border:1px solid #ccc;"
        "margin:8px 0;padding:8px}section.exception{border-color:#c33}img{max-width:100%}"
        "pre{background:#f6f6f6;padding:6px;white-space:pre-wrap}</style></head><body>"
        f"<h1>{html.escape(result.spec.episode_id)}</h1>"
        f"<p><b>Goal</b> {html.escape(result.goal)}</p>"
        f"<p><b>Result</b> {'success' if result.won else 'failure'} in {result.steps} steps"
        f" (status {html.escape(summary['status'])})</p>" + "".join(cards) + "</body></html>"
    )
    (root / "trajectory.html").write_text(page, encoding="utf-8")
    return root
