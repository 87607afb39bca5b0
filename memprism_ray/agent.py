"""The decision loop, in-process (paper appendix D.3, "Decision-time compilation and
environment update"; docs/architecture.md "Decision step").

Each decision step runs its stages (``_router``, ``_compose_render``, ``_memory_retrieve``,
``_policy``, ``_env_step``, ``_phi``, ``_record``) once over a batch of running episodes through
:class:`AgentServices` (in-process or actor-backed), one step row per episode. A failing service
fails only the episodes it touched; an invalid policy output is no failure. Under teacher-forced
replay (Mind2Web) the env advances with the recorded human action
(``Transition.meta["recorded_action"]``), from which the event and the history are built."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from memprism_ray.baselines.base import FULL_HISTORY, DecisionContext, ViewDecision, ViewSelector
from memprism_ray.config_tree import field as cfg_field
from memprism_ray.envs.base import Env, GameRef, Observation, Transition, took_step
from memprism_ray.policy.base import HistoryRecord, PolicyInput, PolicyOutput, TaskPolicy
from memprism_ray.policy.contract import TaskContract
from memprism_ray.policy.parsing import extract_action_tag
from memprism_ray.policy.tokens import TEXT_COUNTERS, PromptTokenCounter, task_model_of
from memprism_ray.recorder.events import Event, RawEvent
from memprism_ray.recorder.phi.base import Extraction, Phi, record_extraction
from memprism_ray.recorder.stream import EventStream
from memprism_ray.router.features import FEATURE_DIMS
from memprism_ray.views import RenderedView, ViewRequest, ViewService, each_request

# --------------------------------------------------------------------------- settings


@dataclass
class AgentConfig:
    """Settings of the decision loop (paper "Experiment Setup": ALFWorld allows at most 50
    environment steps with binary terminal success as reward). The benchmark is the task
    contract's (:attr:`Agent.contract`), which the job takes from ``corpus.benchmark``."""

    #: one name for the benchmark (issue 42): the decision loop's copy had to equal it
    RENAMED: ClassVar[dict[str, str]] = {"benchmark": "/corpus.benchmark"}

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


#: Counts prompt text tokens (appendix C.1 efficiency metrics).
TokenCounter = PromptTokenCounter


# --------------------------------------------------------------------------- services


class AgentServices(Protocol):
    """The stages the loop calls, batched: one result per request, in order (an exception fails its episode)."""

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
    """One result per request from a batched stage call; a stage that raises or miscounts gives
    every request the error (an unpaired request would wait for ever: issue 10 item 1)."""
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
    """decisions taken"""
    env_steps: int = 0
    """decisions that took a step of the env's budget (EB-ALFRED's invalid outputs take none)"""
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
            "env_steps": self.env_steps,
            "status": self.status,
            "error": self.error,
        }


@dataclass
class _Turn:
    """One decision of one episode, filled in stage by stage."""

    decision: ViewDecision | None = None
    features: dict[str, np.ndarray] = field(default_factory=dict)  # the step row's feat_* columns
    view: RenderedView | None = None
    memory_view: Any = None  # MemoryView of a memory-interface condition (baselines/memory.py)
    inp: PolicyInput | None = None
    out: PolicyOutput | None = None
    action: str = ""  # what went to the environment
    tr: Transition | None = None
    raw: RawEvent | None = None
    extraction: Extraction | None = None


@dataclass
class _Live:
    """An episode being played: its result so far, what its next decision sees, its ``turn``."""

    result: EpisodeResult
    slot: int
    obs: str = ""
    admissible: tuple[str, ...] = ()
    history: list[HistoryRecord] = field(default_factory=list)
    done: bool = False
    frame: bytes | None = None  # the latest camera frame (PNG; EB-ALFRED)
    prompt_meta: dict[str, Any] = field(default_factory=dict)  # the env's text for the prompt (PROMPT_META_KEYS)
    memory: Any = None  # EpisodeMemory of a memory-interface condition (baselines/memory.py)
    memory_counts: dict[str, int] = field(default_factory=dict)  # its counters at the last step row
    keep_views: bool = False  # this episode's views are kept for the trajectory viewer
    turn: _Turn = field(default_factory=_Turn)


