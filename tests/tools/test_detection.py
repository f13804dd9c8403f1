"""Detection through the tools: a Mask R-CNN with compiled ops, briefly overfit on 2 images (so
its AP is far from zero and a box-format or label-mapping bug shows), tests with the AP of the
train-time validation and of its own dump evaluated with pycocotools, with and without
test-time augmentation; RetinaNet's FPN wiring (in process); mmdet's own train script."""
import pickle
import re
from types import SimpleNamespace

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from tests.helpers import REPO, coco_evaluate, run_failing_tool, run_tool, write_det_config

integration = pytest.mark.integration

EPOCHS = 12  # one iteration each: 2 images, batch 2
# Overfit: the 2 training images, unaugmented at their own 128 x 128, validated and tested on
# themselves (with their annotation file). BN keeps the latest batch's statistics (momentum 1:
# the batch is always the same images), so evaluation sees what training saw.
OVERFIT = """
pipeline = [dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
            dict(type='Resize', scale=(128, 128), keep_ratio=True),
            dict(type='PackDetInputs',
                 meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))]
training = dict(ann_file='annotations/instances_train2017.json', data_prefix=dict(img='train2017/'))
# fewer sampled anchors and RoIs than COCO's 256 / 512: faster, and learns as well here
model = dict(backbone=dict(drop_path_rate=0.0,
                           norm_cfg=dict(type='BN', requires_grad=True, momentum=1.0)),
             train_cfg=dict(rpn=dict(sampler=dict(num=64)), rcnn=dict(sampler=dict(num=128))))
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=pipeline, **training))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, pipeline=pipeline, **training))
test_dataloader = val_dataloader
# --tta: the demo's flip views, at the scale trained here
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(128, 128), keep_ratio=True)],
        [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
        [dict(type='LoadAnnotations', with_bbox=True)],
        [dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                               'scale_factor', 'flip', 'flip_direction'))]])]
val_evaluator = dict(ann_file=data_root + 'annotations/instances_train2017.json')
test_evaluator = val_evaluator
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=0.0))
param_scheduler = []
"""
# calibrated: 12 steps reach a validation bbox mAP of 0.513 (with TTA 0.509), segm mAP 0.131;
# the way there is not monotonic (0.2-0.4 after 3-9 steps), hence the margin
BBOX_MAP_FLOOR, SEGM_MAP_FLOOR = 0.2, 0.05


def coco_ap_of_dump(dump_path, ann_file, classes, iou_type='bbox') -> dict:
    """AP of the detections ``tools/test.py --out`` dumped, evaluated here with pycocotools
    (xyxy boxes to COCO's xywh, or the dumped RLE masks; labels to category ids by class name;
    mmdet's max-dets)."""
    from pycocotools.coco import COCO
    with open(dump_path, 'rb') as f:
        samples = pickle.load(f)
    gt = COCO(str(ann_file))
    cat_id = {cat['name']: cat['id'] for cat in gt.loadCats(gt.getCatIds())}
    dets = []
    for sample in samples:
        pred = sample['pred_instances']
        for i, ((x1, y1, x2, y2), score, label) in enumerate(zip(
                pred['bboxes'].tolist(), pred['scores'].tolist(), pred['labels'].tolist())):
            det = dict(image_id=sample['img_id'], category_id=cat_id[classes[label]], score=score)
            if iou_type == 'bbox':
                det['bbox'] = [x1, y1, x2 - x1, y2 - y1]
            else:
                rle = dict(pred['masks'][i])
                rle['counts'] = rle['counts'].decode()
                det['segmentation'] = rle
            dets.append(det)
    assert dets, 'nothing detected: AP would be undefined'
    evaluation = coco_evaluate(gt, dets, iou_type, [cat_id[name] for name in classes])
    return dict(mAP=evaluation.stats[0], mAP_50=evaluation.stats[1], count=len(dets),
                images=len(samples))


def printed_metrics(out):
    return {k: float(v) for k, v in re.findall(r'(coco/\w+)=([\d.]+)', out)}


@pytest.fixture(scope='module')
def overfit(tmp_path_factory, tiny_coco):
    """One training run through tools/train.py (validation after the last epoch), shared."""
    root = tmp_path_factory.mktemp('det_overfit')
    config = write_det_config(root, tiny_coco, epochs=EPOCHS, extra=OVERFIT)
    log = run_tool('tools/train.py', config, '--work-dir', root / 'work')
    ckpt = root / 'work' / f'epoch_{EPOCHS}.pth'
    assert ckpt.is_file()
    return SimpleNamespace(root=root, config=config, log=log, ckpt=ckpt,
                           ann_file=tiny_coco / 'annotations' / 'instances_train2017.json',
                           classes=list(Config.fromfile(config).metainfo['classes']))


