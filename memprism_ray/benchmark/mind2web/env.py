"""Mind2Web under teacher-forced replay behind the :class:`~memprism_ray.envs.base.Env`
protocol (paper "Benchmarks": "the model predicts CLICK, TYPE, or SELECT under teacher-forced
replay and the next state always follows the human trajectory"; appendix D.3: "Mind2Web scores
the prediction but advances with the human action and recorded next state").

Each step is scored by the paper's rule (appendix E.5: one valid JSON action whose normalised
op, ref and value match the human's; ``reward = 1[correct]``) and, beside it, as MindAct's
``metric.py`` scores it (``element_correct``: the ref written; ``op_f1``: the op and value
written, also of an output the paper's parser rejects): the two differ on purpose on a CLICK
written with a value, on a lower-case op and on an output that does not parse (docs/mind2web.md
"Edge cases"). A step without a positive candidate in the pool scores 0 on both, as upstream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memprism_ray.benchmark.mind2web.candidates import TOP_K, CandidateRanks, load_candidate_ranks
from memprism_ray.benchmark.mind2web.contract import (
    MIND2WEB_OPS,
    decode_mind2web_action,
    encode_mind2web_action,
    parse_mind2web_written,
)
from memprism_ray.benchmark.mind2web.data import Step, Task, load_task
from memprism_ray.benchmark.mind2web.snapshot import (
    Snapshot,
    SnapshotConfig,
    build_snapshot,
    human_refs,
    positive_in_pool,
    ref_of,
)
from memprism_ray.envs.base import GameRef, Observation, Transition
from memprism_ray.policy.parsing import normalize_ws

END_OF_TRAJECTORY = "(end of the recorded human trajectory)"


def normalize_action(op: str, ref: str, value: str | None) -> dict[str, Any]:
    """``{"op", "ref", "value"}``, the op upper-cased, the value normalised (``None`` for CLICK)."""
    op = op.strip().upper()
    return {"op": op, "ref": ref, "value": None if op == "CLICK" else normalize_ws(value or "").casefold()}


def metric_operation(op: str | None, value: str | None) -> str:
    """Mind2Web's ``"OP value"`` of an output whose ``Action:`` line reads ``op`` and whose
    ``Value:`` line reads ``value`` (``None``: no such line), as metric.py's ``postprocess_action``
    builds it: the op only if it is CLICK/SELECT/TYPE (case-sensitive), the value's first line
    whatever the op (a CLICK written with a value keeps it)."""
    token = op.strip() if op is not None and op.strip() in MIND2WEB_OPS else ""
    first = "" if value is None else value.split("\n", 1)[0]
    return f"{token} {first.strip()}"


def operation_string(op: str, value: str | None) -> str:
    """Mind2Web's ``"OP value"`` of a recorded step, as dataloader.py's target writes it."""
    return metric_operation(op, None if op.strip() == "CLICK" else (value or ""))


def operation_f1(pred: str, label: str) -> float:
    """Mind2Web metric.py ``calculate_f1``: F1 of the sets of whitespace tokens, exactly
    (``"TYPE York New"`` vs ``"TYPE New York"`` is 1.0; case is kept)."""
    p, g = set(pred.strip().split()), set(label.strip().split())
    if not p and not g:
        return 1.0
    if not p or not g:
        return 0.0
    tp = len(p & g)
    precision, recall = tp / len(p), tp / len(g)
    if precision == 0 or recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def human_action(step: Step, snapshot: Snapshot) -> tuple[str, tuple[str, ...]]:
    """The recorded human action as canonical JSON, and every ref that counts as its target."""
    refs = human_refs(step, snapshot)
    ref = refs[0] if refs else (ref_of(step.pos[0].backend_node_id) if step.pos else "none")
    value = None if step.op == "CLICK" else step.value
    return encode_mind2web_action(step.op, ref, value), refs


def score_prediction(predicted: str, step: Step, snapshot: Snapshot) -> dict[str, Any]:
    """Score one predicted action against the human step."""
    text = predicted.strip()
    got = parse_mind2web_written(text if "<action" in text.lower() else f"<action>{text}</action>", set(snapshot.refs))
    parsed = got.result
    human_text, targets = human_action(step, snapshot)
    h = decode_mind2web_action(human_text)
    human = normalize_action(h["op"], h["ref"], h["value"])
    # metric.py: a step whose positives are all outside the pool scores 0 on every metric; otherwise
    # the element is the ref written and the prediction's "OP value" the op and value written (a
    # CLICK's value, the op's case), whether or not the output passes the paper's parser.
    written = metric_operation(got.written_op, got.written_value)
    f1 = operation_f1(written, operation_string(step.op, step.value)) if targets else 0.0
    element = got.written_ref is not None and got.written_ref.strip() in targets
    if not parsed.valid:
        failed = {"correct": False, "predicted": None, "error": parsed.error, "element_correct": element}
        return {"human": human, "recorded": human_text, **failed, "op_f1": f1}
    p = decode_mind2web_action(parsed.action or "")
    pred = normalize_action(p["op"], p["ref"], p["value"])
    correct = pred["op"] == human["op"] and pred["ref"] in targets and pred["value"] == human["value"]
    scored = {"correct": bool(correct), "predicted": pred, "error": None, "element_correct": p["ref"] in targets}
    return {"human": human, "recorded": human_text, **scored, "op_f1": f1}


@dataclass
class _Slot:
    task: Task
    game: GameRef
    t: int = 0
    correct: int = 0
    snapshots: dict[int, Snapshot] = field(default_factory=dict)


class Mind2WebReplayEnv:
    """``num_slots`` independent replay slots; see the module docstring."""

    def __init__(
        self,
        num_slots: int = 1,
        snapshot: SnapshotConfig | None = None,
        candidate_scores: str = "",
        candidate_top_k: int = TOP_K,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"Mind2WebReplayEnv needs num_slots >= 1, got {num_slots}")
        self._n = int(num_slots)
        self.snapshot_config = snapshot or SnapshotConfig()
        self.ranks: CandidateRanks | None = (
            load_candidate_ranks(candidate_scores, candidate_top_k) if candidate_scores else None
        )
        self._slots: dict[int, _Slot] = {}

    @property
    def num_slots(self) -> int:
        return self._n

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self._n:
            raise ValueError(f"slot {slot} out of range: this environment has {self._n} slot(s)")

    def _snapshot(self, s: _Slot, t: int) -> Snapshot:
        if t not in s.snapshots:
            step = s.task.steps[t]
            s.snapshots[t] = build_snapshot(step, self.snapshot_config, self.pool_of(s.task, step))
        return s.snapshots[t]

    def pool_of(self, task: Task, step: Step) -> frozenset[str] | None:
        """MindAct's pool of one step (``None``: the project's pool)."""
        return None if self.ranks is None else self.ranks.pool(task.annotation_id, step.action_uid)

    def positives_in_pool(self, game: GameRef) -> tuple[bool, ...]:
        """Per recorded step of ``game``: whether its snapshot shows a positive candidate."""
        task = load_task(game)
        return tuple(positive_in_pool(st, self.snapshot_config, self.pool_of(task, st)) for st in task.steps)

    def recorded_action(self, slot: int = 0) -> str:
        """The human action of the slot's current step as canonical JSON (D1 replays with it)."""
        self._check(slot)
        s = self._slots.get(slot)
        if s is None or s.t >= len(s.task.steps):
            raise RuntimeError(f"slot {slot}: no current step")
        return human_action(s.task.steps[s.t], self._snapshot(s, s.t))[0]

    def reset(self, game: GameRef, slot: int = 0) -> Observation:
        self._check(slot)
        task = load_task(game)
        s = _Slot(task, game)
        self._slots[slot] = s
        snap = self._snapshot(s, 0)
        return Observation(
            text=snap.text,
            goal=task.confirmed_task,
            admissible=snap.refs,
            meta={
                "annotation_id": task.annotation_id,
                "website": task.website,
                "domain": task.domain,
                "subdomain": task.subdomain,
                "split": task.split,
                "num_steps": len(task.steps),
                "html_field": snap.source,
            },
        )

    def step(self, action: str, slot: int = 0) -> Transition:
        self._check(slot)
        s = self._slots.get(slot)
        if s is None:
            raise RuntimeError(f"slot {slot}: step before reset")
        if s.t >= len(s.task.steps):
            raise RuntimeError(f"slot {slot}: the recorded trajectory of {s.task.annotation_id} has ended")
        step = s.task.steps[s.t]
        snap = self._snapshot(s, s.t)
        result = score_prediction(action if isinstance(action, str) else "", step, snap)
        s.correct += int(result["correct"])
        t = s.t
        s.t += 1
        done = s.t >= len(s.task.steps)
        nxt = None if done else self._snapshot(s, s.t)
        s.snapshots.pop(t, None)  # replay never returns to a page
        return Transition(
            feedback=END_OF_TRAJECTORY if nxt is None else nxt.text,
            reward=1.0 if result["correct"] else 0.0,
            done=done,
            won=done and s.correct == len(s.task.steps),
            admissible=() if nxt is None else nxt.refs,
            meta={
                "step": t,
                "correct": result["correct"],
                "predicted": result["predicted"],
                "human": result["human"],
                "recorded_action": result["recorded"],
                "error": result["error"],
                "element_correct": bool(result["element_correct"]),
                "op_f1": float(result["op_f1"]),
                "action_repr": step.repr,
                "has_target": bool(human_refs(step, snap)),
                "html_field": None if nxt is None else nxt.source,
            },
        )

    def close(self) -> None:
        self._slots.clear()
