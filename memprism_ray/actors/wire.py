"""What crosses an actor boundary on the policy path (docs/architecture.md "Data crossing an
actor boundary"): a policy input whose view image travels as PNG bytes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from typing import Any

import ray

from memprism_ray.cluster import waits
from memprism_ray.policy.base import PolicyInput

#: Ray's inline-argument limit: larger payloads go through the object store by reference.
INLINE_LIMIT = 100 * 1024
#: Bound on fetching one such payload (milliseconds when the store is healthy).
FETCH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class PolicyRequest:
    """A policy input whose view image travels as PNG bytes, or over the inline limit as a ref."""

    input: PolicyInput
    png: bytes | None = None
    png_ref: Any = None


def to_request(inp: PolicyInput) -> PolicyRequest:
    if inp.view_image is None:
        return PolicyRequest(inp)
    buf = io.BytesIO()
    inp.view_image.save(buf, format="PNG", compress_level=1)
    data = buf.getvalue()
    bare = replace(inp, view_image=None)
    if len(data) > INLINE_LIMIT:
        return PolicyRequest(bare, png_ref=ray.put(data))
    return PolicyRequest(bare, png=data)


def from_request(req: PolicyRequest) -> PolicyInput:
    data = req.png
    if req.png_ref is not None:
        data = waits.get(req.png_ref, FETCH_TIMEOUT_S, "a policy request's view PNG from the object store")
    if data is None:
        return req.input
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        image = im.copy()
    return replace(req.input, view_image=image)
