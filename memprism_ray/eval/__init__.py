"""Evaluation protocol (paper appendix C): ordered episode lists (``episodes``), run
manifests (``manifest``), Wilson intervals and paired bootstrap (``stats``), reports.

Kept import-free so that ``import memprism_ray.eval.<module>`` loads only what it needs.
"""
