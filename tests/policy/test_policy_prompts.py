"""Prompts of appendix E.3: verbatim text, view conditions, image order, safe filling."""

from __future__ import annotations

import pytest
from PIL import Image

from memprism_ray.benchmark import get_benchmark
from memprism_ray.benchmark.mind2web.contract import snapshot_refs
from memprism_ray.policy.base import HistoryRecord, PolicyInput
from memprism_ray.policy.prompts import (
    PROMPT_VERSION,
    VIEW_TEXT_BEGIN,
    VIEW_TEXT_END,
    fill,
    load_template,
    placeholders,
)


def build_messages(inp: PolicyInput, layout: str = "paper"):
    """The chat messages of ``inp`` under its benchmark's task contract."""
    return get_benchmark(inp.benchmark).task_contract().build_messages(inp, layout)


def build_prompt_text(inp: PolicyInput) -> str:
    return get_benchmark(inp.benchmark).task_contract().build_prompt_text(inp)


VIEW = Image.new("RGB", (56, 84), "white")
CAMERA = Image.new("RGB", (112, 56), "black")
HIST = (
    HistoryRecord(0, "You are in the middle of a room.", "go to desk 1", "You arrive at desk 1."),
    HistoryRecord(1, "On the desk 1, you see a mug 1.", "take mug 1 from desk 1", "You pick up the mug 1."),
)


def alf(**kw):
    base = dict(
        benchmark="alfworld",
        goal="put a mug in desk.",
        observation="You see a desk 1.",
        admissible=("go to desk 1", "look"),
        history=HIST,
        step=2,
    )
    base.update(kw)
    return PolicyInput(**base)


def eb(**kw):
    base = dict(
        benchmark="ebalfred",
        goal="Put a clean pan on the counter",
        observation="Pan is visible.",
        admissible=("find a Pan", "pick up the Pan", "put down the object in hand"),
        step=3,
        history=(HistoryRecord(2, "", "pick up the Pan", "Last action executed successfully."),),
    )
    base.update(kw)
    return PolicyInput(**base)


def m2w(**kw):
    base = dict(benchmark="mind2web", goal="Find a flight", observation="<a [ref=e1]>Home</a> <input [ref=e7]>", step=0)
    base.update(kw)
    return PolicyInput(**base)


def test_templates_hold_the_paper_text_verbatim() -> None:
    assert PROMPT_VERSION == "memprism-prompts-v3"
    alfworld = load_template("alfworld.txt")
    assert alfworld.startswith("<image>\nYou are an expert agent operating in the ALFRED embodied Environment.")
    assert "This reasoning process MUST be enclosed within\n<think></think> tags." in alfworld
    assert placeholders(alfworld) == {
        "goal",
        "step_count",
        "recent_observation_action_result_records",
        "current_step",
        "observation",
        "admissible_actions",
    }
    system = load_template("ebalfred_system.txt")
    assert "## The available action id (0 ~ {max_id}) and action names are:" in system
    assert "first find the target receptacle and then use exactly 'put down the object in hand'." in system
    user = load_template("ebalfred_user.txt")
    assert user.startswith("## Now the human instruction is: {instruction}.")
    mind2web = load_template("mind2web.txt")
    assert '{"op":"TYPE","ref":"e7","value":"text to type"}' in mind2web
    assert placeholders(mind2web) == {
        "step_idx",
        "goal",
        "html_field",
        "observation",
        "recent_observation_and_expert_action_records",
    }


def test_alfworld_image_condition_puts_the_view_first_and_fills_fields() -> None:
    messages, images = build_messages(alf(view_image=VIEW))
    assert len(messages) == 1 and messages[0]["role"] == "user"
    content = messages[0]["content"]
    assert [p["type"] for p in content] == ["image", "text"]
    assert images == [VIEW]
    text = content[1]["text"]
    assert "Your task is to: put a mug in desk." in text
    assert "you have already taken 2 step(s)" in text and "You are now at step 3 " in text
    assert "['go to desk 1', 'look']" in text
    assert "[Step 2] Observation: On the desk 1, you see a mug 1. Action: take mug 1 from desk 1" in text
    assert "The image provides an optical view relevant to this task." in text


