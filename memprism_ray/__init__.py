"""memprism-ray: task-conditioned relational memory views (MemPrism) on Ray.

Core packages (``view_space``, ``recorder``, ``router``, ``composer``, ``render``,
``adapter``, ``envs``, ``policy``, ``agent``) never import Ray; ``actors`` does.
"""

__version__ = "0.1.0"
