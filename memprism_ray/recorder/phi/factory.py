"""Build the Phi a config asks for (docs/phi.md), the same way in every worker, for the benchmark
whose :class:`~memprism_ray.recorder.phi.spec.PhiSpec` the caller gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.phi.base import Extraction, Phi, record_extraction
from memprism_ray.recorder.phi.config import PhiConfig
from memprism_ray.recorder.phi.llm_client import CompleteMany
from memprism_ray.recorder.phi.spec import PhiSpec
from memprism_ray.recorder.stream import EventStream


def build_phi(spec: PhiSpec, cfg: PhiConfig | None = None, *, complete: CompleteMany | None = None) -> Any:
    """The benchmark's Phi (``spec``: :meth:`memprism_ray.benchmark.Benchmark.phi_spec`): its rule
    Phi (``phi.kind: rules``, or no config), or an LLM Phi over it (``phi.kind: llm``) whose
    backend is ``complete`` when given, else the endpoint of ``cfg``."""
    if cfg is None or cfg.kind == "rules":
        return spec.rule()
    from memprism_ray.recorder.phi.llm import LLMPhi
    from memprism_ray.recorder.phi.llm_client import PhiEndpoint

    backend = complete if complete is not None else PhiEndpoint(cfg)
    if spec.llm is not None:
        return spec.llm(spec, backend, cfg)
    return LLMPhi(spec, backend, spec.rule())


def phi_id(cfg: Any) -> str:
    """How a run's records name its Phi: ``rule:<benchmark>`` or ``llm:<model>+rule:<benchmark>``."""
    phi = getattr(cfg, "phi", None)
    rule = f"rule:{cfg.corpus.benchmark}"
    if phi is None or phi.kind == "rules":
        return rule
    served = "pool" if phi.llm_source == "pool" else phi.model
    return f"llm:{served}+{rule}"


def extract_each(
    phi: Phi, raws: Sequence[RawEvent], states: Sequence[dict[str, str]]
) -> list[Extraction | BaseException]:
    """One result per event, in order, a failure as its value: the batched ``extract_many`` of an
    LLM Phi (all prompts of the batch in flight at once), else ``extract`` per event."""
    many = getattr(phi, "extract_many", None)
    if callable(many):
        out = list(many(raws, states))
        if len(out) != len(raws):
            raise RuntimeError(f"{phi.name} returned {len(out)} extraction(s) for {len(raws)} event(s)")
        return out
    results: list[Extraction | BaseException] = []
    for raw, state in zip(raws, states, strict=True):
        try:
            results.append(phi.extract(raw, state))
        except Exception as exc:
            results.append(exc)
    return results


def phi_stats(phi: Any) -> dict[str, Any]:
    """What a Phi reports: its kind and, for an LLM Phi, its counters (fallbacks by reason, tokens)."""
    stats = getattr(phi, "stats", None)
    return {"phi": getattr(phi, "name", type(phi).__name__), **(stats() if callable(stats) else {})}


def record_lockstep(
    episodes: Sequence[Sequence[RawEvent]], phi: Phi, metas: Sequence[Mapping[str, Any]] | None = None
) -> list[EventStream]:
    """Record each episode's raw events into a fresh stream with ``phi``, step ``t`` of every episode
    as one batch (an LLM Phi has the whole step in flight); a failed extraction raises."""
    metas = metas if metas is not None else [{} for _ in episodes]
    if len(metas) != len(episodes):
        raise ValueError(f"record_lockstep got {len(episodes)} episodes and {len(metas)} stream metas")
    streams = [EventStream(m) for m in metas]
    for t in range(max((len(e) for e in episodes), default=0)):
        live = [i for i, e in enumerate(episodes) if t < len(e)]
        raws = [episodes[i][t] for i in live]
        outs = extract_each(phi, raws, [streams[i].state for i in live])
        for i, raw, ex in zip(live, raws, outs, strict=True):
            if isinstance(ex, BaseException):
                raise RuntimeError(f"{phi.name} failed on episode {i} step {t + 1}: {type(ex).__name__}: {ex}") from ex
            record_extraction(streams[i], raw, ex)
    return streams


def rerecord(streams: Sequence[EventStream], phi: Phi) -> list[EventStream]:
    """The same trajectories re-extracted by ``phi`` from their kept raw events (appendix D.1:
    "Raw events are never replaced by model summaries"), so D1 data and rollouts share one Phi."""
    return record_lockstep([s.raws for s in streams], phi, [s.meta for s in streams])
