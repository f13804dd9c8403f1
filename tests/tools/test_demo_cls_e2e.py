"""End-to-end: the classification demo learns (``make test-e2e``; about 3 minutes here).

Its committed run: benchmarks/results/studies/demo_cls.json (top-1 59.5 % at a chance of 25 %).
"""
import json

import pytest

from tests.helpers import run_tool
from tests.support.pretrain import requires_mmpretrain

pytestmark = [pytest.mark.e2e, requires_mmpretrain]


def test_classification_demo_beats_chance_clearly(tmp_path):
    run_tool('tools/demo.py', 'cls', '--work-dir', str(tmp_path), timeout=1800)
    summary = json.loads((tmp_path / 'demo_summary.json').read_text())
    assert summary['iterations'] == 800
    assert summary['metrics']['accuracy/top1'] > 45 > 1.5 * summary['chance_top1']
