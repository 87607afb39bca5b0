"""Test doubles and fixture generators, not product code (issue 36): the top layer
(``tests/test_layers.py``), nothing else in the package imports it. It lives in the package
because benchmarks, ``scripts/`` and the Ray workers they start import it too."""
