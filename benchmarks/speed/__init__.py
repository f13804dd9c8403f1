"""Speed and memory benchmarks: each runs its cases on :func:`benchmarks.lib.grid.run_grid`."""
