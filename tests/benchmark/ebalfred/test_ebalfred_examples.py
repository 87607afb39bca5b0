"""EB-ALFRED's in-context examples (issue 30 item 3, issue 35 item 3, issue 41 item 4):
EmbodiedBench's files, its n_shots default and its planner's headers fill the
``{task_execution_examples}`` slot of the paper's EB-ALFRED system prompt (appendix E.3), each
example shown as that prompt asks (one action per step, in the action history's shape, with
EmbodiedBench's ids); without them the slot is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprism_ray.benchmark.ebalfred.contract import EBALFRED, ebalfred_instruction
from memprism_ray.benchmark.ebalfred.examples import (
    N_SHOTS,
    Example,
    example_file,
    format_examples,
    load_examples,
    parse_example,
    render_example,
)
from memprism_ray.benchmark.ebalfred.fixture import build_fixture
from memprism_ray.policy.base import PolicyInput

#: An example string in the shape of EmbodiedBench's ``alfred_examples.json`` (b247936): a
#: whole plan as one JSON answer, with ids of EmbodiedBench's 162 global skills.
UPSTREAM_SHAPED = (
    "Human instruction: Put a clean pan in the refrigerator.\nOutput: {\n'language_plan': 'Find a pan and pick "
    "it up, rinse it at the sink, then put it in the fridge.',\n'executable_plan': [\n"
    '{"action_id": 7, "action_name": "find a Pan"}\n{"action_id": 86, "action_name": "pick up the Pan"}\n'
    '{"action_id": 79, "action_name": "find a Sink"}\n{"action_id": 133, "action_name": "put down the object in hand"}'
    "\n]}"
)


def test_formatting_keeps_embodiedbench_s_headers_and_shots() -> None:
    """vlm_planner.py ``process_prompt`` (b247936): ``'\\n\\n'.join(f'## Task Execution
    Example {i}: \\n {x}' for i, x in enumerate(examples[:n_shot]))``."""
    assert N_SHOTS == 10  # configs/eb-alf.yaml n_shots
    a, b, c = (Example(f"Task {k}.", "", ("find a Mug",)) for k in "ABC")
    two = (
        "## Task Execution Example 0: \n Human instruction: Task A.\nStep 0, action id 14, find a Mug\n\n"
        "## Task Execution Example 1: \n Human instruction: Task B.\nStep 0, action id 14, find a Mug"
    )
    assert format_examples([a, b, c], 2) == two
    assert format_examples([a], 0) == ""
    with pytest.raises(ValueError, match="n_shots"):
        format_examples([a], -1)
    assert example_file("long_horizon") == "alfred_long_horizon_examples.json"
    assert example_file("alfred_train") == example_file("base") == "alfred_examples.json"


def test_examples_are_shown_as_the_prompt_asks() -> None:
    """Issue 35 item 3, issue 41 item 4: the prompt asks for ONE action name per step inside
    <action></action>; upstream's examples answer with a multi-action JSON plan whose ids number
    the 162 global skills. Shown in the prompt's terms: the language plan, then one action per
    step as the action history shows steps: from 0, with EmbodiedBench's ids (the file's own,
    the same in every scene's full list and in the listed skills' ids); no JSON."""
    ex = parse_example(UPSTREAM_SHAPED)
    assert ex == Example(
        "Put a clean pan in the refrigerator.",
        "Find a pan and pick it up, rinse it at the sink, then put it in the fridge.",
        ("find a Pan", "pick up the Pan", "find a Sink", "put down the object in hand"),
    )
    shown = render_example(ex)
    assert shown == (
        "Human instruction: Put a clean pan in the refrigerator.\n"
        "Plan: Find a pan and pick it up, rinse it at the sink, then put it in the fridge.\n"
        "Step 0, action id 7, find a Pan\nStep 1, action id 86, pick up the Pan\nStep 2, action id 79, find a Sink\n"
        "Step 3, action id 133, put down the object in hand"
    )
    for banned in ("action_id", "executable_plan", "{"):
        assert banned not in shown
    # The same example in a prompt whose (scene-filtered) list holds these skills: the same ids.
    skills = ("find a Sink", "find a Pan", "pick up the Pan", "put down the object in hand")
    block = format_examples([ex], 1)
    prompt = EBALFRED.build_prompt_text(
        PolicyInput(
            benchmark="ebalfred", goal="Wash a pan.", observation="o", admissible=skills, meta={"examples": block}
        )
    )
    assert block in prompt and "action id 7: find a Pan" in prompt and "action_id" not in prompt
    listed = dict(line.split(": ", 1)[::-1] for line in prompt.splitlines() if line.startswith("action id "))
    for line in (x for x in block.splitlines() if x.startswith("Step ")):
        step_id, name = line.split(", ", 2)[1:]
        assert listed[name] == step_id  # "action id 79" for find a Sink in both
    # Upstream's own files, unparsed wording: an empty language plan drops the plan line.
    assert render_example(Example("slice a loaf of bread.", "", ("find a Knife",))) == (
        "Human instruction: slice a loaf of bread.\nStep 0, action id 34, find a Knife"
    )


def test_load_errors_name_the_file_and_the_keys(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"ebalfred\.examples"):
        load_examples(tmp_path, "base")
    (tmp_path / "alfred_examples.json").write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ValueError, match="list of example strings"):
        load_examples(tmp_path, "base")
    (tmp_path / "alfred_examples.json").write_text(json.dumps([UPSTREAM_SHAPED, "Put a mug away."]))
    with pytest.raises(ValueError, match=r"alfred_examples\.json: example 1: not an EmbodiedBench example"):
        load_examples(tmp_path, "base")
    broken = UPSTREAM_SHAPED.replace('"action_name": "find a Sink"', '"name": "find a Sink"')
    with pytest.raises(ValueError, match="has no action_name"):
        parse_example(broken)
    for wrong in ('"action_id": 80, "action_name": "find a Sink"', '"action_id": 79, "action_name": "find a Sink_2"'):
        with pytest.raises(ValueError, match="162 global skills with its id"):
            parse_example(UPSTREAM_SHAPED.replace('"action_id": 79, "action_name": "find a Sink"', wrong))


