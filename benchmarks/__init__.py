"""Speed benchmarks and studies over the package and its tools, declared in
:mod:`benchmarks.registry` and run by name from the repository root (``python -m benchmarks run
vit``); results under ``benchmarks/results/``."""
