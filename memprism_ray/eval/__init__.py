"""Evaluation protocol (paper appendix C): episode lists, run manifests, statistics, reports and
trajectory viewers; the evaluation that plays the episodes is :mod:`memprism_ray.trainer.evaluate`.
Kept import-free so that ``import memprism_ray.eval.<module>`` loads only what it needs.
"""
