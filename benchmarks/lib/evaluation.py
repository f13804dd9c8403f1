"""How the studies evaluate and convert: each through a tool in its own process (tools/test.py
for the mIoU of a checkpoint, tools/linearize.py for the swap and the attention transfer), and
the mIoU a training run recorded."""
import os.path as osp
import re
import subprocess
import sys
import time
from typing import List, Sequence

from nala_mm.analysis.measure import error_of

from .paths import REPO
from .report import read_json
from .runs import tool_env


def run_tool(tool: str, args: Sequence[str], what: str) -> str:
    """``python tools/TOOL.py ARGS`` from the repository root; its output (stdout and stderr),
    or a RuntimeError naming ``what`` with the tool's last line of stderr."""
    proc = subprocess.run([sys.executable, osp.join(REPO, 'tools', f'{tool}.py'), *args],
                          cwd=REPO, capture_output=True, text=True, env=tool_env())
    if proc.returncode != 0:
        raise RuntimeError(f'{what}: {error_of(proc)}')
    return proc.stdout + proc.stderr


# what mmdet's CocoMetric logs, in place of any metric, when a model detects nothing
DET_EMPTY = 'The testing results of the whole dataset is empty'


def test_score(config: str, checkpoint: str, work_dir: str, metric: str) -> float:
    """The ``metric`` (``'mIoU'``, ``'coco/bbox_mAP'``) tools/test.py reports for
    ``checkpoint`` under ``config``."""
    log = run_tool('test', [config, checkpoint, '--work-dir', work_dir],
                   f'testing {checkpoint}')
    found = re.findall(re.escape(metric) + r': (-?[\d.]+)', log)
    if not found and DET_EMPTY in log:  # mmdet computes no metric when nothing is detected
        return 0.0
    if not found:
        raise RuntimeError(f'testing {checkpoint}: tools/test.py reported no {metric}')
    return float(found[-1])


def test_miou(config: str, checkpoint: str, work_dir: str) -> float:
    """The mIoU tools/test.py reports for ``checkpoint`` under ``config``."""
    return test_score(config, checkpoint, work_dir, 'mIoU')


def linearize(config: str, checkpoint: str, out: str, iters: int, seed: int,
              extra: Sequence[str] = ()) -> dict:
    """tools/linearize.py: ``checkpoint`` (a softmax model) into the swapped model of
    ``config`` at ``out``, after ``iters`` iterations of attention transfer (0: the plain swap,
    the weights carried over). Its report, with the wall time of the whole call."""
    start = time.perf_counter()
    run_tool('linearize', [config, checkpoint, '--out', out, '--iters', str(iters),
                           '--cfg-options', f'randomness.seed={seed}', *extra],
             f'linearizing {checkpoint}')
    report = read_json(osp.splitext(out)[0] + '.json')
    report['wall_seconds'] = round(time.perf_counter() - start, 1)
    return report


def curve(records: List[dict], metric: str = 'mIoU') -> List[float]:
    """The ``metric`` at each evaluation of a run, in order."""
    return [r[metric] for r in records if metric in r]


def final_miou(run: dict) -> float:
    """The last mIoU a :func:`~benchmarks.lib.runs.train_config` run evaluated; its error
    raised."""
    if 'error' in run:
        raise RuntimeError(run['error'])
    return curve(run['records'])[-1]
