"""Release qualification: which AITER and vLLM releases the patch sets serve, and what vLLM does with them.

Beside the product (``cdna2/``, ``operations/``, the deploy files), never inside it: these commands need real
releases (PyPI wheels, AITER's git history, through ``lab.wheelhouse`` and ``lab.aiter_git``) and a CPU torch venv
(``lab.torchvenv``) where vLLM's own code runs. Nothing in the product imports this package or ``lab``
(tests/unit/test_boundaries.py).

- ``coverage``: every patch set on every release from the floor to the newest, found by discovery.py (the
  package index, AITER's tags), the whole patch cycle on each (coverage.py);
- ``gates``: vLLM's arch gates and attention backend selection per release, stock and patched, gfx90a and gfx942,
  evaluated by vLLM's own code (gates.py, vllm_gates/runner.py);
- ``explain``: for one model and a host or release, the backend, kernels and code objects vLLM would use
  (explain.py, the same runner).
"""
