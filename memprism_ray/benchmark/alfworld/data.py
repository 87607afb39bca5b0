"""Where ALFWorld games come from: the official download or the generated corpus (issue 3, item 2).

Both use the tree ``alfworld-download`` writes
(``<root>/json_2.1.1/{train,valid_seen,valid_unseen}/<task>/<trial>/{game.tw-pddl,traj_data.json}``),
the split names of ALFWorld's ``AlfredTWEnv`` and its ``collect_game_files``' filters. The
data root is the ``data_root`` argument, else ``$ALFWORLD_DATA``, else the embedded corpus. A
root without playable games is an error saying how to fix it, never an empty list; an
unreadable trial is *broken*, never dropped silently (an evaluation counts it as failed).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from memprism_ray.benchmark.alfworld.generator import SPLIT_DIRS, TASK_TYPES
from memprism_ray.envs.base import GameRef

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = tuple(SPLIT_DIRS)
JSON_DIR = "json_2.1.1"

_FIX = (
    "point ALFWORLD_DATA (or --data-root) at an alfworld-download tree, i.e. the folder that holds "
    f"{JSON_DIR}/{{train,valid_seen,valid_unseen}}; or build one offline with "
    "`memprism games build --out DIR` and use DIR; or unset ALFWORLD_DATA to use the embedded corpus"
)


def check_split(split: str, key: str = "") -> str:
    """The folder of ``split``; a split ALFWorld does not have is an error naming the config ``key``."""
    if split not in SPLIT_DIRS:
        where = f"{key}: " if key else ""
        raise ValueError(f"{where}unknown ALFWorld split {split!r}; valid splits: {', '.join(SPLITS)}")
    return SPLIT_DIRS[split]


def resolve_data_root(data_root: str | Path | None = None) -> Path:
    """The root of an alfworld-download tree, checked."""
    if data_root is None:
        env = os.environ.get("ALFWORLD_DATA")
        if env and not _is_alfworld_placeholder(Path(os.path.expandvars(env)).expanduser()):
            return _check_root(Path(os.path.expandvars(env)).expanduser(), "ALFWORLD_DATA")
        from memprism_ray.benchmark.alfworld.corpus import ensure_default_corpus

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


def _read_json(path: str) -> tuple[dict | None, str | None]:
    """``(data, None)`` or ``(None, why it cannot be read)``."""
    name = Path(path).name
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{name} unreadable ({type(exc).__name__}: {exc})"
    except json.JSONDecodeError as exc:
        return None, f"{name} is not valid JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"{name} holds a {type(data).__name__}, not a JSON object"
    return data, None


@functools.lru_cache(maxsize=65536)
def _read_task_type(path: str, mtime_ns: int, size: int) -> tuple[str | None, str | None]:
    """``(task type, None)`` or ``(None, why the trial is broken)``."""
    del mtime_ns, size  # cache key only: an edited file is read again
    data, err = _read_json(path)
    if data is None:
        return None, err
    task = data.get("task_type")
    if not isinstance(task, str):
        return None, "traj_data.json has no task_type"
    return task, None


@functools.lru_cache(maxsize=65536)
def _read_solvable(path: str, mtime_ns: int, size: int) -> tuple[bool, str | None]:
    """``(solvable, None)`` or ``(False, why the game file is broken)``."""
    del mtime_ns, size
    data, err = _read_json(path)
    if data is None:
        return False, err
    return bool(data.get("solvable")), None


def _stat_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_mtime_ns, st.st_size


@dataclass(frozen=True)
class BrokenGame:
    """A trial of the split whose files cannot be read (an evaluation counts it as failed)."""

    game: GameRef
    reason: str


@dataclass(frozen=True)
class SplitScan:
    """A split's playable games (by ``game_id``), its broken trials and a one-line summary."""

    games: list[GameRef]
    broken: list[BrokenGame]
    summary: str