def test_the_instruction_line_ends_with_one_period() -> None:
    """The user message is ``## Now the human instruction is: {instruction}.``; EmbodiedBench's
    planner strips the instruction's final period first (``user_instruction.rstrip('.')``).
    Before, "... on the desk." gave "desk..". Examples' instructions get the same rule."""
    skills = ("find a Mug",)
    for goal in ("Put a mug on the desk.", "Put a mug on the desk", "Put a mug on the desk.. "):
        inp = PolicyInput(benchmark="ebalfred", goal=goal, observation="o", admissible=skills)
        text = EBALFRED.build_prompt_text(inp)
        assert "## Now the human instruction is: Put a mug on the desk.\n" in text and "desk.." not in text
    assert ebalfred_instruction("Turn on the lamp...") == "Turn on the lamp"
    assert render_example(Example("Put a mug away..", "", skills)).startswith("Human instruction: Put a mug away.\n")


def _input(examples: str) -> PolicyInput:
    skills = ("find a Mug", "pick up the Mug", "put down the object in hand")
    meta = {"examples": examples} if examples else {}
    return PolicyInput(
        benchmark="ebalfred", goal="Put a mug on the desk.", observation="Visible objects: Desk.", admissible=skills,
        meta=meta,
    )  # fmt: skip


def test_the_examples_fill_the_prompt_slot(tmp_path: Path) -> None:
    root = build_fixture(tmp_path / "fx", episodes_per_subset=1, resolution=48)
    block = format_examples(load_examples(root / "examples", "base"), N_SHOTS)
    with_examples = EBALFRED.build_prompt_text(_input(block))
    without = EBALFRED.build_prompt_text(_input(""))
    assert block in with_examples and "{task_execution_examples}" not in with_examples
    assert with_examples.index("## The available action id") < with_examples.index(block)
    assert with_examples.index(block) < with_examples.index("## Guidelines")
    assert "Task Execution Example" not in without and len(with_examples) > len(without) + len(block)
