"""EB-ALFRED's in-context task-execution examples (the ``{task_execution_examples}`` slot of
the paper's EB-ALFRED system prompt, appendix E.3), loaded from EmbodiedBench's own files.

EmbodiedBench's evaluator (``embodiedbench/evaluator/eb_alfred_evaluator.py`` at
``b247936``) reads ``evaluator/config/alfred_examples.json`` (10 examples) for every subset
but ``long_horizon``, which reads ``alfred_long_horizon_examples.json`` (7), and its planner
(``planner/vlm_planner.py`` ``process_prompt``) puts the first ``n_shots`` (config
``n_shots: 10``, ``configs/eb-alf.yaml``) into the prompt as::

    '\\n\\n'.join(f'## Task Execution Example {i}: \\n {x}' for i, x in enumerate(examples[:n_shots]))

Each example is one string (``Human instruction: ...\\nOutput: {...}`` with an
``executable_plan`` of ``{"action_id", "action_name"}``; the ids number EmbodiedBench's
global skill list, :func:`~memprism_ray.envs.ebalfred.skills.global_skills`).

The environment loads them on its node (where EmbodiedBench is installed) and sends the
formatted block with the observation (``Observation.meta["examples"]``); the agent passes it
to the prompt. ``ebalfred.n_shots: 0`` drops the slot.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Upstream's default ``n_shots`` (``configs/eb-alf.yaml``, the evaluator's config).
N_SHOTS = 10
EXAMPLE_FILES = {"default": "alfred_examples.json", "long_horizon": "alfred_long_horizon_examples.json"}


def example_file(subset: str) -> str:
    """The example file EmbodiedBench's evaluator reads for ``subset``."""
    return EXAMPLE_FILES["long_horizon" if subset == "long_horizon" else "default"]


def embodiedbench_examples_dir() -> Path | None:
    """``embodiedbench/evaluator/config`` of the installed EmbodiedBench, or ``None``."""
    from memprism_ray.envs.ebalfred.data import embodiedbench_path

    return embodiedbench_path("evaluator", "config")


def load_examples(folder: str | Path, subset: str) -> list[str]:
    """The examples of ``subset`` from ``folder``; a one-line error naming the file and the
    key to change when it is missing or not a JSON list of strings."""
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
    return data


def format_examples(examples: list[str], n_shots: int) -> str:
    """The first ``n_shots`` examples as EmbodiedBench's planner joins them ('' for none)."""
    if n_shots < 0:
        raise ValueError(f"ebalfred.n_shots must be >= 0, got {n_shots}")
    return "\n\n".join(f"## Task Execution Example {i}: \n {x}" for i, x in enumerate(examples[:n_shots]))
