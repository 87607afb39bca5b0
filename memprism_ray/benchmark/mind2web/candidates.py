"""MindAct's candidate pool from the release's candidate ranks (Mind2Web,
``src/action_prediction/dataloader.py`` ``get_data_split`` and ``metric.py``
``ActionEvaluatorMultiChoice.evaluate_dataset``; docs/mind2web.md "Candidate pool").

A step's pool is the candidates ranked ``< top_k`` (50), positives and negatives alike;
:meth:`CandidateRanks.pool` is the rule's one place here. The pickle is never read here
(unpickling runs code): :mod:`memprism_ray.benchmark.mind2web.convert_scores` converts it once into
``.parquet`` (one row per ranked candidate), ``.jsonl`` (one object per step) or ``.json`` (the
pickle's mapping), told apart by suffix.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.mind2web.data import Mind2WebDataError
from memprism_ray.io_atomic import json_lines, utf8_lines

#: MindAct's cut: metric.py's ``top_k=50`` (the Mind2Web paper's "top-50 candidates").
TOP_K = 50
FORMATS: tuple[str, ...] = (".parquet", ".jsonl", ".json")
PICKLE_SUFFIXES: tuple[str, ...] = (".pkl", ".pickle")
CONVERTER = "python -m memprism_ray.benchmark.mind2web.convert_scores"
#: First bytes of a pickle of protocol 2 or newer (how the release's file starts).
_PICKLE_MAGIC = b"\x80"


def sample_id(annotation_id: str, action_uid: str) -> str:
    """The release's key of one step (dataloader.py ``get_score``)."""
    return f"{annotation_id}_{action_uid}"


def _refuse_pickle(path: str | Path) -> Mind2WebDataError:
    return Mind2WebDataError(
        f"mind2web.candidate_scores={str(path)!r} is a pickle, which this project never loads (unpickling runs code): "
        f"convert it once where you trust the file with `{CONVERTER} {path} scores_all_data.parquet` and point "
        "mind2web.candidate_scores at the .parquet (docs/mind2web.md)"
    )


def check_format(path: str | Path) -> None:
    """A one-line error unless ``path``'s suffix names a readable format."""
    suffix = Path(str(path)).suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise _refuse_pickle(path)
    if suffix not in FORMATS:
        raise Mind2WebDataError(
            f"mind2web.candidate_scores={str(path)!r}: unknown format {suffix or '(no suffix)'!r}; give a "
            f"{', '.join(FORMATS)} file made by `{CONVERTER}` from the release's scores_all_data.pkl"
        )


def resolve_scores_path(path: str | Path, data_root: str | Path | None) -> Path:
    """The candidate-scores file ``path`` names (relative: under ``data_root``), checked."""
    check_format(path)
    p = Path(str(path)).expanduser()
    if not p.is_absolute() and data_root:
        p = Path(str(data_root)) / p
    if not p.is_file():
        raise Mind2WebDataError(
            f"mind2web.candidate_scores: {p} does not exist; convert the release's scores_all_data.pkl with "
            f"`{CONVERTER}` (docs/mind2web.md)"
        )
    with p.open("rb") as fh:
        if fh.read(1) == _PICKLE_MAGIC:
            raise _refuse_pickle(p)
    return p


#: The fix of a file whose content is wrong: it was not written by the converter, or was edited.
_REGENERATE = (
    f"regenerate it from the release's scores_all_data.pkl with `{CONVERTER} scores_all_data.pkl "
    "scores_all_data.parquet` (docs/mind2web.md)"
)


def _bad(where: str, problem: str) -> Mind2WebDataError:
    """The one-line error of a malformed candidate-scores file: where (file and line, row or
    sample), what is wrong, and the fix."""
    return Mind2WebDataError(f"mind2web.candidate_scores {where}: {problem}; {_REGENERATE}")


def _rank(value: Any, where: str) -> int:
    # bool is an int subclass; a rank of True would be a conversion bug, not a rank.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(where, f"a rank must be an integer >= 0, got {value!r}")
    return value


