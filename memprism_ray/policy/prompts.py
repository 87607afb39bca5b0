"""Task-policy prompts (paper appendix E.3 "Task-policy prompts", versioned).

The ALFWorld, EB-ALFRED (system + user) and Mind2Web prompts are stored verbatim in
``templates/<PROMPT_VERSION>/*.txt``. Any change to a template *or* to the formatting
rules in this module (history records, action lists, view conditions) must bump
:data:`PROMPT_VERSION`, which every run manifest records.

Placeholders are filled in one pass that replaces only the template's own ``{name}``
fields, so goals, observations and the Mind2Web prompt's literal JSON braces never get
interpreted. Image slots are located on the raw template before any text is filled in,
so an observation that contains ``<image>`` cannot create a slot.

View conditions (``PolicyInput.view_mode``):

* ``image``: the optical view goes where the template's view-image line is;
* ``text``: that line becomes a clearly delimited text block holding ``view_text``;
* ``none`` (No Memory): the line and the sentence describing the view are dropped.

EB-ALFRED follows the paper's implementation note (appendix "EB-ALFRED Case Studies"):
the shared system prefix and the decision-specific user suffix form one ``role=user``
message, followed by the camera image and then the compiled view; the two ``<image: ...>``
lines heading the system prompt name those attachments and are not sent as text.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

from PIL import Image

from memprism_ray.policy.base import HistoryRecord, PolicyInput

#: v2 (issue 35): EB-ALFRED's in-context examples by skill name, one action per step, and the
#: instruction without its final period; the templates themselves are v1's.
PROMPT_VERSION: str = "memprism-prompts-v2"

#: Template files of each benchmark, in message order.
TEMPLATE_FILES: dict[str, tuple[str, ...]] = {
    "alfworld": ("alfworld.txt",),
    "ebalfred": ("ebalfred_system.txt", "ebalfred_user.txt"),
    "mind2web": ("mind2web.txt",),
}

#: Image marker lines of the templates and the slot each one stands for.
IMAGE_MARKERS: dict[str, str] = {
    "<image>": "view",
    "<image: MemPrism optical memory view>": "view",
    "<image: current synchronized simulator observation>": "camera",
}

VIEW_TEXT_BEGIN = "=== MemPrism memory view (text) ==="
VIEW_TEXT_END = "=== end of MemPrism memory view ==="
NO_HISTORY = "(none)"

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")

# Sentences of the verbatim templates that describe the view; rewritten per condition.
_ALFWORLD_VIEW_SENTENCE = "The image provides an optical view relevant to this task.\n\n"
_ALFWORLD_TEXT_SENTENCE = "The text block above provides a memory view relevant to this task.\n\n"
# The instruction text of the ALFWorld template that is the same in every request: the
# agent's role and the closing instructions (``prompt_layout: instructions_first``).
_ALFWORLD_ROLE = "You are an expert agent operating in the ALFRED embodied Environment. "
_ALFWORLD_TURN = "Now it's your turn to take an action."
_EBALFRED_ATTACHMENTS = (
    "The attached images are, in order:\n"
    "1. current synchronized simulator observation;\n"
    "2. MemPrism optical memory view.\n\n"
)
_EBALFRED_HISTORY_LINE = "The action history: Step {i}, action id {id}, {action_name}, env feedback: {feedback}"
_EBALFRED_RECORD = "Step {i}, action id {id}, {action_name}, env feedback: {feedback}"
_EBALFRED_EXAMPLES = "{task_execution_examples}\n\n"


@functools.cache
def load_template(name: str, version: str = PROMPT_VERSION) -> str:
    """The verbatim template file ``name`` of prompt ``version``."""
    root = resources.files("memprism_ray.policy") / "templates" / version
    path = root / name
    if not path.is_file():
        raise ValueError(f"no prompt template {name!r} for prompt version {version!r} (looked in {root})")
    return path.read_text(encoding="utf-8")


def placeholders(template: str) -> set[str]:
    """The ``{name}`` fields of ``template`` (literal JSON braces are not fields)."""
    return set(_PLACEHOLDER.findall(template))


def fill(template: str, values: dict[str, Any]) -> str:
    """Replace every ``{name}`` field of ``template`` in a single pass.

    Values are inserted as text and never rescanned, so a value containing ``{goal}`` or
    braces stays literal. A field without a value is an error naming it.
    """
    missing = sorted(placeholders(template) - values.keys())
    if missing:
        raise ValueError(f"prompt template fields without a value: {', '.join(missing)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def _replace_once(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise ValueError(f"prompt template {PROMPT_VERSION} does not contain {old!r} exactly once")
    return text.replace(old, new)


def _view_block(view_text: str) -> str:
    return f"{VIEW_TEXT_BEGIN}\n{view_text}\n{VIEW_TEXT_END}"


# A prompt is a list of parts: ("text", str) or ("image", marker, PIL image).
_Part = tuple[Any, ...]


def _split_and_fill(template: str, values: dict[str, Any], inp: PolicyInput, attach: bool) -> list[_Part]:
    """Split ``template`` at its image lines, fill the text between, and resolve each slot.

    With ``attach`` the marker lines are dropped and the slots are appended at the end
    (EB-ALFRED's attachment order); otherwise each slot sits where its line is.
    """
    parts: list[_Part] = []
    slots: list[str] = []
    chunk: list[str] = []

    def flush() -> None:
        if chunk:
            parts.append(("text", fill("".join(chunk), values)))
            chunk.clear()

    for line in template.splitlines(keepends=True):
        marker = line.rstrip("\n")
        if marker in IMAGE_MARKERS:
            if attach:
                slots.append(marker)
                continue
            flush()
            parts.extend(_resolve_slot(marker, inp))
        else:
            chunk.append(line)
    flush()
    if attach:
        attachments: list[_Part] = []
        for marker in slots:
            attachments.extend(_resolve_slot(marker, inp, trailing_newline=False))
        if attachments and parts and parts[-1][0] == "text" and attachments[0][0] == "text":
            attachments[0] = ("text", "\n" + attachments[0][1])
        parts.extend(attachments)
    return parts


def _resolve_slot(marker: str, inp: PolicyInput, trailing_newline: bool = True) -> list[_Part]:
    nl = "\n" if trailing_newline else ""
    if IMAGE_MARKERS[marker] == "camera":
        return [("image", marker, inp.camera_image)] if inp.camera_image is not None else []
    if inp.view_image is not None or inp.view_unpainted:
        # An unpainted page keeps its marker, so a text-only reader's prompt is unchanged.
        return [("image", marker, inp.view_image)]
    if inp.view_text is not None:
        return [("text", _view_block(inp.view_text) + nl)]
    return []


# --- per-benchmark formatting rules (part of PROMPT_VERSION) -----------------------------


def format_alfworld_history(history: tuple[HistoryRecord, ...]) -> str:
    if not history:
        return NO_HISTORY
    return "\n".join(
        f"[Step {r.step + 1}] Observation: {r.observation} Action: {r.action} Result: {r.feedback}" for r in history
    )


def format_admissible(admissible: tuple[str, ...]) -> str:
    return ", ".join(f"'{a}'" for a in admissible)


def format_ebalfred_history(history: tuple[HistoryRecord, ...], actions: tuple[str, ...]) -> str:
    if not history:
        return NO_HISTORY
    index = {a: i for i, a in reversed(list(enumerate(actions)))}
    lines = []
    for r in history:
        action_id = index.get(r.action, "unknown")
        lines.append(
            fill(_EBALFRED_RECORD, {"i": r.step + 1, "id": action_id, "action_name": r.action, "feedback": r.feedback})
        )
    return "\n".join(lines)


def ebalfred_instruction(goal: str) -> str:
    """The instruction as the EB-ALFRED prompt's ``{instruction}.`` line takes it: without
    its final period(s), as EmbodiedBench's planner does (``vlm_planner.py`` ``process_prompt``:
    ``user_instruction.rstrip('.')`` before ``f'... is: {user_instruction}.'``), so a goal
    ending "table." does not end the line "table.."."""
    return goal.strip().rstrip(".").rstrip()


def format_ebalfred_actions(actions: tuple[str, ...]) -> str:
    return "\n".join(f"action id {i}: {a}" for i, a in enumerate(actions))


def format_mind2web_history(history: tuple[HistoryRecord, ...]) -> str:
    if not history:
        return NO_HISTORY
    lines = []
    for r in history:
        line = f"[Step {r.step + 1}] Observation: {r.observation} | Expert action: {r.action}"
        if r.feedback:
            line += f" | Result: {r.feedback}"
        lines.append(line)
    return "\n".join(lines)


def _alfworld_instructions_first(template: str, view_sentence: str) -> str:
    """The ALFWorld template's own text in another order: role and closing instructions
    first, then the goal and the decision's history, observation and actions, then the
    view and the sentence describing it (``view_sentence``, already chosen for the view
    condition; ``""`` without a view).

    Beyond the paper (issue 31): the paper's prompt opens with the view image, so no two
    requests share a prefix beyond the chat header and vLLM's prefix cache cannot reuse the
    instructions' KV cache; here every request starts with the same instruction text and a
    GRPO group's requests also share the goal line. Not a single word is added or dropped."""
    view_line, _, rest = template.partition("\n")
    if view_line not in IMAGE_MARKERS or not rest.startswith(_ALFWORLD_ROLE):
        raise ValueError(f"prompt template {PROMPT_VERSION} alfworld.txt does not open with the view line and the role")
    body, turn, tail = rest[len(_ALFWORLD_ROLE) :].partition(_ALFWORLD_TURN)
    if not turn or not body.endswith(view_sentence):
        raise ValueError(f"prompt template {PROMPT_VERSION} alfworld.txt lost its closing instructions or view line")
    body = body[: len(body) - len(view_sentence)]
    head = f"{_ALFWORLD_ROLE.rstrip()}\n{turn}{tail}\n{body}"
    if not view_sentence:
        return f"{head.rstrip()}\n{view_line}\n"
    return f"{head}{view_line}\n{view_sentence.rstrip()}\n"


