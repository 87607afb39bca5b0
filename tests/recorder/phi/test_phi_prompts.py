"""The paper's Phi prompts (appendix E.1) are stored verbatim and filled without leaving a placeholder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memprism_ray.benchmark.alfworld.phi import ALFWORLD_PROMPT, alfworld_inputs
from memprism_ray.benchmark.ebalfred.phi import EBALFRED_SEMANTIC_PROMPT, ebalfred_inputs
from memprism_ray.benchmark.mind2web.phi import MIND2WEB_ACTION_SLOT, MIND2WEB_PROMPT, mind2web_inputs
from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.phi.base import Extraction
from memprism_ray.recorder.phi.prompt import PhiPrompt

#: The paper's Phi prompts, each declared by its benchmark's Phi module.
PROMPTS: dict[str, PhiPrompt] = {p.name: p for p in (ALFWORLD_PROMPT, EBALFRED_SEMANTIC_PROMPT, MIND2WEB_PROMPT)}
PHI_PROMPT_FIELDS = {name: p.fields for name, p in PROMPTS.items()}


def load_phi_prompt(name: str) -> str:
    return PROMPTS[name].load()


def fill_phi_prompt(name: str, values: dict[str, str]) -> str:
    return PROMPTS[name].fill(values)


def unfilled_placeholders(name: str, text: str) -> list[str]:
    """Fields of the prompt whose slot (its placeholder or literal slot) is still in ``text``."""
    prompt = PROMPTS[name]
    slots = dict(prompt.literal_slots)
    return sorted(f for f in prompt.fields if slots.get(f, f"{{{f}}}") in text or f"{{{f}}}" in text)


PAPER = Path("/work/shared/seeds/000_e8ab49c9613c1996.txt")
TITLES = {
    "alfworld": "ALFWorld Phi Event Extraction",
    "ebalfred_semantic": "EB-ALFRED Phi Semantic Stage",
    "mind2web": "Mind2Web Phi Event Extraction",
}

#: Fixed sentences of each prompt (copied from the paper by hand, independently of the files).
FIXED = {
    "alfworld": [
        "You are phi, a structured event annotator for MemPrism. Extract ALL state changes from the\ncurrent event. "
        "Return JSON only.",
        '"act_type": "put|go|open|look|examine|other",',
        "4. Extract every state change in the event. A key may occur at most once in delta_s.",
        "5. Copy the action verb into act_type.",
        "- action='open cabinet 1', result='You open the cabinet 1. The cabinet 1 is open.' -> return",
    ],
    "ebalfred_semantic": [
        "The attached image is the POST-ACTION camera observation for the CURRENT event.",
        "Do not output entities, bounding boxes, or other fields.",
        "1. If last_action_success is 0/false, or feedback says invalid/failed, return delta_s=[].",
        "5. If no state change is observable, return delta_s=[].",
    ],
    "mind2web": [
        "You are phi, a delta extractor for Mind2Web web-agent trajectories.",
        "Allowed delta_s.key values: page_state, overlay_state, field_value, choice_value,\nresult_state, "
        "workflow_state.",
        "1. Use only the allowed delta_s.key values. Never invent a new key.",
        "8. If no specific semantic delta is observable, return delta_s=[]. Do not classify the\n   outcome.",
        'Example 1 RETURN: {"delta_s":[\n {"key":"field_value","new_value":"60602"}]}',
    ],
}


@pytest.mark.skipif(not PAPER.is_file(), reason="the paper text is not on this machine")
@pytest.mark.parametrize("name", sorted(TITLES))
def test_prompt_files_are_the_papers_text_verbatim(name: str) -> None:
    paper = PAPER.read_text(encoding="utf-8")
    start = paper.index("\\begin{promptbox}{" + TITLES[name] + "}")
    body = paper[start:].split("\\begin{PromptText}\n", 1)[1].split("\\end{PromptText}", 1)[0]
    assert load_phi_prompt(name) == body


@pytest.mark.parametrize("name", sorted(FIXED))
def test_every_placeholder_named_in_the_paper_is_present_once(name: str) -> None:
    text = load_phi_prompt(name)
    for f in PHI_PROMPT_FIELDS[name]:
        slot = MIND2WEB_ACTION_SLOT if (name, f) == ("mind2web", "action") else "{" + f + "}"
        assert text.count(slot) == 1, (name, f)
    # and no other {word} placeholder exists in the text
    assert set(re.findall(r"\{([a-z_]+)\}", text)) == {f for f in PHI_PROMPT_FIELDS[name] if f != "action"} | (
        set() if name == "mind2web" else {"action"}
    )


def _rule() -> Extraction:
    return Extraction("button menu", "click")


def _filled(name: str) -> str:
    if name == "alfworld":
        meta = {"step": 3, "view": "EntityState|all|all|medium"}  # the Router's choice stays out
        raw = RawEvent("You are in the middle of a room.", "go to drawer 1", "You arrive at drawer 1.", 0.0, meta)
        values, _ = alfworld_inputs(raw, {"location": "desk 1"}, _rule())
    elif name == "ebalfred_semantic":
        meta = {"env_feedback": "Last action is invalid.", "last_action_success": False}
        raw = RawEvent("Visible objects: Pen.", "pick up the Pen", "Held objects: Mug (held).", 0.0, meta)
        values, _ = ebalfred_inputs(raw, {"held_object": "mug"}, _rule())
    else:
        raw = RawEvent("<header><button>Menu</button></header>", {"op": "CLICK", "ref": "e7"}, "<nav>Shop</nav>")
        values, _ = mind2web_inputs(raw, {}, _rule())
    return fill_phi_prompt(name, values)


@pytest.mark.parametrize("name", sorted(FIXED))
def test_filled_prompt_keeps_the_fixed_sentences_and_leaves_no_placeholder(name: str) -> None:
    text = _filled(name)
    for sentence in FIXED[name]:
        assert sentence in text, sentence
    assert unfilled_placeholders(name, text) == []
    assert not re.search(r"\{(" + "|".join(PHI_PROMPT_FIELDS[name]) + r")\}", text)


def test_alfworld_event_values_are_json_inside_the_event_object() -> None:
    text = _filled("alfworld")
    event = text[text.rindex("EVENT:") + len("EVENT:") :]
    assert json.loads(event) == {
        "observation": "You are in the middle of a room.",
        "action": "go to drawer 1",
        "result": "You arrive at drawer 1.",
        "reward": 0.0,
        "metadata": {"step": 3},
    }
    assert 'Existing tracked keys: ["location"]' in text


def test_ebalfred_current_lines_carry_feedback_and_the_success_flag() -> None:
    text = _filled("ebalfred_semantic")
    assert "CURRENT action: pick up the Pen CURRENT result text:\nHeld objects: Mug (held)." in text
    assert "CURRENT environment feedback: Last action is invalid. CURRENT last action success:\n0" in text
    assert 'Existing tracked delta keys: ["held_object"]' in text


def test_mind2web_action_slot_is_the_normalised_action() -> None:
    text = _filled("mind2web")
    event = json.loads(text[text.rindex("EVENT:") + len("EVENT:") :])
    assert event == {
        "before_clean_html": "<header><button>Menu</button></header>",
        "action": {"op": "CLICK", "target": "e7", "value": None},
        "after_clean_html": "<nav>Shop</nav>",
    }


def test_fill_is_one_pass_and_rejects_missing_or_unknown_fields() -> None:
    values = {f: "x" for f in PHI_PROMPT_FIELDS["mind2web"]}
    values["before_html"] = '"{after_html}"'  # inserted text is not scanned again
    text = fill_phi_prompt("mind2web", values)
    assert '"before_clean_html": "{after_html}"' in text
    with pytest.raises(ValueError, match=r"missing \['after_html'\]"):
        fill_phi_prompt("mind2web", {"before_html": "a", "action": "b"})
    with pytest.raises(ValueError, match=r"unknown \['goal'\]"):
        fill_phi_prompt("mind2web", {**values, "goal": "g"})
    with pytest.raises(ValueError, match="Phi prompt 'webshop' has no template file"):
        PhiPrompt("webshop", ()).load()
