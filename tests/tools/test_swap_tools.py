"""The swap configs (configs/swap/) under both sets of tools: SegFormer-B0 with NaLa trained by
mmseg's own train.py and evaluated by this project's test.py; PVTv2-B0 RetinaNet with NaLa trained
by this project's train.py and evaluated by mmdet's test.py. The swapped model's checkpoint loads
back exactly in each."""
import re

import pytest

from tests.helpers import REPO, load_run_checkpoint, run_tool
from tests.tools.test_upstream_tools import upstream

pytestmark = pytest.mark.integration

SEG = """_base_ = ['{base}']
data_root = '{root}'
crop_size = (96, 96)
model = dict(data_preprocessor=dict(size=crop_size), backbone=dict(init_cfg=None))
train_pipeline = [
    dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(192, 96), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size), dict(type='PackSegInputs')]
test_pipeline = [
    dict(type='LoadImageFromFile'), dict(type='Resize', scale=(96, 96), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True), dict(type='PackSegInputs')]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_iters=2, val_interval=2)
param_scheduler = []
default_hooks = dict(checkpoint=dict(interval=2), logger=dict(interval=1))
"""

DET = """_base_ = ['{base}']
data_root = '{root}/'
metainfo = dict(classes=('disc', 'square', 'triangle', 'star'))
# every box kept: after one iteration no score passes the stock 0.05
model = dict(backbone=dict(init_cfg=None), bbox_head=dict(num_classes=4),
             test_cfg=dict(score_thr=0.0))
train_pipeline = [
    dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True), dict(type='PackDetInputs')]
test_pipeline = [
    dict(type='LoadImageFromFile'), dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                          'scale_factor'))]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, metainfo=metainfo,
                                     pipeline=train_pipeline))
val_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=1, val_interval=1)
param_scheduler = []
default_hooks = dict(checkpoint=dict(interval=1), logger=dict(interval=1))
"""


def _mixer_state(path) -> dict:
    state = load_run_checkpoint(path)['state_dict']
    return {k: v for k, v in state.items() if '.mixer.' in k}


@pytest.mark.extended
def test_segformer_nala_under_mmseg_train_and_the_project_test(tmp_path, tiny_ade):
    config = tmp_path / 'segformer_nala.py'
    config.write_text(SEG.format(base=REPO / 'configs/swap/ade20k_segformer_mit-b0_nala-s12.py',
                                 root=tiny_ade))
    log = run_tool(upstream('mmseg', 'train.py'), config, '--work-dir', tmp_path / 'w',
                   cwd=tmp_path)
    assert re.search(r'Iter\(train\) \[2/2\]', log)
    trained = re.search(r'Iter\(val\) \[\d+/\d+\].*mIoU: ([\d.]+)', log).group(1)
    checkpoint = tmp_path / 'w' / 'iter_2.pth'
    assert len(_mixer_state(checkpoint)) == 2 * 2 * 8  # 2 stages x 2 blocks x 8 tensors
    log = run_tool('tools/test.py', config, checkpoint, '--work-dir', tmp_path / 't')
    assert 'missing keys' not in log and 'unexpected key' not in log
    assert re.search(r'mIoU: ([\d.]+)', log.split('Iter(test)')[-1]).group(1) == trained


@pytest.mark.extended
def test_pvtv2_nala_retinanet_under_the_project_train_and_mmdet_test(tmp_path, tiny_coco):
    config = tmp_path / 'pvt_nala.py'
    config.write_text(DET.format(base=REPO / 'configs/swap/coco_pvtv2-b0_retinanet_1x_nala-s12.py',
                                 root=tiny_coco))
    log = run_tool('tools/train.py', config, '--work-dir', tmp_path / 'w')
    assert re.search(r'Epoch\(train\) \[1\]\[1/1\].*loss_cls: [\d.]+', log)
    trained = re.search(r'bbox_mAP_copypaste: ([\d. -]+)', log).group(1)
    checkpoint = tmp_path / 'w' / 'epoch_1.pth'
    assert len(_mixer_state(checkpoint)) == 2 * 2 * 8
    log = run_tool(upstream('mmdet', 'test.py'), config, checkpoint, '--work-dir',
                   tmp_path / 't', cwd=tmp_path)
    assert 'missing keys' not in log and 'unexpected key' not in log
    assert re.search(r'bbox_mAP_copypaste: ([\d. -]+)', log).group(1) == trained
