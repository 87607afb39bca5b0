"""View teachers for D1 (paper: "Adapter", eq. view-teacher; appendix A.3, D.4, E.2).

A view teacher maps a decision state and its reference next action ``u_t^ref`` to a
:class:`TeacherLabel`: ``q_T(a | o_t, g, E_<t, u_t^ref)`` as float32 [144] (eq. A.1 order) and ``stats``.

LLMViewTeacher
    The paper's teacher: an appendix-E.2 prompt (verbatim in ``router/prompts/``; a benchmark may
    bring its own, :meth:`memprism_ray.benchmark.Benchmark.llm_teacher`), filled with JSON values
    (the prompts hold literal braces, so never ``str.format``) and sent through the shared
    :class:`~memprism_ray.llm_client.ChatClient`. The reply is parsed as data, never evaluated;
    rejected items are counted in ``stats`` (``malformed_item``, ``unknown_name``, ``bad_score``,
    ``duplicate`` (summed), ``over_top_k``); a reply with no positive score raises
    :class:`TeacherResponseError`.

CounterfactualTeacher
    Needs no external LLM: ``m(a)``, the probability that the frozen task policy produces
    ``u_ref`` under view ``a`` (exact from ``probs``, else from ``samples_per_view`` calls of
    ``act``), and the structural cost ``C(a)`` (:func:`memprism_ray.view_space.cost`) give

        rule "margin" (default):  q(a) ∝ [m(a) >= (1 - margin) max_b m(b)] * m(a) * exp(-C(a) / T_c)
        rule "proportional":      q(a) ∝ m(a) * exp(-C(a) / T_c)
        rule "best":              q(a) ∝ [m(a) = max_b m(b)] * exp(-C(a) / T_c)

    over the candidates (the prompt's Phase 1 discrimination, Phase 2 cost tie-break). The margin
    is relative: while exploring, ``m`` is about 1 / #unvisited places. ``T_c = 0.1`` weighs the
    cheapest view e^10 times the dearest, so the cost decided every label and collapsed the
    Router to one cheap view; ``T_c >= 1`` keeps it a small regulariser (the paper's
    ``lambda_C = 0.02``). ``page_token_temperature = T > 0`` shades by each page's visual tokens,
    ``exp(-tokens/T)``, instead (docs/embedded-default-results.md, "Phase 2 by the page's visual
    tokens"). A state whose ``max m - min m`` is below ``min_spread`` is ``uninformative``: by
    default a ``fallback`` label D1 skips, with ``uninformative="tie_break"`` the label
    ``q ∝ exp(-C/T)`` over all candidates (docs/embedded-default-results.md, "Uninformative
    states"). With no match anywhere, ``no_match="cost_prior"`` gives ``q ∝ exp(-C/T_c)`` (a
    fallback) and ``no_match="raise"`` a :class:`TeacherResponseError`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from memprism_ray.config_tree import field as cfg_field
from memprism_ray.llm_client import ChatClient, Closing, EndpointConfig, LLMCounters, LLMError, LLMReplyError
from memprism_ray.recorder import EventStream, StreamRecord
from memprism_ray.recorder.phi.prompt import VerbatimPrompt
from memprism_ray.view_space import ALL_ACTIONS, FACTORS, NUM_ACTIONS, ViewAction, cost_vector, factor_options

log = logging.getLogger(__name__)

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"


class TeacherPrompt(VerbatimPrompt):
    """One view-teacher prompt of appendix E.2 (``name`` is each label's ``stats["prompt"]``)."""

    what: ClassVar[str] = "view-teacher prompt"
    prompt_dir: ClassVar[Path] = PROMPT_DIR


GENERIC_PROMPT = TeacherPrompt(
    "generic",
    ("observation", "goal", "event_stream", "reference_next_action", "target_vlm_spec", "view_action_space", "top_k"),
    path=PROMPT_DIR / "view_teacher_generic.txt",
)

DEFAULT_TARGET_VLM_SPEC: dict[str, Any] = {
    "model": "Qwen2.5-VL-7B-Instruct",
    "frozen": True,
    "inputs": ["current observation", "goal", "short text history", "rendered view image"],
}


class TeacherError(ValueError):
    """Base class of teacher failures (a ``ValueError``: one line for the CLI)."""


class TeacherResponseError(TeacherError):
    """The teacher's reply could not be turned into a distribution."""


class TeacherRequestError(TeacherError):
    """The endpoint could not be reached or kept failing after the retries."""


@dataclass
class TeacherLabel:
    """``q_T(. | t)`` as float32 [144] (eq. A.1 order) plus labelling statistics."""

    distribution: np.ndarray
    stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        q = np.asarray(self.distribution, dtype=np.float32)
        if q.shape != (NUM_ACTIONS,):
            raise ValueError(f"TeacherLabel.distribution must have shape ({NUM_ACTIONS},), got {q.shape}")
        if not np.isfinite(q).all() or (q < 0).any():
            raise ValueError("TeacherLabel.distribution must be finite and non-negative")
        if abs(float(q.sum(dtype=np.float64)) - 1.0) > 1e-4:
            raise ValueError(f"TeacherLabel.distribution must sum to 1, sums to {float(q.sum()):.6f}")
        self.distribution = q


def _normalised(weights: np.ndarray) -> np.ndarray:
    total = math.fsum(float(w) for w in weights)
    return (weights / total).astype(np.float32)


# --- prompts -------------------------------------------------------------------------------
def view_action_space_description() -> dict[str, list[str]]:
    """The ``view_action_space`` input: the canonical option names of each factor."""
    return {f: list(factor_options(f)) for f in FACTORS}


def serialize_stream(stream: EventStream | Sequence[StreamRecord]) -> list[dict[str, Any]]:
    """The ``event_stream`` input of the Generic prompt: one object per recorded step."""
    out = []
    for rec in stream:
        ev = rec.event
        out.append(
            {
                "step": ev.t,
                "action": rec.raw.action,
                "entity": ev.entity,
                "action_type": ev.act,
                "outcome": ev.outcome.value,
                "delta": [d.to_dict() for d in ev.delta],
                "feedback": rec.raw.feedback,
            }
        )
    return out


# --- decision states -----------------------------------------------------------------------
@dataclass(frozen=True)
class DecisionState:
    """One offline decision of a reference trajectory: ``(o_t, g, E_<t, u_t^ref)`` (eq. view-teacher);
    ``history`` holds the records before ``step`` (1-based)."""

    history: tuple[StreamRecord, ...]
    observation: str
    goal: str
    reference_action: str | Mapping[str, Any]
    step: int
    task_id: str = ""

    @property
    def sample_id(self) -> str:
        return f"{self.task_id}#{self.step}" if self.task_id else f"#{self.step}"


def decision_states(stream: EventStream, goal: str | None = None, task_id: str | None = None) -> list[DecisionState]:
    """Every decision of a recorded reference trajectory, in order (goal and task id default to ``stream.meta``'s)."""
    goal = goal if goal is not None else stream.meta.get("goal")
    if not isinstance(goal, str) or not goal:
        raise ValueError("decision_states needs the task goal: pass goal= or set stream.meta['goal']")
    task = task_id if task_id is not None else str(stream.meta.get("task_id", ""))
    records = stream.records
    return [
        DecisionState(records[:i], rec.raw.o_pre, goal, rec.raw.action, i + 1, task) for i, rec in enumerate(records)
    ]


# --- response parsing -------------------------------------------------------------------------
_VIEW_KEYS = ("a_view", "view", "view_action", "action")
_SCORE_KEYS = ("score", "prob", "probability", "weight")
_LIST_KEYS = ("teacher_distribution", "distribution", "labels")


def _item_view(item: Mapping[str, Any]) -> Any:
    for key in _VIEW_KEYS:
        if key in item:
            return item[key]
    if all(k in item for k in FACTORS):
        return {k: item[k] for k in FACTORS}
    return None


def _as_score(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0.0 else None


def parse_teacher_response(text: str, *, top_k: int | None = None) -> TeacherLabel:
    """Turn a teacher reply into a :class:`TeacherLabel` (rules in the module docstring)."""
    if not isinstance(text, str):
        raise TeacherResponseError(f"teacher reply must be text, got {type(text).__name__}")
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise TeacherResponseError("teacher reply holds no JSON object (no '{' ... '}')")
    try:
        payload = json.loads(text[start : end + 1])
    except (json.JSONDecodeError, RecursionError) as exc:
        raise TeacherResponseError(
            f"teacher reply is not valid JSON between the first '{{' and last '}}': {exc}"
        ) from None
    if not isinstance(payload, dict):
        raise TeacherResponseError("teacher reply JSON is not an object")
    items = next((payload[k] for k in _LIST_KEYS if k in payload), None)
    if not isinstance(items, list):
        raise TeacherResponseError("teacher reply has no 'teacher_distribution' list")
    reasons = ("malformed_item", "unknown_name", "bad_score", "duplicate", "over_top_k")
    stats: dict[str, Any] = {"items": len(items), "accepted": 0, **dict.fromkeys(reasons, 0)}
    scores: dict[int, float] = {}
    for item in items:
        view = _item_view(item) if isinstance(item, dict) else None
        if view is None:
            stats["malformed_item"] += 1
            continue
        try:
            if isinstance(view, Mapping):
                if not all(k in view for k in FACTORS):
                    stats["malformed_item"] += 1
                    continue
                action = ViewAction(*(view[k] for k in FACTORS))
            elif isinstance(view, str):
                action = ViewAction.parse(view)
            else:
                stats["malformed_item"] += 1
                continue
        except ValueError:
            stats["unknown_name"] += 1
            continue
        score = _as_score(next((item[k] for k in _SCORE_KEYS if k in item), None))
        if score is None:
            stats["bad_score"] += 1
            continue
        if action.index in scores:
            stats["duplicate"] += 1
            scores[action.index] += score
        else:
            scores[action.index] = score
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    if top_k is not None and len(ranked) > top_k:
        stats["over_top_k"] = len(ranked) - top_k
        ranked = ranked[:top_k]
    ranked = [(i, s) for i, s in ranked if s > 0.0]
    stats["accepted"] = len(ranked)
    if not ranked:
        raise TeacherResponseError(f"teacher reply has no valid view with a positive score ({stats})")
    weights = np.zeros(NUM_ACTIONS, dtype=np.float64)
    for i, s in ranked:
        weights[i] = s
    stats["raw_score_sum"] = math.fsum(s for _, s in ranked)
    return TeacherLabel(_normalised(weights), stats)


# --- the LLM teacher --------------------------------------------------------------------------
@dataclass
class LLMTeacherConfig(EndpointConfig):
    """The LLM view teacher's settings, declared once: the job's ``label.llm`` section (appendix E.2)."""

    SECTION: ClassVar[str] = "label.llm"

    model: str = cfg_field("Qwen/Qwen2.5-72B-Instruct", help="served model name sent in each request")
    timeout_s: float = cfg_field(300.0, help="per-request timeout in seconds (endpoint)")
    backoff_s: float = cfg_field(1.0, help="first retry delay in seconds, doubled each retry")
    source: str = cfg_field(
        "endpoint", help="'endpoint' (base_url) or 'pool' (the policy pool's vLLM engines: policy.backend vllm)"
    )
    concurrency: int = cfg_field(64, help="teacher requests in flight per labelling task")
    top_k: int = cfg_field(5, help="soft labels requested and kept")
    temperature: float = cfg_field(0.0, help="teacher sampling temperature")
    max_tokens: int = cfg_field(1024, help="completion token limit per decision")
    target_vlm_spec: dict[str, Any] = cfg_field(
        default_factory=lambda: dict(DEFAULT_TARGET_VLM_SPEC), help="target_vlm_spec prompt input"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        s = self.SECTION
        if self.source not in ("endpoint", "pool"):
            raise ValueError(f"{s}.source must be 'endpoint' or 'pool', got {self.source!r}")
        if not 1 <= self.top_k <= NUM_ACTIONS:
            raise ValueError(f"{s}.top_k must be in [1, {NUM_ACTIONS}], got {self.top_k}")
        if self.temperature < 0 or self.max_tokens < 1 or self.concurrency < 1:
            raise ValueError(f"{s} needs temperature >= 0, max_tokens >= 1 and concurrency >= 1")


class LLMViewTeacher(Closing):
    """The appendix-E.2 view teacher (module docstring); a benchmark's own sets :attr:`prompt` and
    :meth:`state_inputs`. ``complete_fn`` (prompt -> reply) replaces the HTTP endpoint, e.g. the
    policy pool's vLLM engines (memprism_ray/adapter/d1_labels.py)."""

    prompt: ClassVar[TeacherPrompt] = GENERIC_PROMPT

    def __init__(
        self, config: LLMTeacherConfig, *, transport: Any = None, complete_fn: Callable[[str], str] | None = None
    ) -> None:
        self.config = config
        self.template = self.prompt.load()
        self.counters = LLMCounters()
        self._client = ChatClient(config, counters=self.counters, transport=transport)
        self._complete_fn = complete_fn

    def close(self) -> None:
        self._client.close()

    def build_prompt(self, inputs: Mapping[str, Any]) -> str:
        """Fill the template; every input is inserted as JSON (``top_k`` from the config)."""
        values = dict(inputs)
        if "top_k" in values:
            raise ValueError(f"top_k comes from {self.config.SECTION}.top_k, do not pass it as an input")
        values.setdefault("target_vlm_spec", self.config.target_vlm_spec)
        values.setdefault("view_action_space", view_action_space_description())
        try:
            filled = {k: json.dumps(v, ensure_ascii=False) for k, v in values.items()}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"view-teacher prompt inputs must be JSON-serialisable: {exc}") from None
        filled["top_k"] = str(int(self.config.top_k))
        return self.prompt.fill(filled, self.template)

    def state_inputs(self, state: DecisionState) -> dict[str, Any]:
        """Generic-prompt inputs of a :class:`DecisionState`."""
        return self.generic_inputs(state.history, state.observation, state.goal, state.reference_action)

    def generic_inputs(
        self,
        stream: EventStream | Sequence[StreamRecord],
        observation: str,
        goal: str,
        reference_next_action: str | Mapping[str, Any],
    ) -> dict[str, Any]:
        """Inputs of the Generic prompt built from an event stream."""
        return {
            "observation": observation,
            "goal": goal,
            "event_stream": serialize_stream(stream),
            "reference_next_action": reference_next_action,
        }

    def complete(self, prompt: str) -> str:
        """Send one chat request; returns the assistant message text."""
        if self._complete_fn is not None:
            self.counters.add("requests")
            try:
                return self._complete_fn(prompt)
            except TeacherError:
                self.counters.add("failures")
                raise
            except Exception as exc:  # the serving side failed (replica died, engine error)
                self.counters.add("failures")
                raise TeacherRequestError(f"teacher backend failed: {type(exc).__name__}: {exc}") from exc
        if not self.config.model:
            raise ValueError(f"{self.config.SECTION}.model is empty: set it to the model name the endpoint serves")
        messages = [{"role": "user", "content": prompt}]
        try:
            reply = self._client.chat(messages, temperature=self.config.temperature, max_tokens=self.config.max_tokens)
        except LLMReplyError as exc:
            raise TeacherResponseError(f"teacher {exc}") from None
        except LLMError as exc:
            raise TeacherRequestError(f"teacher endpoint: {exc}") from None
        return reply.text

    def label(self, inputs: Mapping[str, Any]) -> TeacherLabel:
        """Build the prompt from ``inputs``, query the endpoint and parse the soft labels."""
        reply = self.complete(self.build_prompt(inputs))
        label = parse_teacher_response(reply, top_k=self.config.top_k)
        label.stats["prompt"] = self.prompt.name
        return label


# --- the counterfactual teacher ---------------------------------------------------------------
@dataclass
class CounterfactualConfig:
    """The counterfactual teacher's settings, declared once: the job's ``label.counterfactual``
    section (rule in the module docstring)."""

    SECTION: ClassVar[str] = "label.counterfactual"

    samples_per_view: int = cfg_field(2, help="policy samples per candidate view (S), for a policy without exact probs")
    cost_temperature: float = cfg_field(
        1.0, help="T_c of the cost shading exp(-C/T_c) (0.1 let the cost decide every label)"
    )
    candidates: tuple[int, ...] | None = cfg_field(None, help="view indices to try; None: all 144")
    rule: str = cfg_field("margin", help="margin, proportional or best (module docstring)")
    margin: float = cfg_field(0.1, help="rule margin: keep views with m >= (1 - margin) max m")
    min_spread: float = cfg_field(0.05, help="states whose max m - min m is below this are uninformative (0: keep all)")
    no_match: str = cfg_field("cost_prior", help="when no view matches: cost_prior or raise")
    uninformative: str = cfg_field(
        "skip",
        help="states where every view gives the same action: skip (a fallback D1 drops, counted) or "
        "tie_break (the label is the cost tie-break over all views)",
    )
    tie_break_temperature: float = cfg_field(
        0.0, help="uninformative=tie_break: T of q ∝ exp(-C/T) over all views (0: T_c)"
    )
    page_token_temperature: float = cfg_field(
        0.0,
        help="Phase 2 by the rendered page's visual tokens: exp(-tokens/T) in place of exp(-C/T_c) "
        "(0: the structural cost); needs a page_tokens callable",
    )

    def __post_init__(self) -> None:
        s = self.SECTION
        if not self.page_token_temperature >= 0:
            raise ValueError(
                f"{s}.page_token_temperature must be >= 0 (0: structural cost), got {self.page_token_temperature}"
            )
        if self.samples_per_view < 1:
            raise ValueError(f"{s}.samples_per_view must be >= 1, got {self.samples_per_view}")
        if not self.cost_temperature > 0:
            raise ValueError(f"{s}.cost_temperature must be > 0, got {self.cost_temperature}")
        if self.rule not in ("margin", "proportional", "best"):
            raise ValueError(f"{s}.rule must be 'margin', 'proportional' or 'best', got {self.rule!r}")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"{s}.margin must be in [0, 1), got {self.margin}")
        if not 0.0 <= self.min_spread < 1.0:
            raise ValueError(f"{s}.min_spread must be in [0, 1), got {self.min_spread}")
        if self.no_match not in ("cost_prior", "raise"):
            raise ValueError(f"{s}.no_match must be 'cost_prior' or 'raise', got {self.no_match!r}")
        if self.uninformative not in ("skip", "tie_break"):
            raise ValueError(f"{s}.uninformative must be 'skip' or 'tie_break', got {self.uninformative!r}")
        if not self.tie_break_temperature >= 0:
            raise ValueError(f"{s}.tie_break_temperature must be >= 0 (0: T_c), got {self.tie_break_temperature}")
        if self.candidates is not None:
            cands = tuple(int(i) for i in self.candidates)
            if not cands:
                raise ValueError(f"{s}.candidates must not be empty (None means all 144)")
            bad = [i for i in cands if not 0 <= i < NUM_ACTIONS]
            if bad or len(set(cands)) != len(cands):
                raise ValueError(f"{s}.candidates must be distinct indices in [0, 144); bad: {bad}")
            self.candidates = cands


def normalize_action(action: str | Mapping[str, Any]) -> str:
    """Comparison key of an environment action: case- and whitespace-insensitive."""
    if isinstance(action, Mapping):
        norm = {str(k): (" ".join(v.lower().split()) if isinstance(v, str) else v) for k, v in action.items()}
        return json.dumps(norm, sort_keys=True, separators=(",", ":"))
    if isinstance(action, str):
        text = action.strip()
        if text.startswith("{"):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                return normalize_action(parsed)
        return " ".join(text.lower().split())
    raise ValueError(f"an action must be str or a mapping, got {type(action).__name__}")


class CounterfactualTeacher:
    """Labels a decision by replaying the frozen policy (``act``, or exact ``probs``) under each candidate view."""

    def __init__(
        self,
        act: Callable[[Any, ViewAction], str | Mapping[str, Any]] | None,
        config: CounterfactualConfig | None = None,
        *,
        probs: Callable[[Any, ViewAction], Mapping[str, float]] | None = None,
        page_tokens: Callable[[Any, ViewAction], int] | None = None,
    ) -> None:
        if act is None and probs is None:
            raise ValueError("CounterfactualTeacher needs act(state, view) -> action or probs(state, view) -> dict")
        if act is not None and not callable(act):
            raise ValueError("CounterfactualTeacher needs a callable act(state, view_action) -> action")
        if probs is not None and not callable(probs):
            raise ValueError("CounterfactualTeacher probs must be callable: probs(state, view_action) -> dict")
        self.act = act
        self.probs = probs
        self.config = config or CounterfactualConfig()
        if self.config.page_token_temperature > 0 and not callable(page_tokens):
            raise ValueError(
                f"{self.config.SECTION}.page_token_temperature > 0 needs page_tokens(state, view) -> visual tokens"
            )
        self.page_tokens = page_tokens
        self._cost = np.asarray(cost_vector(), dtype=np.float64)

    def match_rates(self, state: Any, reference_action: str | Mapping[str, Any]) -> dict[int, float]:
        """``m(a)`` for every candidate index."""
        ref = normalize_action(reference_action)
        cands = self.config.candidates or tuple(range(NUM_ACTIONS))
        rates: dict[int, float] = {}
        if self.probs is not None:
            for i in cands:
                dist = self.probs(state, ALL_ACTIONS[i])
                rates[i] = float(sum(p for a, p in dist.items() if normalize_action(a) == ref))
            return rates
        s = self.config.samples_per_view
        assert self.act is not None
        for i in cands:
            view = ALL_ACTIONS[i]
            hits = sum(normalize_action(self.act(state, view)) == ref for _ in range(s))
            rates[i] = hits / s
        return rates

    def label(self, state: Any, reference_action: str | Mapping[str, Any]) -> TeacherLabel:
        rates = self.match_rates(state, reference_action)
        cands = np.fromiter(rates, dtype=np.int64)
        m = np.fromiter(rates.values(), dtype=np.float64)
        best = float(m.max())
        spread = best - float(m.min())
        cfg = self.config
        stats: dict[str, Any] = {
            "candidates": len(cands),
            "policy_calls": len(cands) * (1 if self.probs is not None else cfg.samples_per_view),
            "matched_views": int((m > 0).sum()),
            "best_match_rate": best,
            "match_spread": spread,
            "fallback": False,
            "uninformative": False,
        }
        prior = self._phase2_prior(state, cands)
        if best == 0.0:
            if cfg.no_match == "raise":
                raise TeacherResponseError(
                    f"no candidate view led the policy to the reference action {reference_action!r}"
                )
            score = prior
            stats["fallback"] = True
        elif spread < cfg.min_spread:
            # Every view gives the same action: all candidates are equally discriminative.
            stats["uninformative"] = True
            if cfg.uninformative == "tie_break":
                # Phase 2 over all of them: the cheaper view is the label (appendix E.2).
                temp = cfg.tie_break_temperature or cfg.cost_temperature
                score = np.exp(-self._cost[cands] / temp)
            else:
                score = prior
                stats["fallback"] = True
        elif cfg.rule == "best":
            score = (m == best) * prior
        elif cfg.rule == "margin":
            score = (m >= (1.0 - cfg.margin) * best) * m * prior
        else:
            score = m * prior
        weights = np.zeros(NUM_ACTIONS, dtype=np.float64)
        weights[cands] = score
        return TeacherLabel(_normalised(weights), stats)

    def _phase2_prior(self, state: Any, cands: np.ndarray) -> np.ndarray:
        """The cost shading of the candidates: ``exp(-C/T_c)`` on the structural cost, or
        ``exp(-tokens/T)`` on the visual tokens of each candidate's page at this state."""
        temp = self.config.page_token_temperature
        if temp <= 0:
            return np.exp(-self._cost[cands] / self.config.cost_temperature)
        assert self.page_tokens is not None
        tokens = np.array([float(self.page_tokens(state, ALL_ACTIONS[int(i)])) for i in cands])
        # Relative to the cheapest candidate: the same weights, no underflow on large pages.
        return np.exp(-(tokens - tokens.min()) / temp)
