"""Event extractors (Phi): one rule extractor per benchmark behind one interface."""

from memprism_ray.recorder.phi.base import Extraction, Phi, record_event

__all__ = ["Extraction", "Phi", "record_event"]
