"""Convert the release's ``scores_all_data.pkl`` (MindAct's candidate ranks) into a safe
format the jobs read (docs/mind2web.md "Candidate pool")::

    python -m memprism_ray.benchmark.mind2web.convert_scores scores_all_data.pkl scores_all_data.parquet

The only code of the project that reads a pickle, and only on a file the user chose; even so
its unpickler resolves only plain containers and numpy's scalar and array reconstructors and
refuses any other global by name, before anything is called.
"""

from __future__ import annotations

import argparse
import hashlib
import operator
import pickle
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from memprism_ray.benchmark.mind2web.candidates import FORMATS, PICKLE_SUFFIXES, write_scores
from memprism_ray.benchmark.mind2web.data import Mind2WebDataError

#: The globals a pickle of scores and ranks may name: containers and numpy scalars/arrays, nothing
#: callable with effects (numpy 2.0 moved ``numpy.core`` to ``numpy._core``: both spellings).
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [("builtins", name) for name in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str")]
    + [("collections", "OrderedDict"), ("collections", "defaultdict"), ("numpy", "dtype"), ("numpy", "ndarray")]
    + [(f"numpy.{core}.multiarray", name) for core in ("core", "_core") for name in ("scalar", "_reconstruct")]
)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise Mind2WebDataError(
                f"the pickle names {module}.{name}, which a file of candidate scores and ranks does not need; refused "
                "(is this the release's scores_all_data.pkl?)"
            )
        return super().find_class(module, name)


def load_release_pickle(fh: BinaryIO) -> Any:
    """The release's pickle, through the restricted unpickler."""
    try:
        return _RestrictedUnpickler(fh).load()
    except Mind2WebDataError:
        raise
    except Exception as exc:  # a truncated or foreign file: one line, not a traceback
        raise Mind2WebDataError(f"cannot read the pickle: {type(exc).__name__}: {exc}") from None


def _plain(data: Any) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """``(ranks, scores)`` as plain Python, checked: ``{sample_id: {backend_node_id: ...}}``."""
    if not isinstance(data, Mapping) or not isinstance(data.get("ranks"), Mapping):
        raise Mind2WebDataError("expected a mapping with 'ranks' (and 'scores'): {sample_id: {backend_node_id: ...}}")
    scores_in = data.get("scores") or {}
    if not isinstance(scores_in, Mapping):
        raise Mind2WebDataError("'scores' must be a mapping {sample_id: {backend_node_id: score}}")
    ranks: dict[str, dict[str, int]] = {}
    scores: dict[str, dict[str, float]] = {}
    for sid, per in data["ranks"].items():
        if not isinstance(per, Mapping):
            raise Mind2WebDataError(f"ranks[{sid!r}] must be a mapping backend_node_id -> rank")
        try:
            # operator.index: numpy integers pass, floats do not (a rank is an integer).
            ranks[str(sid)] = {str(node): operator.index(rank) for node, rank in per.items()}
        except TypeError:
            raise Mind2WebDataError(f"ranks[{sid!r}] holds a rank that is not an integer") from None
        got = scores_in.get(sid) or {}
        try:
            scores[str(sid)] = {str(node): float(got[node]) for node in per if node in got}
        except (TypeError, ValueError):
            raise Mind2WebDataError(f"scores[{sid!r}] holds a score that is not a number") from None
    return ranks, scores


def convert(src: Path, out: Path) -> dict[str, Any]:
    """Read the release's pickle ``src`` (restricted) and write ``out``; a summary."""
    if out.suffix.lower() in PICKLE_SUFFIXES or out.suffix.lower() not in FORMATS:
        raise Mind2WebDataError(f"output {out}: choose a {', '.join(FORMATS)} file name")
    raw = src.read_bytes()
    import io

    ranks, scores = _plain(load_release_pickle(io.BytesIO(raw)))
    if not ranks:  # it was written, and the job refused it later for covering no step
        raise Mind2WebDataError(f"{src} ranks no step ('ranks' is empty): not the release's scores_all_data.pkl")
    n = write_scores(ranks, scores, out)
    return {"source": str(src), "source_sha256": hashlib.sha256(raw).hexdigest(), "steps": len(ranks), "ranked": n}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memprism_ray.benchmark.mind2web.convert_scores",
        description="Convert Mind2Web's scores_all_data.pkl (MindAct candidate ranks) to Parquet, JSONL or JSON. "
        "Run it only on the file from the Mind2Web release, in an environment you trust.",
    )
    parser.add_argument("src", type=Path, help="the release's scores_all_data.pkl")
    parser.add_argument("out", type=Path, help="output file: .parquet (recommended), .jsonl or .json")
    args = parser.parse_args(argv)
    try:
        got = convert(args.src, args.out)
    except (OSError, Mind2WebDataError) as exc:
        print(f"convert_scores: {exc}", file=sys.stderr)
        return 1
    print(
        f"wrote {args.out}: {got['steps']} steps, {got['ranked']} ranked candidates "
        f"(source sha256 {got['source_sha256']}); set mind2web.candidate_scores: {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
