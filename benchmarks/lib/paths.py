"""Where the benchmarks read and write: the repository root and the committed results folder."""
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
RESULTS = osp.join(REPO, 'benchmarks', 'results')
