"""EB-ALFRED's in-context examples (issue 30 item 3): EmbodiedBench's files, its n_shots
default and its planner's formatting fill the ``{task_execution_examples}`` slot of the
paper's EB-ALFRED system prompt (appendix E.3); without them the slot is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprism_ray.envs.ebalfred.examples import N_SHOTS, example_file, format_examples, load_examples
from memprism_ray.envs.ebalfred.fixture import build_fixture
from memprism_ray.policy.base import PolicyInput
from memprism_ray.policy.prompts import build_prompt_text


def test_formatting_is_embodiedbench_s_planner() -> None:
    """vlm_planner.py ``process_prompt`` (b247936): ``'\\n\\n'.join(f'## Task Execution
    Example {i}: \\n {x}' for i, x in enumerate(examples[:n_shot]))``."""
    assert N_SHOTS == 10  # configs/eb-alf.yaml n_shots
    two = "## Task Execution Example 0: \n A\n\n## Task Execution Example 1: \n B"
    assert format_examples(["A", "B", "C"], 2) == two
    assert format_examples(["A"], 0) == ""
    with pytest.raises(ValueError, match="n_shots"):
        format_examples(["A"], -1)
    assert example_file("long_horizon") == "alfred_long_horizon_examples.json"
    assert example_file("alfred_train") == example_file("base") == "alfred_examples.json"


def test_load_errors_name_the_file_and_the_keys(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"ebalfred\.examples"):
        load_examples(tmp_path, "base")
    (tmp_path / "alfred_examples.json").write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ValueError, match="list of example strings"):
        load_examples(tmp_path, "base")


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
    with_examples = build_prompt_text(_input(block))
    without = build_prompt_text(_input(""))
    assert block in with_examples and "{task_execution_examples}" not in with_examples
    assert with_examples.index("## The available action id") < with_examples.index(block)
    assert with_examples.index(block) < with_examples.index("## Guidelines")
    assert "Task Execution Example" not in without and len(with_examples) > len(without) + len(block)
