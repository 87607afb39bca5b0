"""EB-ALFRED's in-context task-execution examples (the ``{task_execution_examples}`` slot of
the paper's EB-ALFRED system prompt, appendix E.3), loaded from EmbodiedBench's own files
(``evaluator/config``; ``long_horizon`` has its own file) on the env's node.

EmbodiedBench's examples answer with a whole JSON plan whose ids number its 162 global skills;
the paper's prompt asks for ONE action name per step from the scene-filtered list. Shown as
they are, they would teach the other contract, so each is parsed as data and rendered in the
prompt's terms: the instruction, the example's language plan (``Plan:``), then its steps in the
shape of the prompt's action history (``Step i, action id k, <name>``: steps from 0, ids of
EmbodiedBench's full list, which for the 162 global skills are the file's own), under
EmbodiedBench's planner's headers and joining (docs/ebalfred.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memprism_ray.benchmark.ebalfred.contract import ebalfred_instruction
from memprism_ray.benchmark.ebalfred.skills import GLOBAL_IDS
from memprism_ray.io_atomic import json_lines

#: Upstream's default ``n_shots`` (``configs/eb-alf.yaml``, the evaluator's config).
N_SHOTS = 10
EXAMPLE_FILES = {"default": "alfred_examples.json", "long_horizon": "alfred_long_horizon_examples.json"}

# EmbodiedBench's example string: the instruction line, then the answer its planner asked for.
_EXAMPLE = re.compile(
    r"\AHuman instruction: (?P<instruction>[^\n]*)\nOutput: \{\n'language_plan': '(?P<plan>.*)',\n"
    r"'executable_plan': \[\n(?P<steps>.*?)\n?\]\}\s*\Z",
    re.S,
)


@dataclass(frozen=True)
class Example:
    """One in-context example as data: the instruction, the language plan, the skills in order
    (each one of EmbodiedBench's 162 global skills, whose ids are the same in every scene)."""

    instruction: str
    plan: str
    actions: tuple[str, ...]


def parse_example(text: str) -> Example:
    """An example string of EmbodiedBench's files as data (its steps are JSON, never evaluated)."""
    m = _EXAMPLE.match(text)
    if m is None:
        raise ValueError(
            "not an EmbodiedBench example ('Human instruction: ...\\nOutput: {\\n'language_plan': '...',\\n"
            f"'executable_plan': [...]}}'): {text[:80]!r}"
        )
    actions = []
    for _, line, step in json_lines(
        m["steps"].splitlines(),
        lambda _, line, exc: ValueError(f"executable_plan step {line[:80]!r} is not JSON ({exc})"),
    ):
        name = step.get("action_name") if isinstance(step, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"executable_plan step {line[:80]!r} has no action_name")
        if name.strip() not in GLOBAL_IDS or step.get("action_id") not in (None, GLOBAL_IDS[name.strip()]):
            raise ValueError(
                f"executable_plan step {line[:80]!r} is not one of EmbodiedBench's 162 global skills with its id"
            )
        actions.append(name.strip())
    if not actions:
        raise ValueError(f"example {m['instruction'][:60]!r} has an empty executable_plan")
    return Example(m["instruction"].strip(), m["plan"].strip(), tuple(actions))


def render_example(example: Example) -> str:
    """``example`` in the prompt's terms: its plan, then one action per step as the action
    history shows steps (from 0, with EmbodiedBench's ids)."""
    lines = [f"Human instruction: {ebalfred_instruction(example.instruction)}."]
    if example.plan:
        lines.append(f"Plan: {example.plan}")
    lines.extend(f"Step {i}, action id {GLOBAL_IDS[a]}, {a}" for i, a in enumerate(example.actions))
    return "\n".join(lines)


def example_file(subset: str) -> str:
    """The example file EmbodiedBench's evaluator reads for ``subset``."""
    return EXAMPLE_FILES["long_horizon" if subset == "long_horizon" else "default"]


def load_examples(folder: str | Path, subset: str) -> list[Example]:
    """The examples of ``subset`` from ``folder``, parsed."""
    path = Path(folder) / example_file(subset)
    if not path.is_file():
        raise FileNotFoundError(
            f"EB-ALFRED in-context examples not found at {path}: install EmbodiedBench (docs/ebalfred.md), "
            "point ebalfred.examples at a folder holding its evaluator/config example files, or set "
            "ebalfred.n_shots: 0"
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        raise ValueError(f"{path}: expected a JSON list of example strings (EmbodiedBench's format)")
    out = []
    for i, text in enumerate(data):
        try:
            out.append(parse_example(text))
        except ValueError as exc:
            raise ValueError(f"{path}: example {i}: {exc}") from None
    return out


def format_examples(examples: Sequence[Example], n_shots: int) -> str:
    """The first ``n_shots`` examples rendered, as EmbodiedBench's planner joins them."""
    if n_shots < 0:
        raise ValueError(f"ebalfred.n_shots must be >= 0, got {n_shots}")
    shown = examples[:n_shots]
    return "\n\n".join(f"## Task Execution Example {i}: \n {render_example(x)}" for i, x in enumerate(shown))
