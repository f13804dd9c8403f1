"""Training studies (mixer comparisons, the swap and the attention transfer, the long-range
task): runs through tools/train.py, evaluated by :mod:`benchmarks.lib.evaluation`."""
