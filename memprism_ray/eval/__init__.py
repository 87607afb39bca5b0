"""Evaluation protocol (paper appendix C): ordered episode lists (``episodes``), run
manifests (``manifest``), Wilson intervals and paired bootstrap (``stats``), reports and the
files an evaluation writes (``report``), trajectory viewers (``artifacts``). The evaluation
that plays the episodes is the trainer's (:mod:`memprism_ray.trainer.evaluate`).

Kept import-free so that ``import memprism_ray.eval.<module>`` loads only what it needs.
"""
