"""One recorded result per benchmark: ``benchmarks/results/<name>.json``.

Every benchmark here ends by printing ``RESULT {json}`` and handing the same figures to
:func:`write_result`, which writes them together with what a reader needs to judge them: the
command line, the date (UTC), the machine (cores, CPU model, load average) and the git commit
the code was at (and whether the measured code differed from it). README, docs and code
comments quote a speed-up by naming that file, so each figure has exactly one record and a
re-run replaces it (issue 29 item 7: "every benchmark figure quoted from one recorded
result").

A mode that measures something else than the default run (``bench_views.py
--horizons-only``, ``bench_rollout.py --layout local``, ...) passes a ``variant`` and gets its
own file, ``<name>.<variant>.json``, so it never replaces the default run's record.

The file is written atomically (:func:`memprism_ray.io_atomic.atomic_write_text`: a temporary
file in the same folder, flushed, then renamed over the old one), so a benchmark killed while
writing leaves the previous record whole. ``$MEMPRISM_BENCH_RESULTS`` points the records to
another folder (the tests do, so they never replace the committed ones).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memprism_ray.io_atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
RESULTS_ENV = "MEMPRISM_BENCH_RESULTS"
_NAME = re.compile(r"[a-z0-9_]+")
_VARIANT = re.compile(r"[a-z0-9_-]*")
# The code a benchmark measures; a change there (not in the records themselves) makes the
# recorded commit an incomplete description of what ran.
_MEASURED_PATHS = ("memprism_ray", "benchmarks", "configs", ":(exclude)benchmarks/results")
# The command line as the benchmark was started: what it measures may rewrite ``sys.argv``
# (ALFWorld's PDDL translator sets it to ``translate.py domain task``).
_LAUNCH_ARGV = list(sys.argv)


def results_dir() -> Path:
    """Where records go: ``$MEMPRISM_BENCH_RESULTS`` if set, else ``benchmarks/results``."""
    return Path(os.environ.get(RESULTS_ENV) or RESULTS_DIR)


def result_path(name: str, variant: str = "") -> Path:
    """``<results dir>/<name>.json``, or ``<name>.<variant>.json`` for a variant."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"benchmark name {name!r} must be lowercase letters, digits and '_' (the script's stem)")
    if not _VARIANT.fullmatch(variant):
        raise ValueError(f"benchmark variant {variant!r} must be lowercase letters, digits, '_' and '-'")
    return results_dir() / (f"{name}.{variant}.json" if variant else f"{name}.json")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # not a git checkout (an sdist, a container without git)
    return done.stdout.strip()


def git_state() -> dict[str, Any]:
    """The commit HEAD points at and whether the measured code differs from it."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no", "--", *_MEASURED_PATHS)
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """Cores (all, and those this process may use), CPU model, OS and the 1-minute load."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "load_avg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that ran: the script relative to the repository root, then its arguments.

    ``argv`` is what the script's ``main(argv)`` parsed; ``None`` means the arguments the
    process was started with."""
    script = Path(_LAUNCH_ARGV[0]).resolve()
    try:
        shown = script.relative_to(ROOT).as_posix()
    except ValueError:
        shown = _LAUNCH_ARGV[0]
    args = list(_LAUNCH_ARGV[1:] if argv is None else argv)
    return shlex.join(["python", shown, *args])


def write_result(
    name: str,
    figures: Mapping[str, Any],
    *,
    variant: str = "",
    argv: Sequence[str] | None = None,
) -> Path:
    """Write ``figures`` (what the benchmark printed after ``RESULT``) as the benchmark's record.

    Returns the file written; prints nothing, so the benchmark's last stdout line stays its
    ``RESULT`` line."""
    path = result_path(name, variant)
    doc = {
        "benchmark": name,
        "variant": variant or None,
        "command": command_line(argv),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "python": platform.python_version(),
        "git": git_state(),
        "result": dict(figures),
    }
    # Serialise before anything touches the disk: figures that do not serialise leave the
    # previous record as it was.
    text = json.dumps(doc, indent=1) + "\n"
    atomic_write_text(path, text, overwrite=True)
    return path


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (``q`` in [0, 1]: 0.5 the median, 0.99 the p99); NaN of nothing."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median and range of a benchmark's repetitions (rounded for the record): how every
    benchmark that repeats a measurement reports it."""
    if not values:
        raise ValueError("no repetitions to summarize")
    med = statistics.median(values)
    return {
        "reps": [round(v, 3) for v in values],
        "median": round(med, 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "range_frac": round((max(values) - min(values)) / med, 3) if med else None,
    }
