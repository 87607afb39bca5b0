"""An episode on disk (paper appendix C: each episode's event stream is kept and, for a few,
what the policy saw at every step): ``events.parquet`` (raw events included),
``steps.parquet``, ``episode.json``, ``views/step_NNN.png`` and ``trajectory.html``, a
self-contained viewer (images inline, no script, nothing fetched).
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memprism_ray.agent import EpisodeResult, rows_to_arrow
from memprism_ray.recorder import EventStream

_STYLE = (
    "body{font-family:sans-serif;max-width:1000px;margin:auto}section{border:1px solid #ccc;margin:8px 0;padding:8px}"
    "section.exception{border-color:#c33}img{max-width:100%}pre{background:#f6f6f6;padding:6px;white-space:pre-wrap}"
)


def safe_name(name: str) -> str:
    """``name`` as one path component: characters other than letters, digits, ``-_.`` become ``_``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def write_episode_artifacts(result: EpisodeResult, out_dir: str | Path) -> Path:
    """Write ``result`` under ``out_dir/<episode id>``; returns that directory."""
    import pyarrow.parquet as pq

    root = Path(out_dir) / safe_name(result.spec.episode_id)
    (root / "views").mkdir(parents=True, exist_ok=True)
    result.stream.to_parquet(root / "events.parquet")
    if result.rows:
        pq.write_table(rows_to_arrow(result.rows), root / "steps.parquet")
    summary = result.summary()
    (root / "episode.json").write_text(json.dumps(summary, indent=2))
    cards = "".join(_card(v, root / "views") for v in result.views)
    title = html.escape(result.spec.episode_id)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{title}</h1><p><b>Goal</b> {html.escape(result.goal)}</p>"
        f"<p><b>Result</b> {'success' if result.won else 'failure'} in {result.steps} steps"
        f" (status {html.escape(summary['status'])})</p>{cards}</body></html>"
    )
    (root / "trajectory.html").write_text(page, encoding="utf-8")
    return root


#: Every episode's event stream of one condition, one table (paper appendix C: each episode's
#: stream is kept): what a continued evaluation rebuilds a kept episode from (its stored bytes,
#: EB-ALFRED's final progress), so that only the failed episodes are played again.
STREAMS = "streams.parquet"


def streams_table(results: Sequence[EpisodeResult]) -> Any:
    """The streams of ``results`` as one ``pyarrow.Table``: the recorder's columns plus
    ``episode_id``; each stream's own ``meta`` in the schema metadata, by episode."""
    import pyarrow as pa

    parts = []
    for r in results:
        t = r.stream.to_arrow()
        parts.append(t.add_column(0, "episode_id", pa.array([r.spec.episode_id] * t.num_rows, pa.string())))
    metas = {r.spec.episode_id: r.stream.meta for r in results}
    table = pa.concat_tables([t.replace_schema_metadata(None) for t in parts]) if parts else pa.table({})
    return table.replace_schema_metadata({b"memprism.stream_metas": json.dumps(metas, default=str).encode()})


def read_streams(path: Path) -> dict[str, EventStream]:
    """Each episode's stream from a :func:`streams_table` file (``ValueError``/``OSError`` when
    unreadable)."""
    import pyarrow.compute as pc

    from memprism_ray.adapter.tables import read_parquet

    table = read_parquet(path)
    metas = json.loads((table.schema.metadata or {}).get(b"memprism.stream_metas", b"{}"))
    out = {}
    for episode_id, meta in metas.items():
        rows = table.filter(pc.equal(table["episode_id"], episode_id)) if table.num_rows else table
        header = {b"memprism.meta": json.dumps(meta).encode()}
        out[episode_id] = EventStream.from_arrow(rows.drop_columns(["episode_id"]).replace_schema_metadata(header))
    return out


def _card(view: dict[str, Any], views_dir: Path) -> str:
    """One step of the viewer; its PNG, if any, is also written to ``views_dir``."""
    shown = ""
    if view.get("png"):
        (views_dir / f"step_{view['step']:03d}.png").write_bytes(view["png"])
        b64 = base64.b64encode(view["png"]).decode()
        shown = f'<img alt="view at step {view["step"]}" src="data:image/png;base64,{b64}">'
    elif view.get("text"):
        shown = f"<pre>{html.escape(view['text'])}</pre>"
    outcome = html.escape(view["outcome"])
    return (
        f'<section class="step {outcome}"><h2>Step {view["step"] + 1}</h2>'
        f'<p class="obs"><b>Observation</b> {html.escape(view["observation"])}</p>'
        f'<p class="view"><b>View</b> {html.escape(str(view["view"]))}</p>{shown}'
        f'<p class="act"><b>Action</b> {html.escape(view["action"])}</p>'
        f'<p class="out"><b>Outcome</b> {outcome}: {html.escape(view["feedback"])}</p></section>'
    )