def _alfworld_parts(inp: PolicyInput, layout: str = "paper") -> list[_Part]:
    template = load_template("alfworld.txt")
    sentence = _ALFWORLD_VIEW_SENTENCE
    if inp.view_mode == "none":
        template, sentence = _replace_once(template, _ALFWORLD_VIEW_SENTENCE, ""), ""
    elif inp.view_mode == "text":
        template = _replace_once(template, _ALFWORLD_VIEW_SENTENCE, _ALFWORLD_TEXT_SENTENCE)
        sentence = _ALFWORLD_TEXT_SENTENCE
    if layout == "instructions_first":
        template = _alfworld_instructions_first(template, sentence)
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
    return _split_and_fill(template, values, inp, attach=False)


def _ebalfred_attachment_sentence(inp: PolicyInput) -> str:
    camera = inp.camera_image is not None
    mode = inp.view_mode
    if camera and mode == "image":
        return _EBALFRED_ATTACHMENTS
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


def _ebalfred_parts(inp: PolicyInput) -> list[_Part]:
    if not inp.admissible:
        raise ValueError("the EB-ALFRED prompt needs the scene's skill list in PolicyInput.admissible")
    system = load_template("ebalfred_system.txt")
    examples = str(inp.meta.get("examples", "") or "")
    if not examples.strip():
        system = _replace_once(system, _EBALFRED_EXAMPLES, "")
    user = load_template("ebalfred_user.txt")
    history = format_ebalfred_history(inp.history, inp.admissible)
    user = _replace_once(user, _EBALFRED_HISTORY_LINE, "The action history: {action_history}")
    user = _replace_once(user, _EBALFRED_ATTACHMENTS, _ebalfred_attachment_sentence(inp))
    values = {
        "max_id": len(inp.admissible) - 1,
        "available_action_names": format_ebalfred_actions(inp.admissible),
        "task_execution_examples": examples,
        "instruction": ebalfred_instruction(inp.goal),
        "action_history": history,
        "observation_text": inp.observation,
    }
    parts = _split_and_fill(system + "\n" + user, values, inp, attach=True)
    # The dropped marker lines leave the system prefix starting with a blank line.
    parts[0] = ("text", parts[0][1].lstrip("\n"))
    return parts