def test_alfworld_text_and_no_memory_conditions() -> None:
    view_text = "step 2 | take mug 1 from desk 1 | state_update | agent.holding -> mug 1"
    messages, images = build_messages(alf(view_text=view_text))
    assert images == []
    text = messages[0]["content"][0]["text"]
    assert text.startswith(f"{VIEW_TEXT_BEGIN}\n{view_text}\n{VIEW_TEXT_END}\nYou are an expert agent")
    assert "The image provides" not in text and "The text block above provides a memory view" in text

    messages, images = build_messages(alf())
    text = messages[0]["content"][0]["text"]
    assert images == [] and len(messages[0]["content"]) == 1
    assert "<image" not in text and "optical view" not in text and VIEW_TEXT_BEGIN not in text
    assert text.startswith("You are an expert agent")


def test_no_history_reads_none() -> None:
    text = build_prompt_text(alf(history=(), step=0))
    assert "Recent interaction history:\n(none)\n" in text
    assert "already taken 0 step(s)" in text and "now at step 1 " in text


def test_filling_is_single_pass_and_cannot_create_image_slots() -> None:
    goal = "put {observation} and {goal} in {{x}}"
    obs = "<image>\n<image: MemPrism optical memory view>\nliteral {admissible_actions}"
    messages, images = build_messages(alf(goal=goal, observation=obs, view_image=VIEW))
    assert len(images) == 1
    assert sum(p["type"] == "image" for p in messages[0]["content"]) == 1
    text = messages[0]["content"][1]["text"]
    assert f"Your task is to: {goal}\n" in text
    assert obs in text


def test_fill_rejects_missing_fields_and_keeps_json_braces() -> None:
    with pytest.raises(ValueError, match="goal"):
        fill("task {goal} at {step}", {"step": 1})
    assert fill('{"op":"CLICK"} {goal}', {"goal": "{x}"}) == '{"op":"CLICK"} {x}'


def test_ebalfred_one_user_message_with_camera_then_view() -> None:
    messages, images = build_messages(eb(camera_image=CAMERA, view_image=VIEW))
    content = messages[0]["content"]
    assert [p["type"] for p in content] == ["text", "image", "image"]
    assert images == [CAMERA, VIEW]
    text = content[0]["text"]
    assert text.startswith("## You are a robot operating in a home.")
    assert "<image" not in text
    # Issue 41 item 4: ids of EmbodiedBench's full list (the planner's), history steps from 0.
    assert "## The available action id (0 ~ 161) and action names are:\naction id 7: find a Pan\n" in text
    assert "action id 86: pick up the Pan\naction id 133: put down the object in hand\n" in text
    assert "The action history: Step 2, action id 86, pick up the Pan, env feedback: Last action executed" in text
    assert "## Now the human instruction is: Put a clean pan on the counter." in text
    assert "1. current synchronized simulator observation;\n2. MemPrism optical memory view." in text
    # The system prefix comes before the user suffix.
    assert text.index("## Guidelines") < text.index("## Now the human instruction")


def test_ebalfred_view_conditions_change_the_attachment_sentence() -> None:
    messages, images = build_messages(eb(camera_image=CAMERA, view_text="EntityState: pan -> clean"))
    assert images == [CAMERA]
    kinds = [p["type"] for p in messages[0]["content"]]
    assert kinds == ["text", "image", "text"]
    assert "EntityState: pan -> clean" in messages[0]["content"][2]["text"]
    assert "the MemPrism memory view follows as text" in messages[0]["content"][0]["text"]

    messages, images = build_messages(eb(camera_image=CAMERA))
    assert images == [CAMERA]
    text = messages[0]["content"][0]["text"]
    assert "The attached image is the current synchronized simulator observation." in text
    assert "MemPrism" not in text

    messages, images = build_messages(eb())
    assert images == [] and "attached" not in messages[0]["content"][0]["text"]


def test_ebalfred_examples_and_skill_list() -> None:
    text = build_prompt_text(eb(meta={"examples": "Example 1: find a Pan, pick up the Pan"}))
    assert "action id 133: put down the object in hand\n\nExample 1: find a Pan" in text
    assert "\n\n\n" not in build_prompt_text(eb())
    with pytest.raises(ValueError, match="skill list"):
        build_messages(eb(admissible=()))


