"""Segmentation through the tools, on a checkpoint briefly overfit on 4 images (so its scores are
far from zero and a wrong mapping shows): training lowers the loss; tools/test.py gives the
train-time validation mIoU, and the mIoU of the label maps it writes; tools/infer.py writes the
same label maps; training resumes from the checkpoint; mmseg's own train script runs the
config."""
import glob
import os
import os.path as osp
import re
from types import SimpleNamespace

import numpy as np
import pytest
from mmengine.config import Config
from PIL import Image

from nala_mm.datasets.synthetic_ade import ADE_CLASS_NAMES
from tests.helpers import logged_scalars, run_tool, write_seg_config

pytestmark = pytest.mark.integration

ITERS = 15
# Overfit: the 4 training images in every batch, unaugmented at their own 96 x 96, validated and
# tested on themselves one by one (as tools/infer.py predicts). BN keeps the latest batch's
# statistics (momentum 1: the batch is always the same images), so evaluation sees what training
# saw rather than a running average still far from it after 15 steps.
OVERFIT = """
size = (96, 96)
pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=size, keep_ratio=True),
            dict(type='LoadAnnotations', reduce_zero_label=True), dict(type='PackSegInputs')]
training = dict(img_path='images/training', seg_map_path='annotations/training')
bn = dict(type='BN', requires_grad=True, momentum=1.0)
model = dict(data_preprocessor=dict(size=size), backbone=dict(drop_path_rate=0.0, norm_cfg=bn),
             decode_head=dict(norm_cfg=bn), auxiliary_head=dict(norm_cfg=bn))
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, data_prefix=training, pipeline=pipeline))
val_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, data_prefix=training, pipeline=pipeline))
test_dataloader = val_dataloader
optim_wrapper = dict(optimizer=dict(lr=1e-2, weight_decay=0.0))
param_scheduler = []
"""
# calibrated: 15 steps reach a validation mIoU of 54 (loss 2.46 -> 0.93); chance is about 10
MIOU_FLOOR = 35.0


def miou_from_label_maps(pred_dir, gt_dir, classes) -> float:
    """mIoU (%) of the label maps ``tools/test.py --out`` wrote, against the ADE20K-convention
    ground truth, computed here with numpy alone.

    Ground truth: 0 is unlabelled (ignored), value v is ADE class v - 1 (reduce_zero_label);
    the config's class subset keeps its order and every other ADE class is ignored. The
    written maps hold class + 1 (mmseg re-adds the reduced zero label). Per class, IoU is
    intersection over union summed over all images, on labelled pixels only; the mean runs
    over the classes present in ground truth or prediction.
    """
    lookup = np.full(256, 255, dtype=np.int64)
    for value, name in enumerate(ADE_CLASS_NAMES, start=1):
        if name in classes:
            lookup[value] = classes.index(name)
    num = len(classes)
    intersection, union = np.zeros(num), np.zeros(num)
    names = sorted(os.listdir(pred_dir))
    assert names
    for name in names:
        pred = np.asarray(Image.open(osp.join(pred_dir, name)), dtype=np.int64) - 1
        gt = lookup[np.asarray(Image.open(osp.join(gt_dir, name)), dtype=np.int64)]
        assert pred.shape == gt.shape and pred.min() >= 0 and pred.max() < num
        valid = gt != 255
        pred, gt = pred[valid], gt[valid]
        for c in range(num):
            intersection[c] += np.sum((pred == c) & (gt == c))
            union[c] += np.sum((pred == c) | (gt == c))
    present = union > 0
    return float(np.mean(intersection[present] / union[present]) * 100)


@pytest.fixture(scope='module')
def overfit(tmp_path_factory, tiny_ade):
    """One training run through tools/train.py (validation after the last step), shared."""
    root = tmp_path_factory.mktemp('seg_overfit')
    config = write_seg_config(root, tiny_ade, iters=ITERS, extra=OVERFIT)
    log = run_tool('tools/train.py', config, '--work-dir', root / 'work')
    ckpt = root / 'work' / f'iter_{ITERS}.pth'
    assert ckpt.is_file()
    return SimpleNamespace(root=root, config=config, log=log, ckpt=ckpt, data=tiny_ade)


