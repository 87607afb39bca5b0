"""MemPrism in any agent (issue 43): record your agent's steps, ask for the view a trained
Router picks, in your own process, no Ray needed.

The paper's pipeline for one decision (appendix D.3), as a library: each step an agent took is
recorded in its session's event stream through Phi (paper "Recorder": the benchmark's rules or
the LLM Phi on its prompt, any OpenAI-compatible endpoint); before the next step the Router
picks one of the 144 views from the stream, the observation and the task (paper "Router"), the
Composer builds it and Render draws it (paper "Composer", "Render"): a PNG page, its text twin,
the view chosen and its probability, and what the page costs in visual and text tokens. The
same code as the jobs' evaluation, so a session that replays an evaluated episode gets the
evaluation's choices and image bytes (``tests/test_memory.py``)::

    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.memory import Memory

    memory = Memory(get_benchmark("alfworld").phi_spec(), checkpoint="runs/local/checkpoints/iter_0020")
    session = memory.session("put a clean mug in coffeemachine.")
    view = session.view(observation)            # before acting: the view of the steps so far
    ...                                         # your model reads view.png (or view.text) and acts
    session.record(observation, action, feedback)

``Memory(..., view="fixed:TemporalTrace")`` shows one fixed view instead of a Router's, and
``marginal=`` samples views from a 144-way marginal (the paper's frequency-matched baseline).
:meth:`Memory.views` answers many sessions in one batch (one encoder pass). A Router and the
text encoder are loaded once per process, whatever the number of :class:`Memory` objects.
docs/memory.md has a whole agent around it.
"""

from __future__ import annotations

import hashlib
import math
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.baselines.base import DecisionContext, ViewSelector
from memprism_ray.recorder.events import Event, RawEvent
from memprism_ray.recorder.phi.base import Phi, record_event
from memprism_ray.recorder.phi.config import PhiConfig
from memprism_ray.recorder.phi.spec import PhiSpec
from memprism_ray.recorder.stream import EventStream
from memprism_ray.render.config import RenderConfig
from memprism_ray.router.encoder import EncoderConfig
from memprism_ray.views import ViewRequest, ViewService

#: The most steps one session records: a session is one episode, and the paper's horizons are
#: at most 50 (ALFWorld), 30 (EB-ALFRED) and ~30 (Mind2Web) steps.
MAX_EVENTS = 1000
#: The largest text field of one step (observation, action or feedback), in characters.
MAX_TEXT = 100_000

_LOADED: dict[tuple[str, ...], Any] = {}  # the Routers and encoders this process has loaded
_LOCK = threading.Lock()


def _once(key: tuple[str, ...], load: Any) -> Any:
    """``load()``, once per ``key`` in this process (a Router's weights, the text encoder)."""
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = load()
        return _LOADED[key]


@dataclass(frozen=True)
class MemoryView:
    """What the agent is shown for one decision, and what it costs."""

    session_id: str
    step: int  # the steps recorded before this view
    view: str  # the chosen view's name, "none" for no view (an empty history shows none)
    index: int  # its index in the 144-view action space (eq. A.1), -1 for none
    probability: float  # the Router's probability of this view (1.0 for a fixed view)
    png: bytes | None  # the rendered page
    text: str | None  # the page's text twin
    width: int
    height: int
    visual_tokens: int  # the page's image tokens for the task model (Qwen2.5-VL patches)
    text_tokens: int  # the text twin's tokens (``Memory(token_counter=...)``)


class SessionFull(ValueError):
    """A step beyond the most one session records (``Memory(max_events=...)``)."""