def test_mind2web_view_sits_between_instructions_and_task() -> None:
    hist = (HistoryRecord(0, "search page", '{"op":"CLICK","ref":"e1","value":null}', ""),)
    messages, images = build_messages(m2w(view_image=VIEW, history=hist, step=1, meta={"html_field": "raw_html"}))
    kinds = [p["type"] for p in messages[0]["content"]]
    assert kinds == ["text", "image", "text"] and images == [VIEW]
    first, second = messages[0]["content"][0]["text"], messages[0]["content"][2]["text"]
    assert first.rstrip().endswith("Do not invent refs or output multiple\nactions.")
    assert second.lstrip().startswith("[Step 2] Current task:\nFind a flight")
    assert "Current page snapshot (source=raw_html):" in second
    assert '[Step 1] Observation: search page | Expert action: {"op":"CLICK","ref":"e1","value":null}' in second
    assert second.rstrip().endswith('{"op":"SELECT","ref":"e9","value":"option text"}')
    assert snapshot_refs(m2w().observation) == ("e1", "e7")


def test_prompt_text_marks_images_with_their_marker_line() -> None:
    text = build_prompt_text(eb(camera_image=CAMERA, view_image=VIEW))
    assert text.rstrip().endswith(
        "<image: current synchronized simulator observation>\n<image: MemPrism optical memory view>"
    )
    assert build_prompt_text(alf(view_image=VIEW)).startswith("<image>\nYou are an expert agent")


def test_an_unpainted_view_reads_as_the_optical_prompt_but_cannot_be_sent_as_an_image() -> None:
    unpainted = alf(view_unpainted=True, meta={"view_text": "step 1 | go to desk 1"})
    assert unpainted.view_mode == "image" and unpainted.images() == []
    # A text-only reader (token counts, the scripted stand-in) sees the optical condition's prompt.
    assert build_prompt_text(unpainted) == build_prompt_text(alf(view_image=VIEW))
    with pytest.raises(ValueError, match="needs_view_image = True"):
        build_messages(unpainted)
    for kw in ({"view_image": VIEW}, {"view_text": "a view"}):
        with pytest.raises(ValueError, match="view_unpainted is an optical view without pixels"):
            alf(view_unpainted=True, **kw)


# --- policy.prompt_layout (issue 31; ALFWorld only) ---------------------------------------------
def _words(messages: list) -> list[str]:
    return sorted(w for p in messages[0]["content"] if p["type"] == "text" for w in p["text"].split())


def test_paper_layout_is_the_verbatim_template_in_its_order() -> None:
    """The default is byte for byte what the template gives: view image, then the text."""
    inp = alf(view_image=VIEW)
    messages, images = build_messages(inp)
    assert build_messages(inp, "paper") == (messages, images)
    expected = fill(
        load_template("alfworld.txt").removeprefix("<image>\n"),
        {
            "goal": inp.goal,
            "step_count": 2,
            "recent_observation_action_result_records": "\n".join(
                f"[Step {r.step + 1}] Observation: {r.observation} Action: {r.action} Result: {r.feedback}"
                for r in HIST
            ),
            "current_step": 3,
            "observation": inp.observation,
            "admissible_actions": "'go to desk 1', 'look'",
        },
    )
    assert messages[0]["content"] == [{"type": "image"}, {"type": "text", "text": expected}]


@pytest.mark.parametrize("view", [{"view_image": VIEW}, {"view_text": "step 2 | take mug 1"}, {}])
def test_instructions_first_has_the_same_words_in_another_order(view: dict) -> None:
    paper, paper_images = build_messages(alf(**view))
    first, first_images = build_messages(alf(**view), "instructions_first")
    assert first_images == paper_images and first != paper
    assert _words(first) == _words(paper)  # not a word added or dropped
    text = first[0]["content"][0]["text"]
    assert text.startswith(
        "You are an expert agent operating in the ALFRED embodied Environment.\nNow it's your turn to take an action."
    )
    assert text.index("<action></action> tags.") < text.index("Your task is to:") < text.index("You are now at step")


