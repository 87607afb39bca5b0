"""Test doubles and fixture generators, not product code (issue 36): nothing under
``memprism_ray/`` outside this package imports it (``tests/test_layers.py``: it is the top
layer). It lives in the package, not under ``tests/``, because the benchmarks, ``scripts/``
and Ray workers started by them import it too.

* :mod:`.synthetic_streams`: seeded ALFWorld-like event streams (no environment needed);
* :mod:`.fake_vllm`: a CPU stand-in for vLLM's ``AsyncLLM`` (``--engine fake`` benchmarks);
* :mod:`.dummy_qwen`: a weightless 7B-shaped Qwen2.5-VL model directory (the GPU path offline).
"""
