"""Every documented ``ray job submit --working-dir .`` command (README, docs, the job scripts'
``--help``, cluster files, presets) writes its run, and reads its checkpoints, outside Ray's
temporary copy of the working dir: an output directory there is refused at start
(``cluster/placement.check_outlives_job``; tests/e2e/test_job_submit.py submits one), so a
documented command with a relative ``run.out_dir`` or checkpoint fails for whoever copies it."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from memprism_ray.config import load_config

ROOT = Path(__file__).resolve().parents[2]
#: The job options that name a directory the job reads or writes (parse_job_args, fit).
PATH_OPTIONS = ("--checkpoint", "--init_checkpoint", "--out", "--resume")
_WHERE = ("README.md", "docs/*.md", "jobs/*.py", "clusters/**/*.yaml", "clusters/**/*.md", "configs/*.yaml")


def documented_submits() -> list[tuple[str, list[str]]]:
    """(file:line, the job's argv after ``python``) of each ``ray job submit --working-dir``
    command, its continuation lines joined and comment markers dropped."""
    found = []
    for pattern in _WHERE:
        for path in sorted(ROOT.glob(pattern)):
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                if "ray job submit" not in line or "--working-dir" not in line:
                    continue
                parts, j = [line], i
                while parts[-1].rstrip().endswith("\\") and j + 1 < len(lines):
                    j += 1
                    parts.append(lines[j])
                text = " ".join(re.sub(r"^\s*#\s?", "", p).rstrip().rstrip("\\") for p in parts)
                argv = shlex.split(text.split(" -- ", 1)[1], comments=True)
                found.append((f"{path.relative_to(ROOT)}:{i + 1}", argv[argv.index("python") + 1 :]))
    return found


def _outside(value: str) -> bool:
    return os.path.isabs(os.path.expanduser(os.path.expandvars(value)))


def test_the_documented_commands_are_found() -> None:
    where = {w.split(":")[0] for w, _ in documented_submits()}
    assert {"README.md", "docs/cluster.md", "jobs/grpo_alfworld.py", "jobs/eval_mind2web.py"} <= where


@pytest.mark.parametrize("where, argv", documented_submits(), ids=[w for w, _ in documented_submits()])
def test_a_documented_submit_writes_and_reads_outside_rays_copy(where: str, argv: list[str]) -> None:
    script, rest = argv[0], argv[1:]
    assert script.startswith("jobs/") and (ROOT / script).is_file(), where
    config, overrides, i = None, [], 0
    while i < len(rest):
        key, value = rest[i], rest[i + 1]
        if key == "--config":
            config = str(ROOT / value)
        elif key in PATH_OPTIONS:
            assert value == "auto" or _outside(value), f"{where}: {key} {value!r} is relative to Ray's copy"
        else:
            overrides += [key, value]
        i += 2
    cfg = load_config(config, overrides)
    assert _outside(cfg.run.out_dir), f"{where}: run.out_dir {cfg.run.out_dir!r} is relative to Ray's copy"
