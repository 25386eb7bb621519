"""AITER's Triton path on gfx90a: configs derived from gfx942's by rules in data (``cdna2/data/triton-gfx90a.yaml``),
each proven by compiling it for gfx90a on the controller (``proof``), in an isolated venv holding the triton wheel
the hosts run (``toolchain``); ``python -m cdna2 triton-configs`` prints and writes the proof."""
