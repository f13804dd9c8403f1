"""Speed benchmarks and studies over the package and its tools; run as modules from the
repository root (``python -m benchmarks.speed.vit``), results under ``benchmarks/results/``."""
