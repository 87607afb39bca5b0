"""Where ALFWorld games come from: the official download or the generated corpus (issue 3, item 2).

Both use the tree ``alfworld-download`` writes::

    <root>/json_2.1.1/{train,valid_seen,valid_unseen}/<task folder>/<trial>/{game.tw-pddl,traj_data.json}

and the split names of ALFWorld's ``AlfredTWEnv``: ``train``, ``eval_in_distribution``
(``valid_seen``) and ``eval_out_of_distribution`` (``valid_unseen``). Games are selected
with ``AlfredTWEnv.collect_game_files``' filters: a ``traj_data.json`` beside a
``game.tw-pddl``, no ``movable``/``Sliced`` in the path, one of the six task types, and
``solvable: true`` in the game file.

The data root is, in order: the ``data_root`` argument, ``$ALFWORLD_DATA``, or the embedded
default corpus (:func:`~memprism_ray.envs.alfworld.corpus.ensure_default_corpus`, built on
first use). ``$ALFWORLD_DATA`` equal to alfworld's own default ``~/.cache/alfworld`` with no
games in it counts as unset: importing ``alfworld.info`` sets it so. A root that is missing
or holds no playable game is an error that says how to fix it, never an empty list.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

from memprism_ray.envs.alfworld.generator import SPLIT_DIRS, TASK_TYPES
from memprism_ray.envs.base import GameRef

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = tuple(SPLIT_DIRS)
JSON_DIR = "json_2.1.1"

_FIX = (
    "point ALFWORLD_DATA (or --data-root) at an alfworld-download tree, i.e. the folder that holds "
    f"{JSON_DIR}/{{train,valid_seen,valid_unseen}}; or build one offline with "
    "`memprism games build --out DIR` and use DIR; or unset ALFWORLD_DATA to use the embedded corpus"
)


def split_dir_name(split: str) -> str:
    if split not in SPLIT_DIRS:
        raise ValueError(f"unknown ALFWorld split {split!r}; valid splits: {', '.join(SPLITS)}")
    return SPLIT_DIRS[split]


def resolve_data_root(data_root: str | Path | None = None) -> Path:
    """The root of an alfworld-download tree, checked; see the module docstring."""
    if data_root is None:
        env = os.environ.get("ALFWORLD_DATA")
        if env and not _is_alfworld_placeholder(Path(os.path.expandvars(env)).expanduser()):
            return _check_root(Path(os.path.expandvars(env)).expanduser(), "ALFWORLD_DATA")
        from memprism_ray.envs.alfworld.corpus import ensure_default_corpus

        return ensure_default_corpus()
    return _check_root(Path(data_root).expanduser(), "data root")


def _is_alfworld_placeholder(root: Path) -> bool:
    """Importing ``alfworld.info`` sets ``ALFWORLD_DATA`` to ``~/.cache/alfworld`` (creating
    it) when unset; that folder without games means "not configured", not "empty data"."""
    default = Path("~/.cache/alfworld").expanduser()
    try:
        same = root.resolve() == default.resolve()
    except OSError:
        return False
    if same and not (root / JSON_DIR).exists():
        log.info("ALFWORLD_DATA=%s holds no games (alfworld's own default); using the embedded corpus", root)
        return True
    return False


def _check_root(root: Path, what: str) -> Path:
    if not root.exists():
        raise ValueError(f"{what} {root} does not exist; {_FIX}")
    if not root.is_dir():
        raise ValueError(f"{what} {root} is not a directory; {_FIX}")
    if not (root / JSON_DIR).is_dir():
        raise ValueError(f"{what} {root} has no {JSON_DIR}/ folder, so it holds no ALFWorld games; {_FIX}")
    return root


@functools.lru_cache(maxsize=65536)
def _read_task_type(path: str, mtime_ns: int, size: int) -> str | None:
    del mtime_ns, size  # cache key only: an edited file is read again
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    task = data.get("task_type") if isinstance(data, dict) else None
    return task if isinstance(task, str) else None


@functools.lru_cache(maxsize=65536)
def _read_solvable(path: str, mtime_ns: int, size: int) -> bool:
    del mtime_ns, size
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and bool(data.get("solvable"))


def _stat_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_mtime_ns, st.st_size


def _task_type(traj_path: Path) -> str | None:
    return _read_task_type(*_stat_key(traj_path))


def _scan(root: Path, split: str, task_types: tuple[str, ...]) -> tuple[list[GameRef], str]:
    """Apply ``AlfredTWEnv.collect_game_files``' filters (game files are read once per
    content version: the scan of a large official tree is paid once per process)."""
    games: list[GameRef] = []
    skipped = {"movable_or_sliced": 0, "task_type": 0, "no_game_file": 0, "unsolvable": 0}
    found = 0
    for dirpath, _dirs, files in os.walk(root):
        if "traj_data.json" not in files:
            continue
        found += 1
        trial = Path(dirpath)
        if "movable" in dirpath or "Sliced" in dirpath:
            skipped["movable_or_sliced"] += 1
            continue
        task = _task_type(trial / "traj_data.json")
        if task not in task_types:
            skipped["task_type"] += 1
            continue
        game = trial / "game.tw-pddl"
        if not game.exists():
            skipped["no_game_file"] += 1
            continue
        if not _read_solvable(*_stat_key(game)):
            skipped["unsolvable"] += 1
            continue
        games.append(GameRef(trial.relative_to(root).as_posix(), game, task, split))
    games.sort(key=lambda g: g.game_id)
    reasons = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in skipped.items() if v)
    summary = f"{found} traj_data.json found" + (f", skipped: {reasons}" if reasons else "")
    return games, summary


def list_games(
    split: str,
    data_root: str | Path | None = None,
    task_types: tuple[str, ...] = TASK_TYPES,
) -> list[GameRef]:
    """The playable games of ``split``, sorted by their stable ``game_id``."""
    bad = [t for t in task_types if t not in TASK_TYPES]
    if bad:
        raise ValueError(f"unknown ALFWorld task type(s) {bad}; valid: {', '.join(TASK_TYPES)}")
    root = resolve_data_root(data_root)
    split_root = root / JSON_DIR / split_dir_name(split)
    if not split_root.is_dir():
        raise ValueError(f"{root} has no {JSON_DIR}/{split_dir_name(split)}/ folder for split {split!r}; {_FIX}")
    games, summary = _scan(split_root, split, tuple(task_types))
    if not games:
        raise ValueError(f"no playable ALFWorld games for split {split!r} under {split_root} ({summary}); {_FIX}")
    return games


def game_ref_from_path(path: str | Path, split: str = "unknown") -> GameRef:
    """A :class:`GameRef` for a ``game.tw-pddl`` file or the trial folder holding it."""
    path = Path(path)
    game = path / "game.tw-pddl" if path.is_dir() else path
    if not game.is_file():
        raise ValueError(f"{game}: no such ALFWorld game file (expected a game.tw-pddl or its folder)")
    traj = game.parent / "traj_data.json"
    if not traj.is_file():
        raise ValueError(f"{game}: no traj_data.json beside it; ALFWorld games need both files")
    task = _task_type(traj)
    if task is None:
        raise ValueError(f"{traj}: not a valid traj_data.json (no task_type)")
    return GameRef(f"{game.parent.parent.name}/{game.parent.name}", game, task, split)