def _running(lives: Sequence[_Live]) -> list[_Live]:
    return [lv for lv in lives if not lv.done]


class _Clock:
    """Wall time of each stage of one decision step, ``1/n`` to each of its ``n`` episodes."""

    def __init__(self, n: int) -> None:
        self.n, self.start = max(n, 1), time.perf_counter()
        self.ms: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.ms[f"{name}_ms"] = (time.perf_counter() - t0) * 1000 / self.n


def _fallback_action(text: str) -> str:
    """What goes to the environment for an invalid policy output: the tagged text, else the first line."""
    content, _ = extract_action_tag(text)
    candidate = content if content else (text.strip().splitlines() or [""])[0]
    return candidate.strip()[:200] or "look"


def _recorded(tr: Transition) -> str | None:
    """The recorded human action of a teacher-forced replay step (Mind2Web), else ``None``."""
    recorded = tr.meta.get("recorded_action")
    return recorded if isinstance(recorded, str) and recorded else None


class Agent:
    """Plays episodes step-synchronously through :class:`AgentServices`.

    ``features`` is needed when the selector reads Router features or ``record_features`` is on
    (GRPO). ``config.keep_views`` keeps views, only for ``keep_views_for`` when given. A page is
    painted only for a pixel reader (``needs_view_image``) or a kept view, else only laid out."""

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
        contract: TaskContract | None = None,
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
        self.contract = contract if contract is not None else getattr(policy, "contract", None)
        if self.contract is None:
            raise ValueError("the agent needs the benchmark's task contract: contract=... or services.policy.contract")
        self.step_meta = dict(step_meta or {})
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
        keep = self.keep_views_for
        lives = [
            _Live(EpisodeResult(s), slot, keep_views=self.config.keep_views and (keep is None or s.episode_id in keep))
            for s, slot in zip(specs, slots, strict=True)
        ]
        try:
            self._reset(lives)
            while active := _running(lives):
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

    # ---- the decision step ------------------------------------------------------------
    def _decide(self, active: list[_Live]) -> None:
        """One decision step of every episode in ``active`` (appendix D.3)."""
        clock = _Clock(len(active))
        for lv in active:
            lv.turn = _Turn()
        self._router(active, clock)
        stages = {
            "view": self._compose_render,
            "memory": self._memory_retrieve,
            "policy": self._policy,
            "env": self._env_step,
            "phi": self._phi,
        }
        for name, stage in stages.items():
            with clock.stage(name):
                stage(_running(active))
        self._memory_write(self._record(_running(active), clock), clock.ms["memory_ms"])

    def _fail(self, live: _Live, stage: str, exc: BaseException) -> None:
        live.done = True
        live.result.status = "failed"
        live.result.error = f"{stage}: {type(exc).__name__}: {exc}"

    def _settle(self, stage: str, lives: Sequence[_Live], results: Sequence[Any], slot: str) -> None:
        """Each episode's result into its turn's ``slot``; an exception fails the episode."""
        for lv, got in zip(lives, results, strict=True):
            if isinstance(got, BaseException):
                self._fail(lv, stage, got)
            else:
                setattr(lv.turn, slot, got)

    def _reset(self, lives: list[_Live]) -> None:
        requests = [(lv.slot, lv.result.spec.game) for lv in lives]
        obs = paired_results("env reset", lambda: self.services.reset(requests), len(requests))
        for lv, ob in zip(lives, obs, strict=True):
            if isinstance(ob, BaseException):
                self._fail(lv, "reset", ob)
                continue
            lv.obs, lv.admissible, lv.frame = ob.text, ob.admissible, ob.frame
            lv.prompt_meta = {k: ob.meta.get(k) for k in PROMPT_META_KEYS}
            lv.result.goal = ob.goal
            spec = lv.result.spec
            lv.result.stream = EventStream(
                {
                    "goal": ob.goal,
                    "episode_id": spec.episode_id,
                    "game_id": spec.game.game_id,
                    "task_type": spec.game.task_type,
                    "benchmark": self.contract.name,
                }
            )
            if self.new_memory is not None:
                try:
                    lv.memory = self.new_memory(spec.episode_id, ob.goal)
                except Exception as exc:  # e.g. the baseline's extra is missing: a clear error per episode
                    self._fail(lv, "memory", exc)

    def _router(self, live: list[_Live], clock: _Clock) -> None:
        """Router (paper "Router"; appendix A.2): features z_t when needed, then one view action each."""
        feats = None
        with clock.stage("features"):
            if self.features is not None and (self.selector.uses_features or self.record_features):
                feats = self._router_features(live)
        live = _running(live)
        with clock.stage("select"):
            contexts = [
                DecisionContext(
                    lv.result.spec.episode_id, lv.result.steps, lv.result.goal, lv.obs, lv.result.spec.game.task_type
                )
                for lv in live
            ]
            decisions = paired_results("view selector", lambda: self.selector.select(contexts, feats), len(live))
            self._settle("select", live, decisions, "decision")

    def _router_features(self, live: list[_Live]) -> Any:
        try:
            feats = self.features.features_batch(
                [lv.result.stream for lv in live], [lv.obs for lv in live], [lv.result.goal for lv in live]
            )
            rows = {len(getattr(feats, name)) for name in FEATURE_DIMS}
            if rows != {len(live)}:
                raise ResultCountError(f"features returned {sorted(rows)} row(s) for {len(live)} episode(s)")
        except Exception as exc:  # no features: every episode of the batch fails, none waits
            for lv in live:
                self._fail(lv, "features", exc)
            return None
        for i, lv in enumerate(live):
            lv.turn.features = {
                f"feat_{name}": np.asarray(getattr(feats, name)[i], dtype=np.float32) for name in FEATURE_DIMS
            }
        return feats

    def _compose_render(self, live: list[_Live]) -> None:
        """Composer and Render (paper "Composer", "Render"; appendix D.3): the chosen view of E_<t."""
        showing = [lv for lv in live if lv.turn.decision.action is not None]
        requests = []
        for lv in showing:
            d = lv.turn.decision
            want_text = d.medium == "text" or self.needs_view_text
            paint = self.needs_view_image or lv.keep_views
            requests.append(
                ViewRequest(lv.result.stream, d.action, lv.result.goal, d.medium == "optical", want_text, paint)
            )
        views = paired_results("view service", lambda: self.services.views(requests), len(requests))
        self._settle("view", showing, views, "view")

    def _policy(self, live: list[_Live]) -> None:
        """Task policy (paper "Experiment Setup"; appendix D.3): u_t from X_t, g, H_short and V_t."""
        for lv in live:
            lv.turn.inp = self._policy_input(lv)
        inputs = [lv.turn.inp for lv in live]
        outputs = paired_results("task policy", lambda: self.services.act(inputs), len(inputs))
        self._settle("policy", live, outputs, "out")

    def _policy_input(self, lv: _Live) -> PolicyInput:
        d, rv, mv = lv.turn.decision, lv.turn.view, lv.turn.memory_view
        k = self.config.short_history if d.history is None else d.history  # the text history it asks for
        history = tuple(lv.history) if k == FULL_HISTORY else tuple(lv.history[-k:]) if k > 0 else ()
        optical = rv is not None and d.medium == "optical"
        view_image = rv.pil() if optical else None
        unpainted = optical and view_image is None
        view_text = rv.text if (rv is not None and d.medium == "text") else None
        meta: dict[str, Any] = {"episode_id": lv.result.spec.episode_id}
        meta.update((k, v) for k, v in lv.prompt_meta.items() if v)
        if optical and self.needs_view_text:
            meta["view_text"] = rv.text
        if mv is not None:  # a memory-interface condition: its retrieval fills the view slot
            view_image, view_text, unpainted = mv.image, mv.text, False
            if view_image is not None and self.needs_view_text:
                meta["view_text"] = mv.image_text
        return PolicyInput(
            benchmark=self.contract.name,
            goal=lv.result.goal,
            observation=lv.obs,
            admissible=lv.admissible,
            history=history,
            step=lv.result.steps,
            view_image=view_image,
            view_text=view_text,
            camera_image=_camera_image(lv.frame),
            meta=meta,
            view_unpainted=unpainted,
        )

    def _env_step(self, live: list[_Live]) -> None:
        """Environment update (appendix D.3): u_t, or an invalid output's text, to the environment."""
        for lv in live:
            out = lv.turn.out
            lv.turn.action = out.action if (out.valid and out.action is not None) else _fallback_action(out.text)
        requests = [(lv.slot, lv.turn.action) for lv in live]
        transitions = paired_results("env step", lambda: self.services.step(requests), len(requests))
        self._settle("env", live, transitions, "tr")

    def _phi(self, live: list[_Live]) -> None:
        """Recorder, extraction (paper "Recorder"; appendix D.1-D.2): each transition read by Phi."""
        for lv in live:
            t = lv.turn
            meta = {
                "step": lv.result.steps,
                "game_id": lv.result.spec.game.game_id,
                "valid_action": t.out.valid,
                "view": None if t.decision.action is None else t.decision.action.name,
                **{k: t.tr.meta[k] for k in FRAME_META_KEYS if k in t.tr.meta},
            }
            if (recorded := _recorded(t.tr)) is not None:
                meta["predicted_action"] = t.action
            t.raw = RawEvent(lv.obs, recorded or t.action, t.tr.feedback, t.tr.reward, meta=meta)
        raws, states = [lv.turn.raw for lv in live], [lv.result.stream.state for lv in live]
        extractions = paired_results("phi", lambda: self.services.extract(raws, states), len(raws))
        self._settle("phi", live, extractions, "extraction")

    def _record(self, live: list[_Live], clock: _Clock) -> list[_Live]:
        """Recorder, append (appendix D.3): e~_t joins the stream (the view never does)."""
        for lv in live:
            event = record_extraction(lv.result.stream, lv.turn.raw, lv.turn.extraction)
            lv.result.rows.append(self._step_row(lv, event, clock))
            if lv.keep_views:
                lv.result.views.append(self._kept_view(lv, event))
            self._advance(lv)
        return live

    def _step_row(self, lv: _Live, event: Event, clock: _Clock) -> dict[str, Any]:
        t, res = lv.turn, lv.result
        rv, inp, out, tr = t.view, t.inp, t.out, t.tr
        optical = rv is not None and t.decision.medium == "optical"
        text_tokens = self.tokens.count(self.contract.build_prompt_text(inp))
        visual = rv.visual_tokens if optical else 0
        camera = _camera_tokens(inp)
        row = {
            "episode_id": res.spec.episode_id,
            "game_id": res.spec.game.game_id,
            "task_type": res.spec.game.task_type,
            "step": res.steps,
            "view_index": t.decision.index,
            "view": None if t.decision.action is None else t.decision.action.name,
            "view_medium": t.decision.medium,
            "view_logprob": float(t.decision.logprob),
            "history_len": len(inp.history),
            "action": t.action,
            "policy_text": out.text,
            "valid": bool(out.valid),
            "parse_error": out.error,
            "outcome": event.outcome.value,
            # an LLM Phi's failed extraction, recorded by the rules instead (docs/phi.md): counted by
            # the reports and the GRPO rows, never silent
            "phi_fallback": event.evidence.get("phi_fallback"),
            "reward": float(tr.reward),
            "done": bool(tr.done),
            "won": bool(tr.won),
            "text_tokens": text_tokens,
            "visual_tokens": int(visual),
            "camera_visual_tokens": int(camera),
            "prompt_tokens": int(text_tokens + visual + camera),
            "backend_prompt_tokens": out.prompt_tokens,
            "pixels": rv.pixels if optical else 0,
            "view_cached": bool(rv.cached) if rv is not None else False,
            "compose_ms": rv.compose_ms if rv is not None else 0.0,
            "render_ms": rv.render_ms if rv is not None else 0.0,
            "policy_latency_ms": out.latency_s * 1000,
        }
        recorded = _recorded(tr)
        if recorded is not None:  # teacher-forced replay (Mind2Web): the predicted action is scored, not executed
            row["recorded_action"] = recorded
            row["correct"] = bool(tr.meta.get("correct", False))
            for key in REPLAY_SCORE_KEYS:  # Mind2Web's own step metrics (benchmark/mind2web/report.py)
                if key in tr.meta:
                    row[key] = tr.meta[key]
        row.update((k, tr.meta[k]) for k in STEP_ROW_META_KEYS if k in tr.meta)
        row.update(self.step_meta)
        row.update((k, ms) for k, ms in clock.ms.items() if k != "memory_ms")  # a memory row has its own
        row["step_ms"] = (time.perf_counter() - clock.start) * 1000 / clock.n
        row.update(t.features)
        return row

    def _kept_view(self, lv: _Live, event: Event) -> dict[str, Any]:
        """The step as the trajectory viewer shows it (:mod:`memprism_ray.eval.artifacts`)."""
        t, rv = lv.turn, lv.turn.view
        optical = rv is not None and t.decision.medium == "optical"
        return {
            "step": lv.result.steps,
            "observation": lv.obs,
            "action": t.action,
            "feedback": t.tr.feedback,
            "outcome": event.outcome.value,
            "view": None if t.decision.action is None else t.decision.action.name,
            "png": (rv.png if rv.png is not None else png_of_image(rv.pil())) if optical else None,
            "text": rv.text if rv is not None else None,
        }

    def _advance(self, lv: _Live) -> None:
        res, tr = lv.result, lv.turn.tr
        lv.history.append(HistoryRecord(res.steps, lv.obs, _recorded(tr) or lv.turn.action, tr.feedback))
        res.steps += 1
        res.env_steps += took_step(tr)
        res.reward += float(tr.reward)
        lv.obs, lv.admissible, lv.frame = tr.feedback, tr.admissible, tr.frame
        lv.prompt_meta.update((k, tr.meta.get(k)) for k in STEP_PROMPT_KEYS)
        if tr.won:
            res.won = True
        # max_steps counts the env's steps, not decisions (EB-ALFRED's 30 are simulator steps; a non-skill
        # output takes none, as in EmbodiedBench's evaluator). Decisions that take no step are capped at
        # max_steps too, so no env keeps an episode going for ever (EB-ALFRED's 10-invalid limit ends it first).
        limit = self.config.max_steps
        if tr.done or tr.won or res.env_steps >= limit or res.steps - res.env_steps >= limit:
            lv.done = True

    # ---- memory-interface conditions (baselines/memory.py; paper appendix "External baselines")
    def _memory_retrieve(self, live: list[_Live]) -> None:
        """Each memory's view for this decision, one thread per episode (I/O bound:
        ``benchmarks/results/bench_memory_threads.json``)."""
        want = [lv for lv in live if lv.memory is not None]
        got = _map_threads(lambda lv: lv.memory.retrieve(lv.result.goal, lv.obs, tuple(lv.history)), want)
        self._settle("memory", want, got, "memory_view")

    def _memory_write(self, recorded: list[_Live], memory_ms: float) -> None:
        """The memory's part of each step row and kept view; the completed step written to it."""
        from memprism_ray.baselines.memory import ROW_KEYS

        stepped = [lv for lv in recorded if lv.turn.memory_view is not None]
        for lv in stepped:
            mv, row = lv.turn.memory_view, lv.result.rows[-1]
            row.update(view_medium=mv.medium, visual_tokens=int(mv.visual_tokens), pixels=mv.pixels)
            row.update(prompt_tokens=int(row["text_tokens"] + mv.visual_tokens), memory_ms=memory_ms)
            if lv.keep_views:
                lv.result.views[-1].update(view=self.selector.name, png=png_of_image(mv.image), text=mv.text)
        todo = _running(stepped)
        t0 = time.perf_counter()
        results = _map_threads(lambda lv: lv.memory.write(lv.history[-1], lv.result.goal), todo)
        per_ms = (time.perf_counter() - t0) * 1000 / max(len(todo), 1)
        for lv, got in zip(todo, results, strict=True):
            lv.result.rows[-1]["memory_ms"] += per_ms
            if isinstance(got, BaseException):
                self._fail(lv, "memory", got)
        for lv in stepped:
            now = lv.memory.counters.snapshot()
            lv.result.rows[-1].update((col, now[key] - lv.memory_counts.get(key, 0)) for key, col in ROW_KEYS.items())
            lv.memory_counts = now


