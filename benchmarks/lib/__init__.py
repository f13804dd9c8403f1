"""What the benchmarks share: where results go, the grid of measured cases, reporting, training
runs through the tools, the studies' evaluation and presets, and provenance."""
