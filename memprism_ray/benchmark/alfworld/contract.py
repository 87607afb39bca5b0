"""ALFWorld's task contract (paper appendix E.3 "ALFWorld Task Policy", E.4 action definitions,
E.5 parsing): the verbatim ``alfworld.txt`` prompt, and the parser: the tagged action matched to
the admissible set, exactly, then case- and whitespace-normalised."""

from __future__ import annotations

from memprism_ray.policy.base import HistoryRecord, PolicyInput
from memprism_ray.policy.contract import TaskContract
from memprism_ray.policy.parsing import ParseResult, invalid, match_action, normalized, short
from memprism_ray.policy.prompts import (
    IMAGE_MARKERS,
    NO_HISTORY,
    PROMPT_VERSION,
    Part,
    load_template,
    replace_once,
    split_and_fill,
)

# Sentences of the verbatim template that describe the view; rewritten per condition.
_VIEW_SENTENCE = "The image provides an optical view relevant to this task.\n\n"
_TEXT_SENTENCE = "The text block above provides a memory view relevant to this task.\n\n"
# The instruction text of the template that is the same in every request: the agent's role and
# the closing instructions (``prompt_layout: instructions_first``).
_ROLE = "You are an expert agent operating in the ALFRED embodied Environment. "
_TURN = "Now it's your turn to take an action."


def format_alfworld_history(history: tuple[HistoryRecord, ...]) -> str:
    if not history:
        return NO_HISTORY
    return "\n".join(
        f"[Step {r.step + 1}] Observation: {r.observation} Action: {r.action} Result: {r.feedback}" for r in history
    )


def format_admissible(admissible: tuple[str, ...]) -> str:
    return ", ".join(f"'{a}'" for a in admissible)


def _instructions_first(template: str, view_sentence: str) -> str:
    """The template's own text in another order: instructions first, then the goal and the
    decision's text, then the view and ``view_sentence`` (``""`` without a view). Beyond the paper
    (issue 31): the paper's prompt opens with the view image, so vLLM's prefix cache cannot reuse the
    instructions; here every request shares them. Not a word is added or dropped."""
    view_line, _, rest = template.partition("\n")
    if view_line not in IMAGE_MARKERS or not rest.startswith(_ROLE):
        raise ValueError(f"prompt template {PROMPT_VERSION} alfworld.txt does not open with the view line and the role")
    body, turn, tail = rest[len(_ROLE) :].partition(_TURN)
    if not turn or not body.endswith(view_sentence):
        raise ValueError(f"prompt template {PROMPT_VERSION} alfworld.txt lost its closing instructions or view line")
    body = body[: len(body) - len(view_sentence)]
    head = f"{_ROLE.rstrip()}\n{turn}{tail}\n{body}"
    if not view_sentence:
        return f"{head.rstrip()}\n{view_line}\n"
    return f"{head}{view_line}\n{view_sentence.rstrip()}\n"


def parse_alfworld(text: str, admissible: tuple[str, ...] | list[str]) -> ParseResult:
    """ALFWorld: the tagged action must be one of ``admissible`` (exact, then normalised)."""
    got = match_action(text, admissible, "admissible actions", normalized)
    if isinstance(got, ParseResult):
        return got
    return invalid(f"action {short(got)} is not in the admissible set ({len(admissible)} actions)")


class AlfworldContract(TaskContract):
    name = "alfworld"
    stand_in = "memprism_ray.benchmark.alfworld.scripted:ScriptedPolicy"

    def template_parts(self, inp: PolicyInput, layout: str) -> list[Part]:
        """``layout`` (``policy.prompt_layout``): ``paper`` or ``instructions_first``."""
        template = load_template("alfworld.txt")
        sentence = _VIEW_SENTENCE
        if inp.view_mode == "none":
            template, sentence = replace_once(template, _VIEW_SENTENCE, ""), ""
        elif inp.view_mode == "text":
            template = replace_once(template, _VIEW_SENTENCE, _TEXT_SENTENCE)
            sentence = _TEXT_SENTENCE
        if layout == "instructions_first":
            template = _instructions_first(template, sentence)
        elif layout != "paper":
            raise ValueError(f"unknown prompt layout {layout!r} (policy.prompt_layout: paper or instructions_first)")
        values = {
            "goal": inp.goal,
            "step_count": inp.step,
            "recent_observation_action_result_records": format_alfworld_history(inp.history),
            "current_step": inp.step + 1,
            "observation": inp.observation,
            "admissible_actions": format_admissible(inp.admissible),
        }
        return split_and_fill(template, values, inp, attach=False)

    def parse(self, inp: PolicyInput, text: str) -> ParseResult:
        return parse_alfworld(text, inp.admissible)


ALFWORLD = AlfworldContract()
