"""D1 data: view-teacher labels over expert trajectories (paper "Adapter", decision-
conditioned initialisation, eq. view-teacher; appendix A.3 "Cold-start distillation").

For each decision state of a reference (expert) trajectory -- observation ``o_t``, goal
``g``, history ``E_<t`` and reference next action ``u_t^ref`` -- a teacher returns a soft
distribution over the 144 view actions. The default here is the counterfactual teacher
(:class:`~memprism_ray.router.teacher.CounterfactualTeacher`): it shows the frozen task
policy each candidate view of the same history, in the same prompt the agent would build
(goal, observation, admissible actions, short history, the view), and puts mass on the
views under which the policy produces ``u_t^ref`` (nearly) as often as under the best
view, shaded mildly towards cheaper views. A policy that exposes its action distribution
(``input_distribution``: the scripted CPU policy) gives the exact probability of
``u_t^ref`` per view; others are sampled ``samples_per_view`` times. States under which
every view gives the same action carry no label signal and are skipped (counted).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memprism_ray.policy.base import HistoryRecord, PolicyInput, TaskPolicy
from memprism_ray.policy.contract import TaskContract
from memprism_ray.recorder.stream import StreamRecord
from memprism_ray.router.teacher import DecisionState
from memprism_ray.view_space import ViewAction


@dataclass(frozen=True)
class LabelState:
    """A decision state plus the admissible actions the expert was offered there."""

    state: DecisionState
    admissible: tuple[str, ...]


def expert_states(table: Any, episodes: Sequence[int] | None = None) -> list[LabelState]:
    """Decision states of an expert-trajectory table (``memprism games expert`` output)."""
    from memprism_ray.envs.alfworld.expert_data import load_expert_stream
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
    policy: TaskPolicy, render_config: Any = None, seed: int = 0, short_history: int = 0
) -> Callable[..., str]:
    """``choose(stream, observation, goal, admissible, step)`` for a D1 roll-in
    (``label.rollin_games``): the task policy acts on a view drawn uniformly from the 144 at
    every step, seeded by ``(seed, game, step)``, so the roll-ins reach states with every
    kind of memory, the forgetful ones included."""
    from memprism_ray.view_space import ALL_ACTIONS

    actor = ViewConditionedActor(policy, render_config, short_history=short_history)

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
    """``act(label_state, view) -> action``: the frozen task policy given one candidate view.

    Views are composed and rendered as the agent would (text form for text readers such
    as the scripted policy; the image too for VLMs). Each call uses a fresh episode id so a
    sampling policy draws independent samples.
    """

    def __init__(
        self, policy: TaskPolicy, render_config: Any = None, short_history: int = 2, benchmark: str = "alfworld"
    ) -> None:
        from memprism_ray.render import RenderConfig

        self.policy = policy
        self.benchmark = benchmark  # the prompt contract the policy is shown (PolicyInput.benchmark)
        self.render_config = render_config or RenderConfig()
        self.short_history = short_history
        self.reads_text = bool(getattr(policy, "needs_view_text", False))
        # A policy that reads only the text twin (the scripted stand-in) is never shown the
        # pixels: its pages are laid out and not painted (``render(paint=False)``).
        self.paints = bool(getattr(policy, "needs_view_image", True))
        self._calls = itertools.count()
        # Visual tokens of the pages rendered for the current state, by view index: the
        # teacher's page-token shading reads them after its 144 policy calls, so no page
        # is drawn twice.
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
        """Qwen2.5-VL visual tokens of ``view``'s page at this state (as the agent's reports
        count them)."""
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
    *,
    render_config: Any = None,
    short_history: int = 2,
    samples_per_view: int = 1,
    cost_temperature: float = 1.0,
    candidates: Sequence[int] | None = None,
    rule: str = "margin",
    margin: float = 0.1,
    min_spread: float = 0.05,
    uninformative: str = "skip",
    tie_break_temperature: float = 0.0,
    page_token_temperature: float = 0.0,
    benchmark: str = "alfworld",
) -> tuple[Any, dict[str, int]]:
    """Label ``states`` with the counterfactual teacher; returns ``(SFTDataset, counts)``.

    ``counts["fallback_skipped"]`` counts the states left out: no view led to ``u_ref``,
    or every view led to it equally (no information about views). ``benchmark``: the prompt
    contract the policy is shown each view in."""
    from memprism_ray.adapter.sft import label_decisions
    from memprism_ray.router.teacher import CounterfactualConfig, CounterfactualTeacher

    actor = ViewConditionedActor(policy, render_config, short_history, benchmark)
    by_id = {ls.state.sample_id: ls for ls in states}
    teacher = CounterfactualTeacher(
        lambda st, view: actor(by_id[st.sample_id], view),
        CounterfactualConfig(
            samples_per_view=samples_per_view,
            cost_temperature=cost_temperature,
            candidates=tuple(candidates) if candidates is not None else None,
            rule=rule,
            margin=margin,
            min_spread=min_spread,
            uninformative=uninformative,
            tie_break_temperature=tie_break_temperature,
            page_token_temperature=page_token_temperature,
        ),
        probs=(lambda st, view: actor.distribution(by_id[st.sample_id], view)) if actor.exact else None,
        page_tokens=lambda st, view: actor.page_tokens(by_id[st.sample_id], view),
    )
    return label_decisions(
        [ls.state for ls in states],
        extractor,
        lambda st: teacher.label(st, st.reference_action),
    )


def scripted_label_policy(cfg: Any, contract: TaskContract) -> TaskPolicy:
    """The scripted task policy D1 labels with and plays its roll-ins with (the stand-in of the
    benchmark's task ``contract``): the labelling temperature (``label.policy_temperature``)
    and the run's seed."""
    from memprism_ray.policy.config import PolicyConfig
    from memprism_ray.policy.factory import make_policy

    scripted = {"temperature": cfg.label.policy_temperature, "seed": cfg.run.seed}
    return make_policy(PolicyConfig(backend="scripted", scripted=scripted), contract)


def llm_teacher_config(cfg: Any) -> Any:
    """The LLM view teacher's settings (appendix E.2) from the ``label`` section: the endpoint,
    or the policy pool (``label.llm_source: pool``)."""
    from memprism_ray.router.teacher import LLMTeacherConfig

    lab = cfg.label
    return LLMTeacherConfig(
        base_url=lab.llm_base_url,
        model=lab.llm_model if lab.llm_source == "endpoint" else (lab.llm_model or "policy-pool"),
        top_k=lab.top_k,
        max_tokens=lab.llm_max_tokens,
        timeout_s=cfg.run.call_timeout_s,
    )
