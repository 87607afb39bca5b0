"""D1 data: view-teacher labels over reference trajectories (paper "Adapter", decision-
conditioned initialisation, eq. view-teacher; appendix A.3 "Cold-start distillation"; appendix
E.2 view-teacher prompts). For each decision state of a reference trajectory (``o_t``, ``g``,
``E_<t``, reference next action ``u_t^ref``) a teacher returns a soft distribution over the 144
views; ``label.counterfactual`` and ``label.llm`` hold each teacher's settings.

Counterfactual teacher (:func:`counterfactual_labels`, no LLM): shows the frozen task policy
each candidate view in the prompt the agent would build and puts mass on the views under which
it produces ``u_t^ref`` (nearly) as often as under the best one, shaded towards cheaper views;
exact probabilities where the policy exposes ``input_distribution`` (the scripted CPU policy),
else ``samples_per_view`` samples. States where every view gives the same action are skipped.

LLM view teacher (:func:`llm_labels`, one call per decision against 144 x S policy calls): the
benchmark's view-teacher prompt, sent concurrently to an OpenAI-compatible endpoint or the
policy pool's vLLM engines; replies are parsed as data, and a failed decision is skipped and
counted, never guessed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memprism_ray.llm_client import map_concurrent
from memprism_ray.policy.base import HistoryRecord, PolicyInput, TaskPolicy
from memprism_ray.policy.contract import TaskContract
from memprism_ray.recorder.stream import StreamRecord
from memprism_ray.router.teacher import (
    CounterfactualConfig,
    CounterfactualTeacher,
    DecisionState,
    LLMViewTeacher,
    TeacherError,
    TeacherLabel,
    TeacherRequestError,
    parse_teacher_response,
)
from memprism_ray.view_space import ViewAction


@dataclass(frozen=True)
class LabelState:
    """A decision state plus the admissible actions the expert was offered there."""

    state: DecisionState
    admissible: tuple[str, ...]


def expert_states(table: Any, episodes: Sequence[int] | None = None) -> list[LabelState]:
    """Decision states of an expert-trajectory table (``memprism games expert`` output)."""
    from memprism_ray.adapter.reference_table import load_expert_stream
    from memprism_ray.router.teacher import decision_states

    all_eps = sorted(set(table.column("episode").to_pylist()))
    chosen = all_eps if episodes is None else [e for e in all_eps if e in set(episodes)]
    import pyarrow.compute as pc

    out: list[LabelState] = []
    for ep in chosen:
        stream = load_expert_stream(table, ep)
        rows = table.filter(pc.equal(table["episode"], ep))
        admissible = rows.column("admissible").to_pylist()
        # The reference is the table's: in a roll-in it is the expert's command, not the one played.
        references = rows.column("reference_action").to_pylist()
        game_id = rows.column("game_id")[0].as_py()
        goal = rows.column("goal")[0].as_py()
        states = decision_states(stream, goal=goal, task_id=game_id)
        for st, adm, ref in zip(states, admissible, references, strict=True):
            out.append(LabelState(dataclasses.replace(st, reference_action=ref), tuple(adm)))
    return out


def rollin_chooser(
    policy: TaskPolicy, render_config: Any = None, seed: int = 0, short_history: int = 0, *, benchmark: str
) -> Callable[..., str]:
    """``choose(stream, observation, goal, admissible, step)`` for a D1 roll-in
    (``label.rollin_games``): the task policy acts on a view drawn uniformly per step, seeded by
    ``(seed, game, step)``, so the roll-ins reach states with every kind of memory."""
    from memprism_ray.view_space import ALL_ACTIONS

    actor = ViewConditionedActor(policy, render_config, short_history, benchmark=benchmark)

    def choose(stream: Any, observation: str, goal: str, admissible: tuple[str, ...], step: int) -> str:
        game = str(stream.meta.get("game_id", ""))
        digest = hashlib.blake2b(f"{seed}|{game}|{step}".encode(), digest_size=8).digest()
        view = ALL_ACTIONS[int.from_bytes(digest, "little") % len(ALL_ACTIONS)]
        state = DecisionState(tuple(stream.records), observation, goal, "", step + 1, game)
        return actor(LabelState(state, admissible), view)

    return choose


def _history(records: Sequence[StreamRecord], k: int) -> tuple[HistoryRecord, ...]:
    start = max(0, len(records) - k)
    return tuple(
        HistoryRecord(i, r.raw.o_pre, r.raw.action_text, r.raw.feedback)
        for i, r in enumerate(records[start:], start=start)
    )


class ViewConditionedActor:
    """``act(label_state, view) -> action``: the frozen task policy given one candidate view,
    composed and rendered as the agent would. Each call uses a fresh episode id so a sampling
    policy draws independent samples. ``benchmark`` has no default, so no caller shows a policy
    ALFWorld's contract by mistake."""

    def __init__(
        self, policy: TaskPolicy, render_config: Any = None, short_history: int = 2, *, benchmark: str
    ) -> None:
        from memprism_ray.render import RenderConfig

        self.policy = policy
        self.benchmark = benchmark
        self.render_config = render_config or RenderConfig()
        self.short_history = short_history
        self.reads_text = bool(getattr(policy, "needs_view_text", False))
        # A policy that reads only the text twin (the scripted stand-in) is never shown the
        # pixels: its pages are laid out and not painted (``render(paint=False)``).
        self.paints = bool(getattr(policy, "needs_view_image", True))
        self._calls = itertools.count()
        # Visual tokens of the current state's pages by view index (read by the teacher's
        # page-token shading after its 144 policy calls: no page is drawn twice).
        self._tokens: tuple[str, dict[int, int]] = ("", {})

    @property
    def exact(self) -> bool:
        """Whether the policy exposes its action distribution (``input_distribution``)."""
        return callable(getattr(self.policy, "input_distribution", None))

    def _input(self, ls: LabelState, view: ViewAction) -> PolicyInput:
        st = ls.state
        rendered = self._render(ls, view)
        meta = {"episode_id": f"label:{st.sample_id}:{next(self._calls)}"}
        if self.reads_text:
            # The render's text twin: the rows the page shows, under the same cap.
            meta["view_text"] = rendered.text
        return PolicyInput(
            benchmark=self.benchmark,
            goal=st.goal,
            observation=st.observation,
            admissible=ls.admissible,
            history=_history(st.history, self.short_history),
            step=st.step - 1,
            view_image=rendered.image,
            meta=meta,
            view_unpainted=rendered.image is None,  # a policy that reads no pixels
        )

    def _render(self, ls: LabelState, view: ViewAction) -> Any:
        """The page the policy is shown; its visual-token count is kept for :meth:`page_tokens`."""
        from memprism_ray.composer import compose
        from memprism_ray.render import render
        from memprism_ray.render.visual_tokens import qwen25vl_tokens

        st = ls.state
        rendered = render(compose(st.history, view, st.goal), self.render_config, paint=self.paints)
        if self._tokens[0] != st.sample_id:
            self._tokens = (st.sample_id, {})
        self._tokens[1][view.index] = qwen25vl_tokens(rendered.width, rendered.height)
        return rendered

    def page_tokens(self, ls: LabelState, view: ViewAction) -> int:
        """Qwen2.5-VL visual tokens of ``view``'s page at this state."""
        if self._tokens[0] != ls.state.sample_id or view.index not in self._tokens[1]:
            self._render(ls, view)
        return self._tokens[1][view.index]

    def __call__(self, ls: LabelState, view: ViewAction) -> str:
        out = self.policy.act([self._input(ls, view)])[0]
        return out.action if out.action is not None else out.text

    def distribution(self, ls: LabelState, view: ViewAction) -> dict[str, float]:
        """The policy's action probabilities under ``view`` (needs :attr:`exact`)."""
        return dict(self.policy.input_distribution(self._input(ls, view)))  # type: ignore[attr-defined]