#: Transition meta keys of a teacher-forced replay step copied into its row (Mind2Web's metrics).
REPLAY_SCORE_KEYS = ("element_correct", "op_f1")

#: Transition meta keys copied into the step row when the env sets them: what happened to the action
#: EB-ALFRED executed or rejected, and its invalid-action count (benchmark/ebalfred/env.py; issue 41 item 2).
STEP_ROW_META_KEYS = ("execution", "invalid_actions")

#: Observation meta keys passed into the prompt's meta when set (:data:`STEP_PROMPT_KEYS`: renewed each step).
PROMPT_META_KEYS = ("html_field", "examples")
STEP_PROMPT_KEYS = ("html_field",)

#: Transition meta keys the raw event keeps: EB-ALFRED's frame facts and success flag (paper D.2).
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


def _map_threads(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``fn`` over ``items``, one thread each; an exception becomes that item's result."""
    if len(items) <= 1:
        return each_request(fn, items)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(lambda item: each_request(fn, [item])[0], items))


def close_memory(memory: Any) -> None:
    """Release an episode memory; a failing close loses nothing recorded, so it only warns."""
    try:
        memory.close()
    except Exception as exc:
        import warnings

        warnings.warn(f"closing an episode memory failed: {type(exc).__name__}: {exc}", stacklevel=2)


def png_of_image(im: Any) -> bytes | None:
    """``im`` as the PNG bytes an evaluation keeps of a view (artifacts, :mod:`memprism_ray.memory`)."""
    if im is None:
        return None
    import io

    buf = io.BytesIO()
    im.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


# --------------------------------------------------------------------------- step table


def rows_to_arrow(rows: Sequence[dict[str, Any]]) -> Any:
    """Step rows as a ``pyarrow.Table`` (schema: :mod:`memprism_ray.adapter.tables`)."""
    import pyarrow as pa

    if not rows:
        return pa.table({})
    names = dict.fromkeys(k for r in rows for k in r)  # every column, in order of first appearance
    cols = {}
    for name in names:
        values = [r.get(name) for r in rows]
        dim = FEATURE_DIMS.get(name[len("feat_") :]) if name.startswith("feat_") else None
        if dim is not None:
            flat = np.concatenate(
                [np.zeros(dim, np.float32) if v is None else np.asarray(v, np.float32) for v in values]
            )
            cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), dim)
        else:
            cols[name] = pa.array(values)
    return pa.table(cols)