def _scan(root: Path, split: str, task_types: tuple[str, ...]) -> SplitScan:
    """Apply ``AlfredTWEnv.collect_game_files``' filters (game files are read once per
    content version: the scan of a large official tree is paid once per process)."""
    games: list[GameRef] = []
    broken: list[BrokenGame] = []
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
        game_id = trial.relative_to(root).as_posix()
        game = trial / "game.tw-pddl"
        task, err = _read_task_type(*_stat_key(trial / "traj_data.json"))
        if err is not None:
            broken.append(BrokenGame(GameRef(game_id, game, "unknown", split), err))
            continue
        if task not in task_types:
            skipped["task_type"] += 1
            continue
        if not game.exists():
            skipped["no_game_file"] += 1
            continue
        solvable, err = _read_solvable(*_stat_key(game))
        if err is not None:
            broken.append(BrokenGame(GameRef(game_id, game, task, split), err))
            continue
        if not solvable:
            skipped["unsolvable"] += 1
            continue
        games.append(GameRef(game_id, game, task, split))
    games.sort(key=lambda g: g.game_id)
    broken.sort(key=lambda b: b.game.game_id)
    reasons = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in skipped.items() if v)
    summary = f"{found} traj_data.json found" + (f", skipped: {reasons}" if reasons else "")
    if broken:
        summary += f", {len(broken)} broken"
    return SplitScan(games, broken, summary)


def scan_split(
    split: str,
    data_root: str | Path | None = None,
    task_types: tuple[str, ...] = TASK_TYPES,
) -> SplitScan:
    """The playable and the broken games of ``split``; raises when it holds neither."""
    bad = [t for t in task_types if t not in TASK_TYPES]
    if bad:
        raise ValueError(f"unknown ALFWorld task type(s) {bad}; valid: {', '.join(TASK_TYPES)}")
    root = resolve_data_root(data_root)
    folder = check_split(split)
    split_root = root / JSON_DIR / folder
    if not split_root.is_dir():
        raise ValueError(f"{root} has no {JSON_DIR}/{folder}/ folder for split {split!r}; {_FIX}")
    scan = _scan(split_root, split, tuple(task_types))
    if not scan.games and not scan.broken:
        raise ValueError(f"no playable ALFWorld games for split {split!r} under {split_root} ({scan.summary}); {_FIX}")
    return scan


def describe_broken(broken: list[BrokenGame], limit: int = 3) -> str:
    """``"3 broken game file(s), e.g. a/b: game.tw-pddl is not valid JSON (...)"``."""
    shown = "; ".join(f"{b.game.game_id}: {b.reason}" for b in broken[:limit])
    more = f"; and {len(broken) - limit} more" if len(broken) > limit else ""
    return f"{len(broken)} broken game file(s): {shown}{more}"


def list_games(
    split: str,
    data_root: str | Path | None = None,
    task_types: tuple[str, ...] = TASK_TYPES,
) -> list[GameRef]:
    """The playable games of ``split``, sorted by their stable ``game_id``; broken trials are left
    out with a warning (evaluation uses :func:`scan_split`: a broken game counts as failed)."""
    scan = scan_split(split, data_root, task_types)
    if scan.broken:
        log.warning("split %r: leaving out %s", split, describe_broken(scan.broken))
    if not scan.games:
        raise ValueError(
            f"no playable ALFWorld games for split {split!r} ({scan.summary}; {describe_broken(scan.broken)}); {_FIX}"
        )
    return scan.games


def game_ref_from_path(path: str | Path, split: str = "unknown") -> GameRef:
    """A :class:`GameRef` for a ``game.tw-pddl`` file or the trial folder holding it."""
    path = Path(path)
    game = path / "game.tw-pddl" if path.is_dir() else path
    if not game.is_file():
        raise ValueError(f"{game}: no such ALFWorld game file (expected a game.tw-pddl or its folder)")
    traj = game.parent / "traj_data.json"
    if not traj.is_file():
        raise ValueError(f"{game}: no traj_data.json beside it; ALFWorld games need both files")
    task, err = _read_task_type(*_stat_key(traj))
    if task is None:
        raise ValueError(f"{traj}: not a valid traj_data.json ({err})")
    return GameRef(f"{game.parent.parent.name}/{game.parent.name}", game, task, split)