@pytest.mark.extended
@integration
def test_mask_rcnn_test_tool_gives_the_validation_ap_and_that_of_its_dump(overfit):
    assert re.search(r'Epoch\(train\) +\[1\]\[1/1\].*loss_rpn_cls: [\d.]+.*loss_mask: [\d.]+',
                     overfit.log)
    # validation after the last epoch, on the weights saved as the checkpoint
    val = {k: float(v) for k, v in re.findall(r'(coco/\w+_mAP\w*): ([\d.]+)', overfit.log)}
    assert val['coco/bbox_mAP'] > BBOX_MAP_FLOOR and val['coco/segm_mAP'] > SEGM_MAP_FLOOR
    dump = overfit.root / 'dets.pkl'
    out = run_tool('tools/test.py', overfit.config, overfit.ckpt, '--work-dir',
                   overfit.root / 't', '--out', dump, '--show-dir', 'vis')
    metrics = printed_metrics(out)
    for key in ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50'):
        assert metrics[key] == pytest.approx(val[key], abs=1e-9), key  # same weights, data
    # mmdet reports AP rounded to 3 decimals
    for iou_type in ('bbox', 'segm'):
        own = coco_ap_of_dump(dump, overfit.ann_file, overfit.classes, iou_type)
        assert own['images'] == 2
        assert round(own['mAP'], 3) == pytest.approx(metrics[f'coco/{iou_type}_mAP'], abs=1e-9)
        assert round(own['mAP_50'], 3) == pytest.approx(metrics[f'coco/{iou_type}_mAP_50'],
                                                        abs=1e-9)
    assert len(list((overfit.root / 't').glob('*/vis/*.jpg'))) == 2


@pytest.mark.extended
@integration
def test_mask_rcnn_tta_is_refused_with_masks_and_evaluates_boxes_without(overfit):
    # test-time augmentation (flip) merges boxes only: refused while the model predicts masks
    refused = run_failing_tool('tools/test.py', overfit.config, overfit.ckpt, '--tta')
    assert 'predicts instance masks' in refused and 'model.roi_head.mask_head=None' in refused
    # ... and runs on boxes with the mask branch dropped, as the message says
    dump = overfit.root / 'tta.pkl'
    out = run_tool('tools/test.py', overfit.config, overfit.ckpt, '--tta', '--work-dir',
                   overfit.root / 'tta', '--out', dump, '--cfg-options',
                   'model.roi_head.mask_head=None', 'test_evaluator.metric=bbox')
    assert 'DetTTAModel' in out
    tta = printed_metrics(out)
    assert 'coco/segm_mAP' not in tta and tta['coco/bbox_mAP'] > BBOX_MAP_FLOOR
    own = coco_ap_of_dump(dump, overfit.ann_file, overfit.classes)
    assert own['images'] == 2 and own['count'] <= 2 * 100  # merged: max_per_img each
    assert round(own['mAP'], 3) == pytest.approx(tta['coco/bbox_mAP'], abs=1e-9)
    assert round(own['mAP_50'], 3) == pytest.approx(tta['coco/bbox_mAP_50'], abs=1e-9)


NO_TTA = """
_base_ = ['mmdet::_base_/models/retinanet_r50_fpn.py', 'mmdet::_base_/datasets/coco_detection.py',
          'mmdet::_base_/default_runtime.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)
"""


@pytest.mark.extended
@integration
def test_tta_on_a_config_without_tta_is_refused_with_what_is_missing(tmp_path):
    config = tmp_path / 'no_tta.py'
    config.write_text(NO_TTA)
    out = run_failing_tool('tools/test.py', str(config), str(tmp_path / 'never_read.pth'), '--tta')
    assert f'config {config} defines no tta_model and no tta_pipeline' in out
    assert 'nala_det_tta.py' in out and 'AttributeError' not in out


def test_retinanet_fpn_levels_match_the_anchor_strides_and_every_parameter_learns():
    """The RetinaNet config's wiring: out_indices (1, 2, 3) + FPN start_level 0 + two extra
    convs give five 256-channel levels at strides 8..128, the strides its anchors assume; and
    one loss reaches every parameter (the config reads only the stages the FPN uses, so DDP
    finds no unused parameter)."""
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    cfg = Config.fromfile(str(REPO / 'configs' / 'coco_nala_retinanet_1x.py'))
    cfg.model.backbone.init_cfg = None  # no ImageNet weights: the wiring is the same
    cfg.model.backbone.frozen_stages = -1
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    images = torch.rand(2, 3, 128, 128)
    with torch.no_grad():
        stages = model.backbone(images)
        levels = model.neck(stages)
    assert [tuple(s.shape[1:]) for s in stages] == [(128, 16, 16), (256, 8, 8), (512, 4, 4)]
    strides = [s for s, _ in model.bbox_head.prior_generator.strides]
    assert strides == [8, 16, 32, 64, 128]
    assert [tuple(f.shape[1:]) for f in levels] == [(256, 128 // s, 128 // s) for s in strides]
    assert model.bbox_head.in_channels == 256

    samples = []
    for box, label in (([10., 20., 60., 70.], 2), ([40., 8., 120., 100.], 0)):
        sample = DetDataSample(metainfo=dict(img_shape=(128, 128), pad_shape=(128, 128),
                                             batch_input_shape=(128, 128)))
        sample.gt_instances = InstanceData(bboxes=torch.tensor([box]),
                                           labels=torch.tensor([label]))
        samples.append(sample)
    loss, _ = model.parse_losses(model.loss(images, samples))
    loss.backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    without = sorted(n for n, p in model.named_parameters() if p.requires_grad and p.grad is None)
    assert trainable and not without, without
