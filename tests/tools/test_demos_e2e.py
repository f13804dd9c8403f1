"""End-to-end: the two embedded demos learn (``make test-e2e``, 16-35 min on 2 cores).

Marked ``slow`` and left out of ``make test``: each trains a full demo schedule. They guard what
the README promises, and caught the detection stall that a one-iteration smoke test cannot see
(Mask R-CNN sat at the class prior, bbox mAP 0.000, while every loss stayed finite).
"""
import json
import os.path as osp

import pytest

from tests.helpers import run_tool

pytestmark = pytest.mark.e2e


def run_demo(task, work_dir):
    run_tool('tools/demo.py', task, '--work-dir', str(work_dir), timeout=1800)
    with open(osp.join(work_dir, 'demo_summary.json')) as f:
        return json.load(f)


def test_segmentation_demo_beats_the_majority_baseline_by_far(tmp_path):
    summary = run_demo('seg', tmp_path / 'seg')
    # the committed run and its majority-class baseline: benchmarks/results/studies/demo_seg.json
    assert summary['metrics']['mIoU'] > 80
    assert summary['majority_class_baseline_mIoU'] < 10


def test_detection_demo_boxes_and_masks_score_clearly_above_zero(tmp_path):
    summary = run_demo('det', tmp_path / 'det')
    metrics = summary['metrics']
    # the committed run: benchmarks/results/studies/demo_det.json; a stalled run scores 0.000
    assert metrics['coco/bbox_mAP'] > 0.2
    assert metrics['coco/segm_mAP'] > 0.18
    assert metrics['coco/bbox_mAP_50'] > 0.35