@pytest.fixture(scope='module')
def tested(overfit):
    """tools/test.py on the overfit checkpoint, writing label maps and overlays."""
    root = overfit.root
    out = run_tool('tools/test.py', overfit.config, overfit.ckpt, '--work-dir', root / 'test',
                   '--show-dir', root / 'overlays', '--out', root / 'preds')
    return SimpleNamespace(out=out, preds=root / 'preds', overlays=root / 'overlays')


def test_training_lowers_the_loss_on_its_fixed_batch(overfit):
    """The batch is the same 4 unaugmented images every step: the loss must fall, by far."""
    losses = {it: record['loss'] for it, record in logged_scalars(overfit.root / 'work').items()}
    assert sorted(losses) == list(range(1, ITERS + 1))
    assert losses[ITERS] < 0.5 * losses[1]


def test_test_tool_gives_the_validation_miou_and_that_of_its_label_maps(overfit, tested):
    val_miou = float(re.search(r'Iter\(val\) \[4/4\].*mIoU: ([\d.]+)', overfit.log).group(1))
    assert val_miou > MIOU_FLOOR
    miou = float(re.search(r'metrics: aAcc=[\d.]+, mIoU=([\d.]+)', tested.out).group(1))
    # same checkpoint and data as the train-time validation: the same number
    assert miou == pytest.approx(val_miou, abs=1e-6)
    # and the number the written label maps give against the ground truth (mmseg rounds to 2)
    own = miou_from_label_maps(tested.preds, overfit.data / 'annotations' / 'training',
                               list(Config.fromfile(overfit.config).metainfo['classes']))
    assert own == pytest.approx(miou, abs=0.0051)
    assert len(os.listdir(tested.preds)) == 4
    assert len(glob.glob(str(tested.overlays / '**' / '*.png'), recursive=True)) == 4


def test_infer_tool_writes_the_test_tools_label_maps(overfit, tested, tmp_path):
    """tools/infer.py (mmseg's inferencer) predicts what tools/test.py predicts, pixel for
    pixel; it writes class indices, test.py class + 1 (the reduced zero label re-added)."""
    run_tool('tools/infer.py', overfit.config, overfit.ckpt,
             overfit.data / 'images' / 'training', '--out-dir', tmp_path)
    assert len(os.listdir(tmp_path / 'vis')) == 4
    # the inferencer numbers its outputs in the order it listed the folder: match by content
    inferred = sorted(np.asarray(Image.open(p)).astype(np.int64).tobytes()
                      for p in glob.glob(str(tmp_path / 'pred' / '*.png')))
    tested_maps = [np.asarray(Image.open(p)).astype(np.int64) - 1
                   for p in glob.glob(str(tested.preds / '*.png'))]
    assert len(inferred) == len(tested_maps) == 4
    assert all(m.shape == (96, 96) for m in tested_maps)
    assert len({m.tobytes() for m in tested_maps}) == 4  # four different maps to match
    assert inferred == sorted(m.tobytes() for m in tested_maps)


@pytest.mark.extended
def test_training_resumes_from_a_named_checkpoint(overfit, tmp_path):
    longer = write_seg_config(tmp_path, overfit.data, iters=ITERS + 1, extra=OVERFIT)
    log = run_tool('tools/train.py', longer, '--work-dir', tmp_path / 'work', '--resume',
                   overfit.ckpt)
    assert f'resumed epoch: 0, iter: {ITERS}' in log
    assert re.search(rf'Iter\(train\) \[{ITERS + 1}/{ITERS + 1}\]', log)
    assert not re.search(rf'Iter\(train\) \[ ?1/{ITERS + 1}\]', log)