def test_instructions_first_shares_a_prefix_across_decisions_and_keeps_the_image_after_the_text() -> None:
    a, _ = build_messages(alf(view_image=VIEW), "instructions_first")
    b, _ = build_messages(alf(view_image=VIEW, goal="heat an egg.", observation="Other."), "instructions_first")
    ta, tb = a[0]["content"][0]["text"], b[0]["content"][0]["text"]
    prefix = ta[: ta.index("Your task is to:")]  # role and closing instructions: the cacheable prefix
    assert tb.startswith(prefix) and len(prefix) > 300
    assert [p["type"] for p in a[0]["content"]] == ["text", "image", "text"]
    assert a[0]["content"][2]["text"] == "The image provides an optical view relevant to this task.\n"
    paper, _ = build_messages(alf(view_image=VIEW))
    assert paper[0]["content"][0] == {"type": "image"}  # the paper's prompt shares nothing before its image


def test_prompt_layout_leaves_the_other_benchmarks_alone_and_refuses_unknown_names() -> None:
    for inp in (eb(camera_image=CAMERA, view_image=VIEW), m2w(view_text="a view")):
        assert build_messages(inp, "instructions_first") == build_messages(inp)
    with pytest.raises(ValueError, match="unknown prompt layout 'sideways'"):
        build_messages(alf(view_image=VIEW), "sideways")


# --- the task contract (policy/contract.py) -------------------------------------------------
def test_a_contract_reads_only_its_own_benchmark_and_never_drops_a_camera_frame() -> None:
    """A camera frame is part of EB-ALFRED's prompt only (its camera slot); a contract refuses
    an input of another benchmark (prompt: an error; parse: an invalid output, never raising)."""
    alfworld = get_benchmark("alfworld").task_contract()
    with pytest.raises(ValueError, match="camera_image is not part of the alfworld prompt"):
        build_messages(alf(camera_image=CAMERA))
    with pytest.raises(ValueError, match="camera_image is not part of the mind2web prompt"):
        build_messages(m2w(camera_image=CAMERA))
    assert build_messages(eb(camera_image=CAMERA))[1] == [CAMERA]
    with pytest.raises(ValueError, match="the alfworld task contract reads alfworld inputs, not ebalfred"):
        alfworld.build_messages(eb())
    out = alfworld.to_output(eb(), "<action>find a Pan</action>")
    assert not out.valid and out.error == "the alfworld task contract reads alfworld inputs, not ebalfred"


def test_ebalfred_ids_and_history_as_embodiedbench_s_planner_renders_them() -> None:
    """Issue 41 item 4 (``vlm_planner.py``, b247936): the planner numbers EmbodiedBench's full list
    (162 global skills, then the scene's instance skills) and its history ``Step i`` from 0. The
    prompt lists the scene-filtered skills under those ids; an instance skill keeps its id past
    161, a global skill executed outside the list (the fallback) its global id, an output that is
    no skill reads ``unknown``."""
    listed = (
        "find a Cabinet",
        "put down the object in hand",
        "open the Cabinet",
        "find a Cabinet_2",
        "open the Cabinet_2",
    )
    history = (
        HistoryRecord(0, "", "find a Cabinet_2", "Last action executed successfully."),
        HistoryRecord(1, "", "find a Sofa", "Last action is invalid. Cannot find Sofa."),
        HistoryRecord(2, "", "I am lost", "Last action is invalid."),
    )
    text = build_prompt_text(eb(admissible=listed, history=history, step=3))
    assert "## The available action id (0 ~ 163) and action names are:\n" in text
    assert (
        "action id 48: find a Cabinet\naction id 133: put down the object in hand\naction id 145: open the Cabinet\n"
        "action id 162: find a Cabinet_2\naction id 163: open the Cabinet_2\n"
    ) in text
    assert "Step 0, action id 162, find a Cabinet_2, env feedback" in text
    assert "\nStep 1, action id 52, find a Sofa, env feedback" in text
    assert "\nStep 2, action id unknown, I am lost, env feedback" in text
