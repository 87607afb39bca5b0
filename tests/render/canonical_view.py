"""A process-independent form of a composed :class:`View` (sets sorted, enums by value) and
its digest, for pinning the Composer's outputs across versions (``golden_views.json``, read by
``test_render_golden.py``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any

from memprism_ray.composer.structures import View
from memprism_ray.view_space import ViewAction


# --- canonical form ----------------------------------------------------------------------
def canonical(obj: Any) -> Any:
    """A JSON-able, process-independent form of a view structure: dataclasses by type name
    and compared fields, enums by value, sets sorted."""
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, ViewAction):
        return obj.name
    if is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {"_": type(obj).__name__}
        for f in fields(obj):
            if f.compare:
                out[f.name] = canonical(getattr(obj, f.name))
        return out
    if isinstance(obj, (frozenset, set)):
        return sorted(canonical(x) for x in obj)
    if isinstance(obj, (tuple, list)):
        return [canonical(x) for x in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"canonical: unexpected {type(obj).__name__} in a view")


def view_digest(view: View) -> str:
    """SHA-256 of :func:`canonical` (equal views, equal digests, in any process)."""
    return hashlib.sha256(json.dumps(canonical(view), sort_keys=True, ensure_ascii=False).encode()).hexdigest()
