"""Fixtures of the job tests: the job scripts' ``main(argv)`` run in this process.

A job's start (Python imports, a local Ray, its actors) is most of its time on 2 cores, so the
tests that need no process of their own (refusals before Ray, runs whose outputs are read)
call the script's ``main`` on the session's in-process Ray (``ray_session``: ``init_ray``
joins an initialised Ray). The kill-and-resume drill, ``ray job submit`` (tests/e2e) and the
EB-ALFRED runs keep their own processes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_job(script: str):
    """``jobs/<script>`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"job_{Path(script).stem}", ROOT / "jobs" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job_status(script: str, argv: list[str]) -> int:
    """The exit status ``python jobs/<script> ARGV`` would have: ``main``'s return value, or
    the code of the ``SystemExit`` argparse raises for a rejected setting."""
    try:
        return load_job(script).main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.fixture
def tiny_argv(memprism_tiny_corpus: Path, memprism_tiny_overrides, tmp_path: Path) -> Callable[..., list[str]]:
    """``tiny_argv(name, *extra)``: ``--config configs/local.yaml``, the tests' tiny job
    (tests/conftest.py ``tiny_overrides``) named ``name`` under ``tmp_path``, then ``extra``."""

    def argv(name: str, *extra: str) -> list[str]:
        tiny = memprism_tiny_overrides(memprism_tiny_corpus, tmp_path, name)
        return ["--config", "configs/local.yaml", *tiny, *extra]

    return argv


@pytest.fixture(scope="session")
def run_job() -> Callable[[str, list[str]], int]:
    """:func:`job_status`, for the test modules (``run_job("grpo_alfworld.py", argv)``)."""
    return job_status


@pytest.fixture(scope="session")
def run_job_captured() -> Callable[[str, list[str]], tuple[int, str, str]]:
    """:func:`job_status` with its stdout and stderr captured: (status, out, err). For
    module-scoped fixtures, where ``capsys`` is not available."""

    def run(script: str, argv: list[str]) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = job_status(script, argv)
        return status, out.getvalue(), err.getvalue()

    return run


@pytest.fixture
def no_ray_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if the job would start (or join) Ray: its refusal must come first."""
    import memprism_ray.cluster.placement as placement

    def refuse(*args, **kwargs):
        raise AssertionError("the job reached init_ray before refusing")

    monkeypatch.setattr(placement, "init_ray", refuse)