_REF = re.compile(r"\[ref=([^\]\s]+)\]")


def snapshot_refs(observation: str) -> tuple[str, ...]:
    """The element refs (``[ref=e12]``) of a Mind2Web snapshot, in order of appearance."""
    return tuple(dict.fromkeys(_REF.findall(observation)))


def _mind2web_parts(inp: PolicyInput) -> list[_Part]:
    values = {
        "step_idx": inp.step + 1,
        "goal": inp.goal,
        "html_field": inp.meta.get("html_field", "cleaned_html"),
        "observation": inp.observation,
        "recent_observation_and_expert_action_records": format_mind2web_history(inp.history),
    }
    return _split_and_fill(load_template("mind2web.txt"), values, inp, attach=False)


_BUILDERS = {"alfworld": _alfworld_parts, "ebalfred": _ebalfred_parts, "mind2web": _mind2web_parts}


def prompt_parts(inp: PolicyInput, layout: str = "paper") -> list[_Part]:
    """The prompt of ``inp`` as ordered parts, adjacent text merged. ``layout``
    (``policy.prompt_layout``) reorders the ALFWorld prompt only: the EB-ALFRED and Mind2Web
    prompts already open with their instructions."""
    merged: list[_Part] = []
    built = _alfworld_parts(inp, layout) if inp.benchmark == "alfworld" else _BUILDERS[inp.benchmark](inp)
    for part in built:
        if part[0] == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + part[1])
        elif part[0] != "text" or part[1]:
            merged.append(part)
    return merged


def build_messages(inp: PolicyInput, layout: str = "paper") -> tuple[list[dict[str, Any]], list[Image.Image]]:
    """Chat messages (one ``user`` turn, image parts in order) and the images they refer to.

    Image parts are ``{"type": "image"}``; the i-th one refers to ``images[i]``. This is
    what HF chat templates (one vision placeholder per image part) and vLLM expect.
    ``layout``: ``policy.prompt_layout`` (:func:`prompt_parts`).
    """
    content: list[dict[str, Any]] = []
    images: list[Image.Image] = []
    for part in prompt_parts(inp, layout):
        if part[0] == "text":
            content.append({"type": "text", "text": part[1]})
        else:
            if part[2] is None:
                raise ValueError(
                    "the memory view was laid out without pixels (PolicyInput.view_unpainted); a policy that "
                    "sends images must say needs_view_image = True so that its pages are painted"
                )
            content.append({"type": "image"})
            images.append(part[2])
    return [{"role": "user", "content": content}], images


def build_prompt_text(inp: PolicyInput) -> str:
    """The prompt as a text-only reader sees it: images appear as their marker line."""
    out = []
    for part in prompt_parts(inp):
        out.append(part[1] if part[0] == "text" else part[1] + "\n")
    return "".join(out)
