"""The official Mind2Web release, read from a local path (paper "Benchmarks": 1,009
training tasks; test splits Cross-Task 252, Cross-Website 177, Cross-Domain 912; layout and
fields read: docs/mind2web.md "Data"). A game is one task: ``GameRef(game_id=annotation_id,
path=<split file>, task_type=domain, split)``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.envs.base import GameRef

#: Splits of the official release, training first.
SPLITS: tuple[str, ...] = ("train", "test_task", "test_website", "test_domain")
#: The three test splits (paper Table "Main results": Test-Task, Test-Website, Test-Domain).
EVAL_SPLITS: tuple[str, ...] = ("test_task", "test_website", "test_domain")
OPS: tuple[str, ...] = ("CLICK", "TYPE", "SELECT")
ENV_VAR = "MIND2WEB_DATA"

WHERE_TO_GET = (
    "get the training split from https://huggingface.co/datasets/osunlp/Mind2Web (data/train/*.json) and the "
    "test splits from the zip linked in https://github.com/OSU-NLP-Group/Mind2Web (password 'mind2web'); unpack "
    "them so that ROOT/train, ROOT/test_task, ROOT/test_website and ROOT/test_domain hold the JSON files, then set "
    f"corpus.data_root: ROOT (or ${ENV_VAR}=ROOT); see docs/mind2web.md"
)


class Mind2WebDataError(ValueError):
    """Missing or malformed Mind2Web data (one line: what, where, what is expected)."""


@dataclass(frozen=True)
class Candidate:
    """One candidate element of a page (``pos_candidates`` / ``neg_candidates`` entry)."""

    backend_node_id: str
    tag: str
    attributes: Mapping[str, str]


@dataclass(frozen=True)
class Step:
    """One recorded human step: the page before it and the action taken."""

    action_uid: str
    cleaned_html: str
    op: str
    value: str
    original_op: str
    pos: tuple[Candidate, ...]
    neg: tuple[Candidate, ...]
    repr: str = ""


@dataclass(frozen=True)
class Task:
    """One Mind2Web task with its human trajectory."""

    annotation_id: str
    confirmed_task: str
    website: str
    domain: str
    subdomain: str
    split: str
    steps: tuple[Step, ...]


def check_split(split: str, what: str = "split") -> str:
    if split not in SPLITS:
        raise Mind2WebDataError(f"{what}={split!r} is not a Mind2Web split; valid: {', '.join(SPLITS)}")
    return split


def resolve_data_root(root: str | Path | None = None) -> Path:
    """The release root: ``root``, else ``$MIND2WEB_DATA``; a clear error when neither holds data."""
    given = str(root) if root else os.environ.get(ENV_VAR, "")
    if not given:
        raise Mind2WebDataError(
            f"no Mind2Web data path: corpus.data_root and ${ENV_VAR} are both empty; {WHERE_TO_GET}"
        )
    path = Path(os.path.expandvars(given)).expanduser()
    if not path.is_dir():
        raise Mind2WebDataError(f"Mind2Web data path {path} does not exist; {WHERE_TO_GET}")
    for candidate in (path, path / "data"):
        if any((candidate / s).is_dir() for s in SPLITS):
            return candidate
    raise Mind2WebDataError(f"{path} holds none of the split folders {', '.join(SPLITS)}; {WHERE_TO_GET}")


def split_files(split: str, root: str | Path | None = None) -> list[Path]:
    """The JSON files of ``split`` in name order; an error when there are none."""
    check_split(split)
    base = resolve_data_root(root)
    files = sorted((base / split).glob("*.json"))
    if not files:
        raise Mind2WebDataError(f"no *.json files in {base / split} (split {split!r}); {WHERE_TO_GET}")
    return files


def _str(data: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise Mind2WebDataError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    return value


def _candidate(data: Any, where: str) -> Candidate:
    if not isinstance(data, Mapping):
        raise Mind2WebDataError(f"{where}: a candidate must be an object, got {type(data).__name__}")
    node = data.get("backend_node_id")
    if not isinstance(node, (str, int)) or isinstance(node, bool) or str(node) == "":
        raise Mind2WebDataError(f"{where}: candidate field 'backend_node_id' must be a non-empty string")
    attrs = data.get("attributes", "{}")
    if isinstance(attrs, str):
        try:
            attrs = json.loads(attrs) if attrs.strip() else {}
        except json.JSONDecodeError as exc:
            raise Mind2WebDataError(f"{where}: candidate 'attributes' is not JSON: {exc}") from None
    if not isinstance(attrs, Mapping):
        raise Mind2WebDataError(f"{where}: candidate 'attributes' must be a JSON object")
    clean = {str(k): str(v) for k, v in attrs.items() if v is not None}
    return Candidate(str(node), str(data.get("tag") or clean.get("tag") or "element"), clean)


def _step(data: Any, where: str) -> Step:
    if not isinstance(data, Mapping):
        raise Mind2WebDataError(f"{where}: an action must be an object, got {type(data).__name__}")
    op_data = data.get("operation")
    if not isinstance(op_data, Mapping):
        raise Mind2WebDataError(f"{where}: field 'operation' must be an object with op, original_op, value")
    op = str(op_data.get("op", "")).strip().upper()
    if op not in OPS:
        raise Mind2WebDataError(f"{where}: operation.op={op_data.get('op')!r} is not one of {', '.join(OPS)}")
    value = op_data.get("value") or ""
    if not isinstance(value, str):
        raise Mind2WebDataError(f"{where}: operation.value must be a string")
    lists = {}
    for key in ("pos_candidates", "neg_candidates"):
        items = data.get(key) or []
        if not isinstance(items, Sequence) or isinstance(items, str):
            raise Mind2WebDataError(f"{where}: field {key!r} must be a list")
        lists[key] = tuple(_candidate(c, f"{where}.{key}[{i}]") for i, c in enumerate(items))
    return Step(
        action_uid=_str(data, "action_uid", where),
        cleaned_html=_str(data, "cleaned_html", where, required=False),
        op=op,
        value=value,
        original_op=str(op_data.get("original_op") or op),
        pos=lists["pos_candidates"],
        neg=lists["neg_candidates"],
    )


def parse_task(data: Any, split: str, where: str = "task") -> Task:
    """One task object of a split file; a :class:`Mind2WebDataError` naming the bad field."""
    if not isinstance(data, Mapping):
        raise Mind2WebDataError(f"{where}: a task must be an object, got {type(data).__name__}")
    aid = _str(data, "annotation_id", where)
    where = f"{where} {aid}"
    actions = data.get("actions")
    if not isinstance(actions, Sequence) or isinstance(actions, str) or not actions:
        raise Mind2WebDataError(f"{where}: field 'actions' must be a non-empty list")
    reprs = data.get("action_reprs") or []
    steps = []
    for i, a in enumerate(actions):
        st = _step(a, f"{where}.actions[{i}]")
        if i < len(reprs) and isinstance(reprs[i], str):
            st = Step(**{**st.__dict__, "repr": reprs[i]})
        steps.append(st)
    return Task(
        annotation_id=aid,
        confirmed_task=_str(data, "confirmed_task", where),
        website=_str(data, "website", where, required=False),
        domain=_str(data, "domain", where, required=False),
        subdomain=_str(data, "subdomain", where, required=False),
        split=split,
        steps=tuple(steps),
    )


# Measured by benchmarks/bench_mind2web_load.py (a 37.5 MB split file, 16 resets of one task as
# in a GRPO group; record: benchmarks/results/bench_mind2web_load.json): with the cache an
# episode's time is mostly snapshot building. Eight files bound the memory to a few splits' worth.
@functools.lru_cache(maxsize=8)
def _load_file(path: str, mtime_ns: int, split: str) -> dict[str, Task]:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise Mind2WebDataError(f"cannot read Mind2Web file {path}: {exc}") from None
    if not isinstance(raw, list):
        raise Mind2WebDataError(f"{path}: expected a JSON list of tasks, got {type(raw).__name__}")
    tasks: dict[str, Task] = {}
    for i, item in enumerate(raw):
        t = parse_task(item, split, f"{Path(path).name}[{i}]")
        if t.annotation_id in tasks:
            raise Mind2WebDataError(f"{path}: annotation_id {t.annotation_id!r} appears twice")
        tasks[t.annotation_id] = t
    return tasks


def load_file(path: str | Path, split: str) -> dict[str, Task]:
    """The tasks of one split file by annotation id (the last few files read are cached)."""
    p = Path(path)
    try:
        mtime = p.stat().st_mtime_ns
    except OSError as exc:
        raise Mind2WebDataError(f"cannot read Mind2Web file {p}: {exc}") from None
    return _load_file(str(p), mtime, split)


def load_task(game: GameRef) -> Task:
    """The task a :class:`GameRef` names."""
    check_split(game.split, "game split")
    tasks = load_file(game.path, game.split)
    if game.game_id not in tasks:
        raise Mind2WebDataError(f"{game.path} has no task with annotation_id {game.game_id!r}")
    return tasks[game.game_id]


def list_games(split: str, root: str | Path | None = None) -> list[GameRef]:
    """One :class:`GameRef` per task of ``split``, in file then file order."""
    out = []
    for f in split_files(split, root):
        for aid, t in load_file(f, split).items():
            out.append(GameRef(aid, f, t.domain or "unknown", split))
    return out
