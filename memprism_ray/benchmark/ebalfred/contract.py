"""EB-ALFRED's task contract (paper appendix E.3 "EB-ALFRED Task Policy", E.4 action
definitions, E.5 parsing): the verbatim system and user templates, and the parser.

As the paper's implementation note has it (appendix "EB-ALFRED Case Studies"), the system prefix
and the user suffix form one ``role=user`` message, followed by the camera image and then the
view. An action is matched to the scene's skills by exact, case-insensitive and
whitespace-normalised string; any ``put down ...`` becomes ``put down the object in hand``.

The list is the scene-filtered one the paper names (appendix E.4); its action ids, ``0 ~ max_id``
and the history's ``Step i, action id k`` are as EmbodiedBench's planner renders them
(``vlm_planner.py``): ids number its full list (162 global skills, then the scene's instance
skills), history steps count from 0 (issue 41 item 4; docs/ebalfred.md "Action ids")."""

from __future__ import annotations

from memprism_ray.benchmark.ebalfred.skills import GLOBAL_IDS, full_list_size, upstream_ids
from memprism_ray.policy.base import HistoryRecord, PolicyInput
from memprism_ray.policy.contract import TaskContract
from memprism_ray.policy.parsing import ParseResult, invalid, match_action, normalized, short
from memprism_ray.policy.prompts import NO_HISTORY, Part, fill, load_template, replace_once, split_and_fill

EBALFRED_PUT_DOWN = "put down the object in hand"

_ATTACHMENTS = (
    "The attached images are, in order:\n"
    "1. current synchronized simulator observation;\n"
    "2. MemPrism optical memory view.\n\n"
)
_HISTORY_LINE = "The action history: Step {i}, action id {id}, {action_name}, env feedback: {feedback}"
_RECORD = "Step {i}, action id {id}, {action_name}, env feedback: {feedback}"
_EXAMPLES = "{task_execution_examples}\n\n"


def _ids(actions: tuple[str, ...]) -> list[int]:
    """Each listed skill's id in EmbodiedBench's full list (``formats.ebalfred_skills.upstream_ids``)."""
    return upstream_ids(actions)


def format_ebalfred_history(history: tuple[HistoryRecord, ...], actions: tuple[str, ...]) -> str:
    """``Step i, action id k, name, env feedback: ...`` per record: ``i`` the decision index from 0,
    ``k`` the action's id in EmbodiedBench's full list (``unknown`` for an output that is no skill
    of the list: the planner never shows one, this prompt's short history does)."""
    if not history:
        return NO_HISTORY
    index = {**GLOBAL_IDS, **dict(zip(actions, _ids(actions), strict=True))}  # a global skill outside the list too
    lines = []
    for r in history:
        action_id = index.get(r.action, "unknown")
        lines.append(fill(_RECORD, {"i": r.step, "id": action_id, "action_name": r.action, "feedback": r.feedback}))
    return "\n".join(lines)


def ebalfred_instruction(goal: str) -> str:
    """The instruction without its final period(s), as EmbodiedBench's planner does
    (``vlm_planner.py``: ``user_instruction.rstrip('.')``), so a goal ending "table." does not end
    the prompt's ``{instruction}.`` line with "table.."."""
    return goal.strip().rstrip(".").rstrip()


def format_ebalfred_actions(actions: tuple[str, ...]) -> str:
    """One ``action id k: name`` line per listed skill, ``k`` its id in EmbodiedBench's full list."""
    return "\n".join(f"action id {i}: {a}" for i, a in zip(_ids(actions), actions, strict=True))


def ebalfred_max_id(actions: tuple[str, ...]) -> int:
    """The prompt's ``max_id``: the last id of EmbodiedBench's full list (``len(actions) - 1`` there)."""
    return full_list_size(actions) - 1


def _attachment_sentence(inp: PolicyInput) -> str:
    camera = inp.camera_image is not None
    mode = inp.view_mode
    if camera and mode == "image":
        return _ATTACHMENTS
    if camera and mode == "text":
        return (
            "The attached image is the current synchronized simulator observation; "
            "the MemPrism memory view follows as text.\n\n"
        )
    if camera:
        return "The attached image is the current synchronized simulator observation.\n\n"
    if mode == "image":
        return "The attached image is the MemPrism optical memory view.\n\n"
    if mode == "text":
        return "The MemPrism memory view follows as text.\n\n"
    return ""


def parse_ebalfred(text: str, skills: tuple[str, ...] | list[str]) -> ParseResult:
    """EB-ALFRED: exact, case-insensitive, normalised whitespace; ``put down ...`` canonicalised."""
    got = match_action(text, skills, "skills", str.casefold, normalized)
    if isinstance(got, ParseResult):
        return got
    if normalized(got).startswith("put down") and EBALFRED_PUT_DOWN in skills:
        return ParseResult(action=EBALFRED_PUT_DOWN)
    return invalid(f"action {short(got)} is not one of the {len(skills)} available skills")


class EbAlfredContract(TaskContract):
    name = "ebalfred"
    stand_in = "memprism_ray.benchmark.ebalfred.stand_in:FixturePolicy"

    def template_parts(self, inp: PolicyInput, layout: str) -> list[Part]:
        """The prompt already opens with its instructions: ``layout`` changes nothing."""
        if not inp.admissible:
            raise ValueError("the EB-ALFRED prompt needs the scene's skill list in PolicyInput.admissible")
        system = load_template("ebalfred_system.txt")
        examples = str(inp.meta.get("examples", "") or "")
        if not examples.strip():
            system = replace_once(system, _EXAMPLES, "")
        user = load_template("ebalfred_user.txt")
        history = format_ebalfred_history(inp.history, inp.admissible)
        user = replace_once(user, _HISTORY_LINE, "The action history: {action_history}")
        user = replace_once(user, _ATTACHMENTS, _attachment_sentence(inp))
        values = {
            "max_id": ebalfred_max_id(inp.admissible),
            "available_action_names": format_ebalfred_actions(inp.admissible),
            "task_execution_examples": examples,
            "instruction": ebalfred_instruction(inp.goal),
            "action_history": history,
            "observation_text": inp.observation,
        }
        parts = split_and_fill(system + "\n" + user, values, inp, attach=True)
        # The dropped marker lines leave the system prefix starting with a blank line.
        parts[0] = ("text", parts[0][1].lstrip("\n"))
        return parts

    def parse(self, inp: PolicyInput, text: str) -> ParseResult:
        return parse_ebalfred(text, inp.admissible)


EBALFRED = EbAlfredContract()
