"""Where the benchmarks read and write: the repository root and the committed results tree,
which mirrors ``benchmarks/``: ``results/speed/`` for the speed benchmarks, ``results/studies/``
for the studies, and ``results/tools/`` for what a tool writes with its documented results
command (``python -m benchmarks run demos``, ``python tools/get_flops.py --variants``)."""
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
RESULTS = osp.join(REPO, 'benchmarks', 'results')
SPEED_RESULTS = osp.join(RESULTS, 'speed')
STUDY_RESULTS = osp.join(RESULTS, 'studies')
TOOL_RESULTS = osp.join(RESULTS, 'tools')
