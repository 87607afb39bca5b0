"""D1 data from the LLM view teacher (paper "Adapter", eq. view-teacher; appendix A.3
"Cold-start distillation"; appendix D.2 view-teacher prompt): one teacher call per expert
decision, against 144 x S policy calls for the counterfactual teacher.

For each decision state the Generic prompt of appendix D is filled (observation, goal, the
event stream so far, the reference next action) and sent to the teacher: any
OpenAI-compatible endpoint (``label.llm_source: endpoint``) or the Ray policy pool's vLLM
engines (``label.llm_source: pool``). Requests go out concurrently (``concurrency``), so a
vLLM server or replica batches them. Replies are parsed and validated by
:func:`~memprism_ray.router.teacher.parse_teacher_response` (as data, never evaluated); a
decision whose request or reply fails is skipped and counted, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memprism_ray.llm_client import map_concurrent
from memprism_ray.router.teacher import (
    LLMViewTeacher,
    TeacherError,
    TeacherLabel,
    TeacherRequestError,
    parse_teacher_response,
)

#: ``prompts -> one reply (str) or exception per prompt``: a batch of teacher requests.
CompleteMany = Callable[[list[str]], list[Any]]


def policy_calls(teacher: str, decisions: int, *, samples_per_view: int = 1, candidates: int = 144) -> int:
    """Policy (or teacher-LLM) calls a D1 labelling run makes for ``decisions`` states."""
    if teacher == "llm":
        return decisions
    if teacher == "counterfactual":
        return decisions * candidates * samples_per_view
    raise ValueError(f"unknown view teacher {teacher!r}; valid: counterfactual, llm")


def threaded_complete(teacher: LLMViewTeacher, concurrency: int) -> CompleteMany:
    """Concurrent HTTP requests through the teacher's client (memprism_ray/llm_client.py)."""

    def one(p: str) -> Any:
        try:
            return teacher.complete(p)
        except TeacherError as exc:
            return exc

    return lambda prompts: map_concurrent(one, prompts, concurrency)


def label_states_llm(
    states: Sequence[Any],
    teacher: LLMViewTeacher,
    *,
    complete_many: CompleteMany | None = None,
    concurrency: int = 16,
) -> tuple[dict[str, TeacherLabel | TeacherError], dict[str, int]]:
    """Teacher labels of ``states`` (``DecisionState``), keyed by ``sample_id``: a
    :class:`TeacherLabel`, or the :class:`TeacherError` that made it fail."""
    send = complete_many or threaded_complete(teacher, concurrency)
    out: dict[str, TeacherLabel | TeacherError] = {}
    counts = {"teacher_calls": 0, "request_error": 0, "response_error": 0}
    step = max(1, concurrency)
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
                label = parse_teacher_response(reply, top_k=teacher.config.top_k)
            except TeacherError as exc:
                counts["response_error"] += 1
                out[st.sample_id] = exc
                continue
            label.stats["prompt"] = teacher.prompt.name
            out[st.sample_id] = label
    return out, counts


def llm_labels(
    states: Sequence[Any],
    extractor: Any,
    teacher: LLMViewTeacher,
    *,
    complete_many: CompleteMany | None = None,
    concurrency: int = 16,
) -> tuple[Any, dict[str, int]]:
    """Label ``states`` (``LabelState`` or ``DecisionState``) with the LLM view teacher;
    returns ``(SFTDataset, counts)`` like ``pipeline.labels.counterfactual_labels``."""
    from memprism_ray.adapter.sft import label_decisions

    decision_states = [getattr(s, "state", s) for s in states]
    labels, counts = label_states_llm(decision_states, teacher, complete_many=complete_many, concurrency=concurrency)

    def lookup(st: Any) -> TeacherLabel:
        got = labels[st.sample_id]
        if isinstance(got, TeacherError):
            raise got
        return got

    dataset, d_counts = label_decisions(decision_states, extractor, lookup)
    return dataset, {**d_counts, **counts}