def counterfactual_labels(
    states: Sequence[LabelState],
    extractor: Any,
    policy: TaskPolicy,
    config: CounterfactualConfig | None = None,
    *,
    render_config: Any = None,
    short_history: int = 2,
    benchmark: str,
) -> tuple[Any, dict[str, int]]:
    """Label ``states`` with the counterfactual teacher (``label.counterfactual``; ``None``: its
    defaults); returns ``(SFTDataset, counts)``, ``fallback_skipped`` counting states no view or
    every view equally led to ``u_ref``. The other arguments are the agent's."""
    from memprism_ray.adapter.sft import label_decisions

    actor = ViewConditionedActor(policy, render_config, short_history, benchmark=benchmark)
    by_id = {ls.state.sample_id: ls for ls in states}
    teacher = CounterfactualTeacher(
        lambda st, view: actor(by_id[st.sample_id], view),
        config,
        probs=(lambda st, view: actor.distribution(by_id[st.sample_id], view)) if actor.exact else None,
        page_tokens=lambda st, view: actor.page_tokens(by_id[st.sample_id], view),
    )
    return label_decisions([ls.state for ls in states], extractor, lambda st: teacher.label(st, st.reference_action))


def scripted_label_policy(cfg: Any, contract: TaskContract) -> TaskPolicy:
    """The scripted stand-in of ``contract`` D1 labels and plays its roll-ins with, at
    ``label.policy_temperature`` and the run's seed."""
    from memprism_ray.policy.config import PolicyConfig
    from memprism_ray.policy.factory import make_policy

    scripted = {"temperature": cfg.label.policy_temperature, "seed": cfg.run.seed}
    return make_policy(PolicyConfig(backend="scripted", scripted=scripted), contract)


