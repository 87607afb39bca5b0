"""Build the Phi a config asks for (docs/phi.md): the same choice in a PhiWorker, in a rollout
worker that extracts locally (``rollout.phi_workers: 0``) and in an evaluation worker.

No ray here: a Ray actor calls these functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.phi.base import Extraction, Phi, record_extraction
from memprism_ray.recorder.phi.config import PhiConfig
from memprism_ray.recorder.phi.llm_client import CompleteMany
from memprism_ray.recorder.stream import EventStream

#: The rule Phi of each benchmark (appendix D.2 "Benchmark-specific Phi adapters"), imported
#: only when built.
RULE_PHIS = {
    "alfworld": "memprism_ray.recorder.phi.alfworld:AlfworldPhi",
    "ebalfred": "memprism_ray.recorder.phi.ebalfred:EbAlfredPhi",
    "mind2web": "memprism_ray.recorder.phi.mind2web:Mind2WebPhi",
}


def make_rule_phi(benchmark: str) -> Phi:
    """The rule Phi of ``benchmark``."""
    import importlib

    if benchmark not in RULE_PHIS:
        raise ValueError(f"no rule Phi for benchmark {benchmark!r}; known: {', '.join(sorted(RULE_PHIS))}")
    module, _, cls = RULE_PHIS[benchmark].partition(":")
    return getattr(importlib.import_module(module), cls)()


def build_phi(benchmark: str, cfg: PhiConfig | None = None, *, complete: CompleteMany | None = None) -> Any:
    """The rule Phi of ``benchmark`` (``phi.kind: rules``, or no config), or an
    :class:`~memprism_ray.recorder.phi.llm.LLMPhi` over it (``phi.kind: llm``) whose backend is
    ``complete`` when given, else the endpoint of ``cfg``."""
    rule = make_rule_phi(benchmark)
    if cfg is None or cfg.kind == "rules":
        return rule
    from memprism_ray.recorder.phi.llm import LLMPhi
    from memprism_ray.recorder.phi.llm_client import endpoint_complete

    backend = complete if complete is not None else endpoint_complete(cfg)
    if benchmark == "ebalfred":
        # Appendix D.2 "EB-ALFRED": stage 1 semantic (LLM over the stage-1 rules), stage 2
        # grounding on the post-action frame. The policy pool completes text only, so with
        # phi.llm_source: pool the grounding stage is left out (the Phi's name says so).
        from memprism_ray.recorder.phi.ebalfred import EbAlfredPhi, EbAlfredRulePhi, GroundingStage

        stage1 = LLMPhi(benchmark, backend, EbAlfredRulePhi())
        grounding = GroundingStage(backend) if cfg.llm_source == "endpoint" else None
        return EbAlfredPhi(stage1, grounding)
    return LLMPhi(benchmark, backend, rule)


def make_phi(cfg: Any, *, complete: CompleteMany | None = None) -> Any:
    """:func:`build_phi` for an ``ExperimentConfig`` (``corpus.benchmark`` and ``phi``)."""
    return build_phi(cfg.corpus.benchmark, getattr(cfg, "phi", None), complete=complete)


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
    """Record each episode's raw events into a fresh stream with ``phi``; step ``t`` of every
    episode is extracted as one batch (:func:`extract_each`), so an LLM Phi has the whole step in
    flight at once while each stream still sees its own latest state. A failed extraction raises
    (naming the episode and step): nothing is recorded half-way silently."""
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
    "Raw events are never replaced by model summaries"), stream metadata kept; e.g. expert
    streams recorded by the rule Phi, re-recorded by an LLM Phi so D1 data and rollouts share
    one Phi."""
    return record_lockstep([s.raws for s in streams], phi, [s.meta for s in streams])
