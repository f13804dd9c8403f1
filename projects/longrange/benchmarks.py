"""The long-range project's studies, for ``python -m benchmarks`` (benchmarks/registry.py)."""
from benchmarks.registry import Benchmark

from .study import RESULTS

BENCHMARKS = (
    Benchmark('longrange', 'projects.longrange.study', RESULTS, ('longrange',),
              'nine token mixers x three seeds on the long-range task, with attention '
              'statistics'),
    Benchmark('longrange_graded', 'projects.longrange.graded', RESULTS, ('longrange_graded',),
              'the pre-registered graded claim: ~180 runs, two at a time, resumable',
              inputs=('longrange_graded',)),
)