class Session:
    """One task's event stream (paper "Recorder": ``E_<t``); made by :meth:`Memory.session`."""

    def __init__(self, memory: Memory, session_id: str, goal: str, task_type: str) -> None:
        self.memory = memory
        self.id = session_id
        self.goal = goal
        self.task_type = task_type
        self.stream = EventStream({"goal": goal, "episode_id": session_id, "task_type": task_type})

    @property
    def steps(self) -> int:
        return len(self.stream)

    def record(
        self,
        observation: str,
        action: str,
        feedback: str,
        reward: float = 0.0,
        *,
        image: bytes | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Record one step: ``observation`` before it, the ``action`` taken, the ``feedback``
        after it, its ``reward``, and optionally the post-action ``image`` (PNG bytes, read by
        a Phi whose prompt takes one). Checked first: bad input raises one ``ValueError`` naming
        the field and records nothing; so does a Phi that fails on the step."""
        for name, value in (("observation", observation), ("action", action), ("feedback", feedback)):
            if not isinstance(value, str):
                raise ValueError(f"{name} must be text, got {type(value).__name__}")
            if len(value) > MAX_TEXT:
                raise ValueError(f"{name} is {len(value)} characters; at most {MAX_TEXT} per step")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"reward must be a finite number, got {reward!r}")
        if meta is not None and not isinstance(meta, dict):
            raise ValueError(f"meta must be a dict, got {type(meta).__name__}")
        if image is not None and (not isinstance(image, bytes) or not image.startswith(b"\x89PNG\r\n\x1a\n")):
            raise ValueError("image must be PNG bytes")
        if self.steps >= self.memory.max_events:
            raise SessionFull(f"session {self.id} holds {self.steps} steps, the most one session records")
        raw_meta = {"step": self.steps, **(meta or {})}
        if image is not None:
            raw_meta["post_frame_path"] = str(self.memory.keep_image(self.id, self.steps, image))
        event = record_event(
            self.stream, RawEvent(observation, action, feedback, float(reward), raw_meta), self.memory.phi
        )
        if event.evidence.get("phi_fallback") and self.phi_fallbacks == 1:  # said once a session, then counted
            import warnings

            from memprism_ray.recorder.phi.llm import fallbacks_said

            warnings.warn(
                f"session {self.id}: {fallbacks_said(1, event.evidence['phi_fallback'], 'step')}; "
                "Session.phi_fallbacks counts the others",
                stacklevel=2,
            )

    @property
    def phi_fallbacks(self) -> int:
        """Steps an LLM Phi failed on, recorded by the rules instead (their evidence says why)."""
        return sum(1 for rec in self.stream.records if rec.event.evidence.get("phi_fallback"))

    def view(self, observation: str) -> MemoryView:
        """The view for the decision at ``observation`` (:meth:`Memory.views` of this session)."""
        return self.memory.views([(self, observation)])[0]

    def extend(self, records: Sequence[dict[str, Any]]) -> None:
        """Append steps :meth:`records` gave (checked as the stream checks every event)."""
        for i, rec in enumerate(records):
            if not isinstance(rec, dict) or not {"raw", "event"} <= rec.keys():
                got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
                raise ValueError(f"record {i}: expected a dict with 'raw' and 'event' (Session.records), got {got}")
            self.stream.append(RawEvent.from_dict(rec["raw"]), Event.from_dict(rec["event"]))

    def records(self, since: int = 0) -> list[dict[str, Any]]:
        """The recorded steps from ``since`` on, as JSON-able dicts (raw event and Phi's event):
        what :meth:`Memory.restore` rebuilds a session from without calling Phi again."""
        return [{"raw": r.raw.to_dict(), "event": r.event.to_dict()} for r in self.stream.records[since:]]


class Memory:
    """Sessions, their Phi, one view selector (a Router, a fixed view or a marginal), the
    Composer and Render. ``phi``: the benchmark's :class:`PhiSpec` (its rules and Phi prompt;
    ``get_benchmark(name).phi_spec()`` or your own), run as ``phi_config`` says (default: the
    rules; ``PhiConfig(kind="llm", base_url=..., model=...)`` for the LLM Phi). Exactly one of
    ``checkpoint`` (a Router checkpoint, hash-checked), ``view`` (``"fixed:TemporalTrace"``,
    ``"fixed:TAU/WINDOW/FILTER/GAMMA"``) or ``marginal`` (144 probabilities, a JSON list or
    an evaluation's ``report.json``). ``seed``: of a marginal's draws (the Router picks
    greedily, as the paper's evaluation does)."""

    def __init__(
        self,
        phi: PhiSpec,
        *,
        checkpoint: str | Path | None = None,
        view: str | None = None,
        marginal: str | Path | Sequence[float] | None = None,
        phi_config: PhiConfig | None = None,
        render: RenderConfig | None = None,
        encoder: EncoderConfig | None = None,
        token_counter: str = "minilm",
        seed: int = 0,
        max_events: int = MAX_EVENTS,
        image_dir: str | Path | None = None,
    ) -> None:
        from memprism_ray.baselines.conditions import make_selector
        from memprism_ray.policy.tokens import PromptTokenCounter
        from memprism_ray.recorder.phi.factory import build_phi

        _check_given(checkpoint, view, marginal)
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        self.max_events = max_events
        self.render = render or RenderConfig()
        self.encoder_config = encoder or EncoderConfig()
        router = _router(checkpoint) if checkpoint else None
        if checkpoint:
            _warn_trained_otherwise(checkpoint, phi.benchmark, self.encoder_config)
        condition = "memprism" if checkpoint else "freq_random" if marginal is not None else str(view)
        self.selector: ViewSelector = make_selector(condition, router=router, marginal=marginal, seed=seed)
        self.features = _features(self.encoder_config) if self.selector.uses_features else None
        self.phi: Phi = build_phi(phi, phi_config)
        self.tokens = PromptTokenCounter(token_counter)
        self.view_service = ViewService(self.render)
        self._image_dir = Path(image_dir) if image_dir is not None else None
        self._lock = threading.Lock()

    def session(self, goal: str, session_id: str | None = None, task_type: str = "") -> Session:
        """A new session for the task ``goal`` (the instruction the agent pursues)."""
        if not isinstance(goal, str) or not goal.strip():
            raise ValueError("goal must be the task's text, got an empty or non-text goal")
        if session_id is not None and (not isinstance(session_id, str) or not 0 < len(session_id) <= 256):
            raise ValueError(f"session_id must be a name of 1 to 256 characters, got {session_id!r}")
        return Session(self, session_id or uuid.uuid4().hex, goal, task_type)

    def restore(self, session_id: str, goal: str, records: Sequence[dict[str, Any]], task_type: str = "") -> Session:
        """A session rebuilt from :meth:`Session.records` another process kept (the Serve app's
        session store): the same stream, no Phi call."""
        session = self.session(goal, session_id, task_type)
        session.extend(records)
        return session

    def views(self, asks: Sequence[tuple[Session, str]]) -> list[MemoryView]:
        """One view per ``(session, observation)``, chosen and drawn in one batch."""
        from memprism_ray.agent import png_of_image

        for session, observation in asks:
            if not isinstance(session, Session) or session.memory is not self:
                raise ValueError("views: each session must be one this Memory made")
            if not isinstance(observation, str) or len(observation) > MAX_TEXT:
                raise ValueError(f"observation must be text of at most {MAX_TEXT} characters")
        if not asks:
            return []
        sessions = [s for s, _ in asks]
        observations = [o for _, o in asks]
        contexts = [DecisionContext(s.id, s.steps, s.goal, o, s.task_type) for s, o in asks]
        with self._lock:  # the selector's sampler and the view cache are not thread-safe
            feats = None
            if self.features is not None:
                feats = self.features.features_batch(
                    [s.stream for s in sessions], observations, [s.goal for s in sessions]
                )
            decisions = self.selector.select(contexts, feats)
            out = []
            for s, d in zip(sessions, decisions, strict=True):
                if d.action is None:
                    out.append(MemoryView(s.id, s.steps, "none", -1, 1.0, None, None, 0, 0, 0, 0))
                    continue
                optical = d.medium == "optical"
                rv = self.view_service.render_one(ViewRequest(s.stream, d.action, s.goal, optical, True, optical))
                text_tokens = self.tokens.count(rv.text or "")
                png = png_of_image(rv.pil()) if optical else None
                prob = math.exp(d.logprob)
                out.append(
                    MemoryView(
                        s.id, s.steps, d.action.name, d.action.index, prob, png, rv.text, rv.width, rv.height,
                        rv.visual_tokens, text_tokens,
                    )
                )  # fmt: skip
        return out

    def keep_image(self, session_id: str, step: int, image: bytes) -> Path:
        """Where a step's post-action image is kept for the Phi to read (``image_dir``, or a
        temporary folder removed with the process)."""
        with self._lock:
            if self._image_dir is None:
                import tempfile

                self._tmp = tempfile.TemporaryDirectory(prefix="memprism-images-")
                self._image_dir = Path(self._tmp.name)
        folder = hashlib.sha256(session_id.encode()).hexdigest()[:16]  # any id, one safe folder name
        path = self._image_dir / folder / f"step_{step:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image)
        return path


def check_source(
    *,
    checkpoint: str | Path | None = None,
    view: str | None = None,
    marginal: str | Path | Sequence[float] | None = None,
    seed: int = 0,
) -> None:
    """What :class:`Memory` refuses about where its views come from, loading no model: one of
    the three, a fixed view's name, a marginal and its file, a checkpoint's files and weight
    hash. The Serve app's builder says it once, before any replica starts."""
    from memprism_ray.baselines.conditions import make_selector

    _check_given(checkpoint, view, marginal)
    if checkpoint:
        _checked_sha256(Path(checkpoint))
    else:
        make_selector(str(view) if view else "freq_random", marginal=marginal, seed=seed)


def _check_given(checkpoint: object, view: str | None, marginal: object) -> None:
    given = [name for name, v in (("checkpoint", checkpoint), ("view", view), ("marginal", marginal)) if v]
    if len(given) != 1:
        raise ValueError(f"give exactly one of checkpoint, view or marginal (got {', '.join(given) or 'none'})")
    if view is not None and not view.startswith(("fixed:", "fixed_text:")):
        raise ValueError(f"view {view!r}: name a fixed view, e.g. fixed:TemporalTrace or fixed:TAU/WINDOW/FILTER/GAMMA")


def _checked_sha256(path: Path) -> str:
    """The weight file's hash of the Router checkpoint ``path``, against the one its config records."""
    from memprism_ray.adapter.checkpoint import checkpoint_sha256, read_checkpoint_meta

    if not path.exists():
        raise ValueError(f"checkpoint {path}: no such directory")
    try:
        read_checkpoint_meta(path)  # a run directory: the checkpoints below it named
    except ValueError as exc:
        raise ValueError(f"checkpoint {exc}") from None
    try:
        return checkpoint_sha256(path)
    except Exception as exc:  # a file edited or cut short since it was saved
        raise ValueError(f"checkpoint {path} does not verify: {exc}") from None


def _router(checkpoint: str | Path) -> Any:
    """The Router of ``checkpoint``, its weights hash-checked, loaded once per process."""
    from memprism_ray.adapter.checkpoint import load_model

    path = Path(checkpoint)
    sha = _checked_sha256(path)
    return _once(("router", str(path.resolve()), sha), lambda: load_model(path, verify=False).eval())


def _warn_trained_otherwise(checkpoint: str | Path, benchmark: str, encoder: EncoderConfig) -> None:
    """A warning for each way this Memory uses the Router otherwise than it was trained (another
    benchmark's Phi, another text encoder): allowed, never silent."""
    import warnings

    from memprism_ray.adapter.checkpoint import read_checkpoint_meta, trained_otherwise

    for how in trained_otherwise(read_checkpoint_meta(checkpoint), benchmark, encoder):
        warnings.warn(f"the Router {checkpoint} {how}", stacklevel=3)


def _features(config: EncoderConfig) -> Any:
    """Router features over the frozen text encoder, loaded once per process per encoder setting."""
    from memprism_ray.router.encoder import TextEncoder
    from memprism_ray.router.features import FeatureExtractor

    encoder = _once(("encoder", repr(config)), lambda: TextEncoder(config))
    return FeatureExtractor(encoder)
