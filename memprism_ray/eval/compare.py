"""What ``memprism compare`` pairs between two evaluations of one condition (paper appendix C
"Common controlled protocol": paired comparisons on the same ordered items).

An evaluation's condition directory holds one 0/1 outcome per item for each measure its
benchmark reports (:meth:`memprism_ray.benchmark.base.Benchmark.compared`): task success per
episode for every benchmark, and for Mind2Web the paper's step accuracy per recorded step
first. Two evaluations are compared measure by measure on the items both hold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

#: The columns of an evaluation's episodes.parquet that a comparison reads (eval/report.py);
#: ``split`` (the split, or EB-ALFRED's subset) where the table has it.
OUTCOME_COLUMNS = ("episode_id", "won", "status")
SPLIT = "split"


@dataclass(frozen=True)
class Outcomes:
    """One measure of one evaluation: a 0/1 outcome per item."""

    measure: str  # its key in ``memprism compare``'s JSON line: "success", "step_accuracy"
    label: str  # as printed: "SR", "step accuracy"
    noun: str  # what an item is, plural: "episodes", "steps"
    items: dict[str, bool]
    splits: Mapping[str, str] = field(default_factory=dict)  # item -> its split (the paper reports each)

    @property
    def rate(self) -> float:
        return sum(self.items.values()) / len(self.items) if self.items else 0.0

    def of_split(self, name: str) -> Outcomes:
        """This measure on the items of split ``name`` alone."""
        return replace(self, items={k: v for k, v in self.items.items() if self.splits.get(k, "") == name})


def split_pairs(a: Outcomes, b: Outcomes) -> list[tuple[str, Outcomes, Outcomes]]:
    """``(split, A's, B's)`` for each split the items of either come from, by name; none when
    they all come from one split (or none is recorded)."""
    names = sorted({o.splits.get(k, "") for o in (a, b) for k in o.items})
    return [(n, a.of_split(n), b.of_split(n)) for n in names] if len(names) > 1 else []


def episode_outcomes(episodes: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    """Task success per episode id; a failed episode is a failure, as in every report's SR."""
    return {str(e["episode_id"]): bool(e["won"]) and e["status"] != "failed" for e in episodes}


def episode_splits(episodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each episode id's split (none where the table has no split column)."""
    return {str(e["episode_id"]): str(e[SPLIT]) for e in episodes if e.get(SPLIT) is not None}


def read_table(path: Path, columns: Sequence[str], optional: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The rows of the Parquet file ``path`` (``columns``, and the ``optional`` ones it has); a
    ``ValueError`` naming the file and what is missing."""
    from memprism_ray.adapter.tables import read_parquet

    table = read_parquet(path)  # a missing or unreadable file named in one line
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(missing)}: not an evaluation's {path.stem}")
    return table.select([*columns, *(c for c in optional if c in table.column_names)]).to_pylist()


def read_episodes(condition_dir: Path, columns: Sequence[str] = OUTCOME_COLUMNS) -> list[dict[str, Any]]:
    return read_table(condition_dir / "episodes.parquet", columns, optional=(SPLIT,))


def success(condition_dir: Path) -> list[Outcomes]:
    """Task success per episode (every benchmark's measure)."""
    episodes = read_episodes(condition_dir)
    return [Outcomes("success", "SR", "episodes", episode_outcomes(episodes), episode_splits(episodes))]


def benchmark_of(condition_dir: Path) -> str | None:
    """The benchmark ``manifest.json`` names (``None`` without a manifest: a table alone)."""
    path = condition_dir / "manifest.json"
    if not path.is_file():
        return None
    try:
        return str(json.loads(path.read_text())["benchmark"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not an evaluation's manifest ({type(exc).__name__}: {exc})") from None