#: ``complete_many(prompts, max_tokens=, temperature=) -> one reply (str) or exception per
#: prompt``: a batch of teacher requests on a backend other than the teacher's endpoint (the
#: policy pool's ``complete``), sent with the teacher's decoding settings.
CompleteMany = Callable[..., list[Any]]


def policy_calls(teacher: str, decisions: int, *, samples_per_view: int = 1, candidates: int = 144) -> int:
    """Policy (or teacher-LLM) calls a D1 labelling run makes for ``decisions`` states."""
    if teacher == "llm":
        return decisions
    if teacher == "counterfactual":
        return decisions * candidates * samples_per_view
    raise ValueError(f"unknown view teacher {teacher!r}; valid: counterfactual, llm")


def label_states_llm(
    states: Sequence[Any], teacher: LLMViewTeacher, *, complete_many: CompleteMany | None = None
) -> tuple[dict[str, TeacherLabel | TeacherError], dict[str, int]]:
    """Teacher labels of ``states`` by ``sample_id`` (a :class:`TeacherLabel` or the
    :class:`TeacherError` that made it fail), sent in chunks of ``concurrency`` to the teacher's
    endpoint or to ``complete_many``."""
    cfg = teacher.config

    def one(p: str) -> Any:  # a request through the teacher's own client
        try:
            return teacher.complete(p)
        except TeacherError as exc:
            return exc

    send: Callable[[list[str]], list[Any]] = (
        (lambda prompts: map_concurrent(one, prompts, cfg.concurrency))
        if complete_many is None
        else functools.partial(complete_many, max_tokens=cfg.max_tokens, temperature=cfg.temperature)
    )
    out: dict[str, TeacherLabel | TeacherError] = {}
    counts = {"teacher_calls": 0, "request_error": 0, "response_error": 0}
    step = cfg.concurrency
    for start in range(0, len(states), step):
        chunk = states[start : start + step]
        prompts = [teacher.build_prompt(teacher.state_inputs(st)) for st in chunk]
        counts["teacher_calls"] += len(prompts)
        replies = send(prompts)
        if len(replies) != len(prompts):
            raise RuntimeError(f"teacher backend answered {len(replies)} replies for {len(prompts)} prompts")
        for st, reply in zip(chunk, replies, strict=True):
            if isinstance(reply, BaseException):
                counts["request_error"] += 1
                out[st.sample_id] = (
                    reply
                    if isinstance(reply, TeacherError)
                    else TeacherRequestError(f"teacher request failed: {type(reply).__name__}: {reply}")
                )
                continue
            try:
                label = parse_teacher_response(reply, top_k=cfg.top_k)
            except TeacherError as exc:
                counts["response_error"] += 1
                out[st.sample_id] = exc
                continue
            label.stats["prompt"] = teacher.prompt.name
            out[st.sample_id] = label
    return out, counts


def llm_labels(
    states: Sequence[Any], extractor: Any, teacher: LLMViewTeacher, *, complete_many: CompleteMany | None = None
) -> tuple[Any, dict[str, int]]:
    """Label ``states`` (``LabelState`` or ``DecisionState``) with the LLM view teacher;
    returns ``(SFTDataset, counts)`` like :func:`counterfactual_labels`."""
    from memprism_ray.adapter.sft import label_decisions

    decision_states = [getattr(s, "state", s) for s in states]
    labels, counts = label_states_llm(decision_states, teacher, complete_many=complete_many)

    def lookup(st: Any) -> TeacherLabel:
        got = labels[st.sample_id]
        if isinstance(got, TeacherError):
            raise got
        return got

    dataset, d_counts = label_decisions(decision_states, extractor, lookup)
    return dataset, {**d_counts, **counts}
