"""Progress bars that read well both in a terminal and in a job's log.

A bar redraws itself in place with ``\\r``. Ray's job logs (the Job API, the dashboard, the
stream ``make run`` and ``ray job submit`` print) read the driver's output as text, which turns
every ``\\r`` into a line of its own: ``make run`` printed 470 bar lines among its 734 (125 of the
corpus build, 122 of GRPO, 223 of the evaluation; measured on a fresh clone); with these bars,
9 of GRPO and 19 of the evaluation among 124 (the corpus already built), the same table.
Writing to anything but a terminal, a bar here draws itself at most every
:data:`LOG_REFRESH_S` seconds, the explicit refreshes (a new postfix, a new description)
included, besides its first and last state, and skips a draw with nothing new. A
``mininterval`` argument or ``TQDM_MININTERVAL`` (tqdm's own setting) sets that interval
instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from tqdm import tqdm

#: Seconds between two draws of a bar that writes to a log: a line every few GRPO iterations
#: (3.4-5.4 s each in ``make run`` on 2 cores) and a few per evaluated condition.
LOG_REFRESH_S = 10.0


class _LogBar(tqdm):
    """A bar whose every draw after the first waits :attr:`mininterval` since the last one, and
    that draws nothing when its count, description and postfix are what it last drew (a line
    in a log that only the elapsed time would change)."""

    def refresh(self, nolock: bool = False, lock_args: Any = None) -> bool | None:
        if self.disable:
            return super().refresh(nolock=nolock, lock_args=lock_args)
        now = self._time()
        if getattr(self, "_drawn", False) and now - self.last_print_t < self.mininterval:
            return False
        self._drawn = True
        self.last_print_t = now
        return super().refresh(nolock=nolock, lock_args=lock_args)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        shown = (self.n, self.desc, self.postfix)
        if msg is None and shown == getattr(self, "_shown", None):
            return True
        self._shown = shown
        return super().display(msg, pos)


def _is_terminal(file: TextIO) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(iterable: Iterable[Any] | None = None, file: TextIO | None = None, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, file=file, **kwargs)`` (``file`` defaults to stderr, as tqdm's), drawn in
    place on a terminal and every :data:`LOG_REFRESH_S` seconds in a log (module docstring)."""
    file = sys.stderr if file is None else file
    if _is_terminal(file):
        return tqdm(iterable, file=file, **kwargs)
    if "TQDM_MININTERVAL" not in os.environ:  # tqdm reads it as the default of mininterval
        kwargs.setdefault("mininterval", LOG_REFRESH_S)
    return _LogBar(iterable, file=file, **kwargs)
