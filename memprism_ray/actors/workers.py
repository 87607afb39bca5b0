"""The stage actors: environments, Phi extractors, view composer/renderers and task-policy
replicas (DESIGN.md "Distributed rollout"). Each is a thin shell around a core object; the
algorithms live in the core packages.

Results are plain dataclasses (``Observation``, ``Transition``, ``Extraction``,
``RenderedView`` with PNG bytes, ``PolicyOutput``). A call covers a whole batch so the
per-call overhead is paid once per decision step, not per trajectory.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray

from memprism_ray.actors import waits
from memprism_ray.agent import each_request
from memprism_ray.envs.base import GameRef, Observation, Transition
from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.phi.base import Extraction
from memprism_ray.views import DeltaViewRequest, RenderedView

#: Ray's inline-argument limit: larger payloads go through the object store by reference.
INLINE_LIMIT = 100 * 1024
#: Bound on fetching one such payload (milliseconds when the store is healthy).
FETCH_TIMEOUT_S = 300.0


@ray.remote(max_restarts=3, max_task_retries=0)
class EnvWorker:
    """Many ALFWorld game slots in one process (fractional CPUs). After a restart the
    slots are empty; the trajectories that were running there are reported failed."""

    def __init__(self, num_slots: int) -> None:
        from memprism_ray.envs.alfworld import AlfworldEnv

        self.env = AlfworldEnv(num_slots=num_slots)
        self._crash_after: int | None = None

    def inject_crash(self, after_steps: int) -> None:
        """Fault injection for tests and drills: the process exits abruptly (as on an OOM
        kill or a lost node) during the ``after_steps``-th later ``step`` call."""
        self._crash_after = after_steps

    def reset(self, requests: Sequence[tuple[int, dict[str, Any]]]) -> list[Observation | BaseException]:
        return each_request(lambda r: self.env.reset(GameRef.from_dict(r[1]), slot=r[0]), requests)

    def step(self, requests: Sequence[tuple[int, str]]) -> list[Transition | BaseException]:
        if self._crash_after is not None:
            self._crash_after -= 1
            if self._crash_after <= 0:
                import os

                os._exit(1)
        return each_request(lambda r: self.env.step(r[1], slot=r[0]), requests)

    def pid(self) -> int:
        import os

        return os.getpid()


@ray.remote(max_restarts=3, max_task_retries=1)
class PhiWorker:
    """Runs a rule Phi over a batch of raw events (stateless, so retries are safe)."""

    def __init__(self, benchmark: str = "alfworld") -> None:
        if benchmark != "alfworld":
            raise ValueError(f"no rule Phi for benchmark {benchmark!r} yet")
        from memprism_ray.recorder.phi.alfworld import AlfworldPhi

        self.phi = AlfworldPhi()

    def extract(self, raws: Sequence[RawEvent], states: Sequence[dict[str, str]]) -> list[Extraction | BaseException]:
        return each_request(lambda p: self.phi.extract(p[0], p[1]), list(zip(raws, states)))


@ray.remote(max_restarts=3, max_task_retries=1)
class ViewWorker:
    """Compose + render from stream deltas: the worker keeps a replica of each stream it is
    sent (``views.StreamReplicas``) and receives only the records appended since, with a
    content-addressed cache: identical views of a group (same stream content, action, goal
    and settings) are drawn once. Images travel as PNG."""

    def __init__(self, render_config: Any = None, cache_size: int = 2048) -> None:
        from memprism_ray.views import ViewService

        self.service = ViewService(render_config, cache_size=cache_size, encode_png=True)

    def render_deltas(self, requests: Sequence[DeltaViewRequest]) -> list[RenderedView | BaseException]:
        return self.service.render_deltas(requests)

    def stats(self) -> dict[str, int]:
        replicas = self.service.replicas
        return {**self.service.stats(), "replicas": len(replicas), "resyncs": replicas.resyncs}


@dataclass(frozen=True)
class PolicyRequest:
    """A policy input whose view image travels as PNG bytes, or as an object reference
    when the PNG is over the inline limit."""

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


@ray.remote(max_restarts=3, max_task_retries=0)
class PolicyReplica:
    """One replica of the frozen task policy (any backend of ``make_policy``)."""

    def __init__(self, policy_config: Any) -> None:
        from memprism_ray.policy.factory import make_policy

        self.policy = make_policy(policy_config)

    def act(self, requests: Sequence[PolicyRequest]) -> list[PolicyOutput]:
        return list(self.policy.act([from_request(r) for r in requests]))

    def needs_view_text(self) -> bool:
        return bool(getattr(self.policy, "needs_view_text", False))
