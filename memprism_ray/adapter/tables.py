"""Arrow helpers shared by the D1 dataset and the D2 step table (docs/architecture.md "Data
crossing an actor boundary"). Feature matrices are fixed-size list columns, so a reader knows
every row's width from the schema alone.

**The step table** (paper "Adapter", appendix A.3) is the one format of a played step: one row
per decision, written by :func:`memprism_ray.agent.rows_to_arrow` (rollouts, evaluation's
``steps.parquet``), read by :meth:`~memprism_ray.adapter.grpo_update.GRPOBatch.from_step_tables`.
The columns D2 reads:

===========================================  ================================================
``feat_obs``, ``feat_goal``                   ``fixed_size_list<float32>[384]``: Router input
``feat_window``, ``feat_stats``               ``fixed_size_list<float32>[128]`` and ``[8]``
``episode_id``                                string: the trajectory
``group_id``                                  the task group (rollout ``step_meta``)
``view_index``                                int: the chosen view, 0..143
``view_logprob``                              float: its log-prob under the rollout policy
                                              (``router.sampling.view_log_probs``)
``traj_return``, ``failed``                   float, bool: the trajectory's, on each of its steps
===========================================  ================================================

The other columns (action, outcome, tokens, latencies, ...) are for the reports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np


def fixed_list_array(matrix: np.ndarray) -> Any:
    """``[N, D]`` float32 matrix -> ``pyarrow.FixedSizeListArray`` of width ``D``."""
    import pyarrow as pa

    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"expected a 2-d matrix, got shape {matrix.shape}")
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1), pa.float32()), matrix.shape[1])


def matrix_column(table: Any, name: str, width: int) -> np.ndarray:
    """Read a fixed-size (or plain) list column back as a float32 ``[N, width]`` matrix."""
    import pyarrow as pa

    if name not in table.column_names:
        raise ValueError(f"table lacks column {name!r}; columns: {', '.join(table.column_names)}")
    col = table.column(name).combine_chunks()
    if col.null_count:
        raise ValueError(f"column {name!r} has {col.null_count} null row(s)")
    n = len(col)
    if pa.types.is_fixed_size_list(col.type):
        if col.type.list_size != width:
            raise ValueError(f"column {name!r} has width {col.type.list_size}, expected {width}")
        values = col.flatten()
    elif pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        lengths = col.value_lengths().to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(lengths != width)
        if bad.size:
            raise ValueError(f"column {name!r} row {int(bad[0])} has {int(lengths[bad[0]])} values, expected {width}")
        values = col.flatten()
    else:
        raise ValueError(f"column {name!r} must be a list column, got {col.type}")
    if values.null_count:
        raise ValueError(f"column {name!r} contains null values")
    return np.array(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(n, width)


def schema_metadata(fmt: str, version: int, meta: Mapping[str, Any]) -> dict[bytes, bytes]:
    return {
        b"memprism.format": fmt.encode(),
        b"memprism.version": str(version).encode(),
        b"memprism.meta": json.dumps(dict(meta), sort_keys=True).encode(),
    }


def check_metadata(table: Any, fmt: str, version: int) -> dict[str, Any]:
    """Check the format tag written by :func:`schema_metadata`; return the stored meta."""
    md = table.schema.metadata or {}
    found = md.get(b"memprism.format", b"").decode()
    if found != fmt:
        raise ValueError(f"table is not a {fmt} table (schema metadata memprism.format is {found or 'missing'!r})")
    got = int(md.get(b"memprism.version", b"0"))
    if got != version:
        raise ValueError(f"unsupported {fmt} version {got}; this reader handles version {version}")
    return json.loads(md.get(b"memprism.meta", b"{}"))


def read_parquet(path: Any) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(str(path))
    except FileNotFoundError:  # its message is the path alone
        raise ValueError(f"{path}: no such file") from None
    except Exception as exc:  # pyarrow raises several unrelated types for bad files
        raise ValueError(f"{path}: cannot read as Parquet ({exc})") from None
