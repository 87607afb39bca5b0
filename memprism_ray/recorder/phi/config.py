"""Which Phi the actors build (paper "Recorder"; appendix D.2 "Benchmark-specific Phi adapters";
docs/phi.md): ``rules`` (the default, CPU) or ``llm`` (:class:`~memprism_ray.recorder.phi.llm.LLMPhi`,
the rules kept for the hard evidence and as the fallback).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from memprism_ray.config_tree import field
from memprism_ray.llm_client import EndpointConfig

PHI_KINDS = ("rules", "llm")
LLM_SOURCES = ("endpoint", "pool")


@dataclass
class PhiConfig(EndpointConfig):
    """The event extractor Phi of every actor that records events."""

    SECTION: ClassVar[str] = "phi"

    model: str = field("", help="llm Phi: served model name sent in each request (required for kind llm)")
    timeout_s: float = field(60.0, help="llm Phi: per-request timeout in seconds")
    max_retries: int = field(
        2,
        help="llm Phi: retries after a timeout, connection error, HTTP 408/409/429/5xx or a body that is no completion",
    )
    kind: str = field("rules", help="'rules' (the benchmark's rule extractor) or 'llm' (paper prompt + rule fallback)")
    llm_source: str = field(
        "endpoint", help="llm Phi: 'endpoint' (base_url) or 'pool' (the policy pool's vLLM replicas; text only)"
    )
    max_tokens: int = field(512, help="llm Phi: completion token limit per event")
    temperature: float = field(0.0, help="llm Phi: sampling temperature")
    concurrency: int = field(16, help="llm Phi: requests in flight per extractor (one batch is sent concurrently)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind not in PHI_KINDS:
            raise ValueError(f"phi.kind must be one of {', '.join(PHI_KINDS)}, got {self.kind!r}")
        if self.llm_source not in LLM_SOURCES:
            raise ValueError(f"phi.llm_source must be one of {', '.join(LLM_SOURCES)}, got {self.llm_source!r}")
        if self.max_tokens < 1:
            raise ValueError(f"phi.max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature < math.inf:
            raise ValueError(f"phi.temperature must be a finite number >= 0, got {self.temperature}")
        if self.concurrency < 1:
            raise ValueError(f"phi.concurrency must be >= 1, got {self.concurrency}")
        if self.kind == "llm" and self.llm_source == "endpoint" and not self.model:
            raise ValueError("phi.kind=llm needs phi.model: the model name the endpoint at phi.base_url serves")