def _node(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise _bad(where, f"a backend_node_id must be a non-empty string, got {value!r}")
    return str(value)


#: What the readers yield: ``(sample_id, backend_node_id, rank)``; ``backend_node_id`` is
#: ``None`` on the row that only says the step is ranked (its pool may be empty).
_Row = tuple[str, "str | None", int]


def _step_ranks(sid: Any, ranks: Any, where: str) -> Iterator[_Row]:
    """Every entry of one step checked (not only those within the cut): a file is whole or refused."""
    if not isinstance(sid, str) or not sid:
        raise _bad(where, f"'sample_id' must be a non-empty string, got {sid!r}")
    if not isinstance(ranks, Mapping):
        raise _bad(f"{where} (sample {sid})", "'ranks' must be an object of backend_node_id -> rank")
    yield sid, None, 0
    for node, rank in ranks.items():
        yield sid, _node(node, f"{where} (sample {sid})"), _rank(rank, f"{where} (sample {sid}, node {node})")


def _not_json(where: str, exc: json.JSONDecodeError) -> Mind2WebDataError:
    return _bad(where, f"not JSON ({exc.msg} at column {exc.colno})")


def _read_json(path: Path, top_k: int) -> Iterator[_Row]:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise Mind2WebDataError(f"cannot read candidate scores {path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise _bad(str(path), f"not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _not_json(f"{path}:{exc.lineno}", exc) from None
    if not isinstance(data, Mapping) or not isinstance(data.get("ranks"), Mapping):
        raise _bad(str(path), "expected an object with 'ranks': {sample_id: {backend_node_id: rank}}")
    for sid, ranks in data["ranks"].items():
        yield from _step_ranks(sid, ranks, str(path))


def _read_jsonl(path: Path, top_k: int) -> Iterator[_Row]:
    try:
        with path.open("rb") as fh:
            lines = utf8_lines(fh, lambda n, exc: _bad(f"{path}:{n}", f"not UTF-8 text (byte {exc.start})"))
            for n, _, row in json_lines(lines, lambda n, _, exc: _not_json(f"{path}:{n}", exc)):
                if not isinstance(row, Mapping):
                    raise _bad(f"{path}:{n}", "expected an object with 'sample_id' and 'ranks'")
                yield from _step_ranks(row.get("sample_id"), row.get("ranks"), f"{path}:{n}")
    except OSError as exc:
        raise Mind2WebDataError(f"cannot read candidate scores {path}: {exc}") from None


def _read_parquet(path: Path, top_k: int) -> Iterator[_Row]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    columns = ["sample_id", "backend_node_id", "rank"]
    try:
        pf = pq.ParquetFile(path)
    except OSError as exc:
        raise Mind2WebDataError(f"cannot read candidate scores {path}: {exc}") from None
    except pa.ArrowException as exc:  # not a Parquet file at all (a renamed pickle, a torn copy)
        raise _bad(str(path), f"not a Parquet file ({exc})") from None
    schema = pf.schema_arrow
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise _bad(str(path), f"missing column(s) {', '.join(missing)}; expected {', '.join(columns)}")
    types = {c: schema.field(c).type for c in columns}
    text = {c: pa.types.is_string(t) or pa.types.is_large_string(t) for c, t in types.items()}
    for name, ok, want in (
        ("sample_id", text["sample_id"], "strings"),
        ("backend_node_id", text["backend_node_id"] or pa.types.is_integer(types["backend_node_id"]), "strings"),
        ("rank", pa.types.is_integer(types["rank"]), "integers"),
    ):
        if not ok:
            raise _bad(str(path), f"column {name!r} must be {want}, got {types[name]}")
    # The release ranks every candidate of every step (millions of rows): every row is checked
    # column-wise, and only the rows that can enter a pool become Python objects.
    # CandidateRanks re-applies the cut; this is speed.
    offset = 0
    for batch in pf.iter_batches(columns=columns, batch_size=65_536):
        sid, node, rank = (batch.column(c) for c in columns)  # by name: a file may order them otherwise
        problems = [
            *((pc.is_null(batch.column(c)), f"column {c!r} is empty (null)") for c in columns),
            (pc.fill_null(pc.less(rank, 0), False), "a rank must be an integer >= 0"),
            (pc.fill_null(pc.equal(pc.utf8_length(sid), 0), False), "'sample_id' must be a non-empty string"),
        ]
        if text["backend_node_id"]:
            empty = pc.fill_null(pc.equal(pc.utf8_length(node), 0), False)
            problems.append((empty, "a backend_node_id must be a non-empty string"))
        for mask, problem in problems:
            at = pc.index(mask, True).as_py()
            if at >= 0:
                got = {c: batch.column(c)[at].as_py() for c in columns}
                raise _bad(f"{path} row {offset + at + 1}", f"{problem}, got {got}")
        for s in pc.unique(sid).to_pylist():
            yield s, None, 0
        kept = batch.filter(pc.less(rank, top_k))
        for s, n, r in zip(*(kept.column(c).to_pylist() for c in columns), strict=True):
            yield s, str(n), r
        offset += batch.num_rows


_READERS = {".json": _read_json, ".jsonl": _read_jsonl, ".parquet": _read_parquet}


@dataclass(frozen=True)
class CandidateRanks:
    """Per step (``sample_id``), the backend node ids ranked within ``top_k``."""

    path: str
    top_k: int
    top: Mapping[str, frozenset[str]]

    def pool(self, annotation_id: str, action_uid: str) -> frozenset[str]:
        """The candidates MindAct keeps for one step (metric.py: ``rank < top_k``); a step the
        file does not rank is an error, as upstream (``get_score`` looks every step up)."""
        sid = sample_id(annotation_id, action_uid)
        got = self.top.get(sid)
        if got is None:
            raise Mind2WebDataError(
                f"candidate scores {self.path} rank no candidate of step {sid} (task {annotation_id}): the file does "
                "not cover this step; convert the release's scores_all_data.pkl, which ranks every split"
            )
        return got

    def check_covers(self, steps: Iterable[tuple[str, str]], what: str) -> None:
        """A one-line error unless every ``(annotation_id, action_uid)`` of ``steps`` is ranked: the
        driver's check of the steps a run plays, so that no env meets an unranked step mid-run."""
        missing = [sid for aid, uid in steps if (sid := sample_id(aid, uid)) not in self.top]
        if missing:
            raise Mind2WebDataError(
                f"mind2web.candidate_scores {self.path} ranks no candidate of {len(missing)} step(s) of {what} "
                f"(e.g. step {missing[0]}): the file does not cover this data; convert the release's "
                f"scores_all_data.pkl, which ranks every split, with `{CONVERTER}` (docs/mind2web.md)"
            )


@functools.lru_cache(maxsize=2)
def _load(path: str, mtime_ns: int, top_k: int) -> CandidateRanks:
    top: dict[str, set[str]] = {}
    for sid, node, rank in _READERS[Path(path).suffix.lower()](Path(path), top_k):
        kept = top.setdefault(sid, set())
        if node is not None and rank < top_k:
            kept.add(node)
    return CandidateRanks(path, top_k, {sid: frozenset(nodes) for sid, nodes in top.items()})


def load_candidate_ranks(path: str | Path, top_k: int = TOP_K) -> CandidateRanks:
    """The ranks of a resolved candidate-scores file (cached: a worker's env slots share them)."""
    if top_k < 1:
        raise Mind2WebDataError(f"mind2web.candidate_top_k must be >= 1, got {top_k}")
    p = Path(path)
    check_format(p)
    try:
        mtime = p.stat().st_mtime_ns
    except OSError as exc:
        raise Mind2WebDataError(f"cannot read candidate scores {p}: {exc}") from None
    return _load(str(p), mtime, int(top_k))


def _write_parquet(
    ranks: Mapping[str, Mapping[str, int]], scores: Mapping[str, Mapping[str, float]], out: Path, chunk: int = 500_000
) -> None:
    """One row per ranked candidate (steps in name order, candidates by rank), in chunks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [("sample_id", pa.string()), ("backend_node_id", pa.string()), ("rank", pa.int64()), ("score", pa.float64())]
    )
    cols: list[list[Any]] = [[], [], [], []]

    def flush(writer: Any) -> None:
        writer.write_table(pa.table([pa.array(c, t) for c, t in zip(cols, schema.types, strict=True)], schema=schema))
        for c in cols:
            c.clear()

    with pq.ParquetWriter(out, schema) as writer:
        for sid in sorted(ranks):
            got = scores.get(sid, {})
            for node, rank in sorted(ranks[sid].items(), key=lambda kv: (kv[1], kv[0])):
                for c, v in zip(cols, (sid, node, rank, got.get(node)), strict=True):
                    c.append(v)
            if len(cols[0]) >= chunk:
                flush(writer)
        if cols[0] or not ranks:
            flush(writer)


def write_scores(ranks: Mapping[str, Mapping[str, int]], scores: Mapping[str, Mapping[str, float]], out: Path) -> int:
    """Write ranks and scores to ``out`` in the format its suffix names; the candidates ranked."""
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise Mind2WebDataError(f"output {out}: choose a {', '.join(FORMATS)} file name")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    n = sum(len(v) for v in ranks.values())
    if suffix == ".json":
        tmp.write_text(json.dumps({"ranks": ranks, "scores": scores}), encoding="utf-8")
    elif suffix == ".jsonl":
        with tmp.open("w", encoding="utf-8") as fh:
            for sid in sorted(ranks):
                fh.write(json.dumps({"sample_id": sid, "ranks": ranks[sid], "scores": scores.get(sid, {})}) + "\n")
    else:
        _write_parquet(ranks, scores, tmp)
    tmp.replace(out)
    return n


def pool_info(candidate_scores: str | Path | None, top_k: int, max_candidates: int) -> dict[str, Any]:
    """The candidate pool a run used, for its reports."""
    if candidate_scores:
        name = Path(str(candidate_scores)).name
        what = f"MindAct candidate pool: top {top_k} of the release's candidate ranks ({name})"
        return {"protocol": "mindact", "description": what, "top_k": int(top_k), "file": name}
    what = f"project candidate pool: positives + {max_candidates - 1} negatives"
    return {"protocol": "project", "description": what, "top_k": None, "file": None}
