"""``make run``'s last line (scripts/run_local.py): it named a run directory that a job refused at
its start (a bad override) had never written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run_local():
    spec = importlib.util.spec_from_file_location("run_local", ROOT / "scripts" / "run_local.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_last_line_names_a_run_directory_only_when_one_was_written(tmp_path: Path) -> None:
    ending = _run_local().ending
    run = tmp_path / "local-20261207-163049"
    assert ending("FAILED", run) == (
        f"job FAILED; no run directory was written ({run}): the job's own line above says why"
    )
    run.mkdir()
    assert ending("SUCCEEDED", run) == f"job SUCCEEDED; run directory {run}"


def test_the_run_name_and_directory_are_its_own_options(capsys) -> None:
    """``make run`` passes the job ``--run.name``/``--run.out_dir`` itself and names that run
    directory at its end; given again among the overrides, the job wrote another one."""
    import pytest

    for override in (["--run.name", "x"], ["--run.out-dir=/tmp/x"]):
        with pytest.raises(SystemExit) as exit_:
            _run_local().main(["--", *override])
        assert exit_.value.code == 2
        assert "give the run's name with --name; its directory is runs/<name> here" in capsys.readouterr().err
