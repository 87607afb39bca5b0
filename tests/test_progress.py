"""A progress bar in a log draws itself every LOG_REFRESH_S seconds, explicit refreshes included;
on a terminal it draws in place as tqdm does."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tqdm.std

from memprism_ray.progress import LOG_REFRESH_S, progress_bar


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def install_clock() -> Clock:
    """A clock every bar made from now on reads as ``self._time`` (for the subprocess)."""
    tqdm.std.time = c = Clock()
    return c


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(tqdm.std, "time", c)  # what a bar reads as ``self._time``
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)  # the interval asked of progress_bar
    return c


def _play(out: io.StringIO, clock: Clock, **kwargs: object) -> list[str]:
    """100 steps of half a second, each with a new postfix and description (as the GRPO and
    evaluation bars do); the bar's draws, one per ``\\r``."""
    bar = progress_bar(file=out, total=100, desc="x", **kwargs)
    for i in range(100):
        clock.t += 0.5
        bar.update(1)
        bar.set_postfix(step=i)
        bar.set_description(f"x {i}")
        bar.refresh()
    bar.close()
    return [d for d in out.getvalue().split("\r") if d.strip()]


def test_a_bar_in_a_log_draws_every_interval_and_its_first_and_last_state(clock: Clock) -> None:
    draws = _play(io.StringIO(), clock)
    # 50 s of steps: the first draw, one every 10 s, and the closing one.
    assert LOG_REFRESH_S == 10.0
    assert len(draws) == 7, draws
    assert "0/100" in draws[0] and "100/100" in draws[-1] and "step=99" in draws[-1]
    assert ["20/100" in draws[1], "40/100" in draws[2]] == [True, True]


def test_a_bar_on_a_terminal_draws_at_every_refresh(clock: Clock) -> None:
    assert len(_play(Terminal(), clock)) > 300


def test_the_interval_follows_the_argument(clock: Clock) -> None:
    assert len(_play(io.StringIO(), clock, mininterval=25.0)) == 4  # first, 25 s, 50 s, closing


def test_the_interval_follows_tqdms_own_setting() -> None:
    """``TQDM_MININTERVAL`` is read when tqdm is imported: a process of its own."""
    script = "import io, sys, test_progress as t; print(len(t._play(io.StringIO(), t.install_clock())))"
    env = {**os.environ, "TQDM_MININTERVAL": "25", "PYTHONPATH": str(Path(__file__).parent)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "4", done.stderr


def test_a_disabled_bar_draws_nothing(clock: Clock) -> None:
    assert _play(io.StringIO(), clock, disable=True) == []


def test_a_bar_with_nothing_new_draws_nothing_more(clock: Clock) -> None:
    """A bar refreshed while it waits (the evaluation's does) draws a new count once, then
    nothing until something changes, its close included."""
    out = io.StringIO()
    bar = progress_bar(file=out, total=10, desc="x")
    bar.update(1)  # too soon after the first draw: shown at the next one
    for _ in range(60):
        clock.t += 0.5
        bar.refresh()
    bar.close()
    draws = [d for d in out.getvalue().split("\r") if d.strip()]
    assert len(draws) == 2 and "0/10" in draws[0] and "1/10" in draws[1], draws


def test_a_bar_over_an_iterable_in_a_log_draws_every_interval(clock: Clock) -> None:
    """The expert and roll-in bars wrap their games: iterating draws as updating does."""
    out = io.StringIO()
    seen = []
    for game in progress_bar(range(100), file=out, desc="expert"):
        clock.t += 0.5
        seen.append(game)
    draws = [d for d in out.getvalue().split("\r") if d.strip()]
    assert seen == list(range(100))
    # 50 s of games: the first draw, at 10, 20, 30 and 40 s, and the closing one at 50 s.
    assert [d.split("|")[2].split()[0] for d in draws] == ["0/100", "20/100", "40/100", "60/100", "80/100", "100/100"]
