"""COCO detection: configs build, a real Mask R-CNN iteration with compiled ops, AP, errors."""
import glob
import json
import os
import os.path as osp
import pickle
import re
import subprocess

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

from nala_mm.datasets.synthetic_coco import generate_coco_like
from nala_mm.runtime import load_config
from tests.test_segmentation import PYTHON, REPO, run_tool

DET_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', '**', 'coco_*.py'), recursive=True))


@pytest.mark.parametrize('path', DET_CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_every_detection_config_builds_its_model(path):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports['imports'] == ['nala_mm', 'nala_mm.compat']
    init_default_scope(cfg.default_scope)
    from mmdet.registry import MODELS
    model = MODELS.build(cfg.model)
    dims = model.backbone.embed_dims
    assert list(cfg.model.neck.in_channels) == [dims[i] for i in model.backbone.out_indices]


def test_detection_recipes():
    one = Config.fromfile(osp.join(REPO, 'configs', 'coco_nala_mask-rcnn_1x.py'))
    three = Config.fromfile(osp.join(REPO, 'configs', 'coco_nala_mask-rcnn_3x.py'))
    assert one.train_cfg.max_epochs == 12 and one.param_scheduler[1].milestones == [8, 11]
    assert one.optim_wrapper.optimizer.lr == 1e-4 and one.optim_wrapper.optimizer.weight_decay == 0.05
    assert three.train_cfg.max_epochs == 36 and three.param_scheduler[1].milestones == [27, 33]
    scales = three.train_dataloader.dataset.pipeline[2].scales
    assert min(s[1] for s in scales) == 480 and max(s[1] for s in scales) == 800
    linear = Config.fromfile(osp.join(REPO, 'configs', 'coco_nala-t-linear_mask-rcnn_1x.py'))
    assert [(m['type'], m['kernel']) for m in linear.model.backbone.mixers] == [
        ('NormAwareLinearAttention', 'relu')] * 4


TINY_DET = """
_base_ = ['{base}']
data_root = '{root}/'
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(checkpoint=dict(interval=1), logger=dict(interval=1))
"""


@pytest.fixture(scope='module')
def tiny_coco(tmp_path_factory):
    root = tmp_path_factory.mktemp('coco')
    generate_coco_like(str(root), num_train=2, num_val=2, image_size=(128, 128), progress=False)
    return root


def write_tiny_det_config(directory, root):
    path = directory / 'tiny_det.py'
    path.write_text(TINY_DET.format(
        base=osp.join(REPO, 'configs', 'demo', 'coco_demo_nala_mask-rcnn.py'), root=root))
    return str(path)


def coco_ap_of_dump(dump_path, ann_file, classes) -> dict:
    """bbox AP of the detections ``tools/test.py --out`` dumped, evaluated here with pycocotools
    (xyxy boxes to COCO's xywh, labels to category ids by class name; mmdet's max-dets)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    with open(dump_path, 'rb') as f:
        samples = pickle.load(f)
    gt = COCO(str(ann_file))
    cat_id = {cat['name']: cat['id'] for cat in gt.loadCats(gt.getCatIds())}
    dets = []
    for sample in samples:
        pred = sample['pred_instances']
        for (x1, y1, x2, y2), score, label in zip(pred['bboxes'].tolist(),
                                                  pred['scores'].tolist(),
                                                  pred['labels'].tolist()):
            dets.append(dict(image_id=sample['img_id'], category_id=cat_id[classes[label]],
                             bbox=[x1, y1, x2 - x1, y2 - y1], score=score))
    assert dets, 'nothing detected: AP would be undefined'
    evaluation = COCOeval(gt, gt.loadRes(dets), 'bbox')
    evaluation.params.catIds = [cat_id[name] for name in classes]
    evaluation.params.maxDets = [100, 300, 1000]
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    return dict(mAP=evaluation.stats[0], mAP_50=evaluation.stats[1], count=len(dets),
                images=len(samples))


def printed_metrics(out):
    return {k: float(v) for k, v in re.findall(r'(coco/\w+)=([\d.]+)', out)}


def test_mask_rcnn_trains_and_evaluates_ap_with_compiled_ops(tmp_path, tiny_coco):
    config = write_tiny_det_config(tmp_path, tiny_coco)
    work = tmp_path / 'work'
    log = run_tool('tools/train.py', config, '--work-dir', str(work))
    assert re.search(r'Epoch\(train\) \[1\]\[1/1\].*loss_rpn_cls: [\d.]+.*loss_mask: [\d.]+', log)
    # validation after the epoch, on the weights saved as epoch_1.pth
    val_map = float(re.search(r'coco/bbox_mAP: ([\d.]+)', log).group(1))
    assert 'coco/segm_mAP' in log
    ckpt = work / 'epoch_1.pth'
    out = run_tool('tools/test.py', config, str(ckpt), '--work-dir', str(tmp_path / 't'),
                   '--out', str(tmp_path / 'dets.pkl'), '--show-dir', 'vis')
    metrics = printed_metrics(out)
    assert {'coco/bbox_mAP', 'coco/segm_mAP', 'coco/bbox_mAP_50'} <= set(metrics)
    assert metrics['coco/bbox_mAP'] == pytest.approx(val_map, abs=1e-9)  # same weights, data
    classes = list(Config.fromfile(config).metainfo['classes'])
    ann_file = tiny_coco / 'annotations' / 'instances_val2017.json'
    own = coco_ap_of_dump(tmp_path / 'dets.pkl', ann_file, classes)
    assert own['images'] == 2
    # mmdet prints AP rounded to 3 decimals
    assert round(own['mAP'], 3) == pytest.approx(metrics['coco/bbox_mAP'], abs=1e-9)
    assert round(own['mAP_50'], 3) == pytest.approx(metrics['coco/bbox_mAP_50'], abs=1e-9)

    # test-time augmentation (flip) merges boxes only: refused while the model predicts masks
    refused = run_failing_tool('tools/test.py', config, str(ckpt), '--tta')
    assert 'predicts instance masks' in refused and 'model.roi_head.mask_head=None' in refused
    # ... and runs on boxes with the mask branch dropped, as the message says
    out = run_tool('tools/test.py', config, str(ckpt), '--tta', '--work-dir', str(tmp_path / 'tta'),
                   '--out', str(tmp_path / 'tta.pkl'), '--cfg-options',
                   'model.roi_head.mask_head=None', 'test_evaluator.metric=bbox')
    assert 'DetTTAModel' in out
    tta = printed_metrics(out)
    assert 'coco/bbox_mAP' in tta and 'coco/segm_mAP' not in tta
    own_tta = coco_ap_of_dump(tmp_path / 'tta.pkl', ann_file, classes)
    assert own_tta['images'] == 2 and own_tta['count'] <= 2 * 100  # merged: max_per_img each
    assert round(own_tta['mAP'], 3) == pytest.approx(tta['coco/bbox_mAP'], abs=1e-9)
    assert round(own_tta['mAP_50'], 3) == pytest.approx(tta['coco/bbox_mAP_50'], abs=1e-9)


def run_failing_tool(*args):
    proc = subprocess.run([PYTHON, *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS='ignore'))
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc.stdout + proc.stderr


NO_TTA = """
_base_ = ['mmdet::_base_/models/retinanet_r50_fpn.py', 'mmdet::_base_/datasets/coco_detection.py',
          'mmdet::_base_/default_runtime.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)
"""


def test_tta_on_a_config_without_tta_is_refused_with_what_is_missing(tmp_path):
    config = tmp_path / 'no_tta.py'
    config.write_text(NO_TTA)
    out = run_failing_tool('tools/test.py', str(config), str(tmp_path / 'never_read.pth'), '--tta')
    assert f'config {config} defines no tta_model and no tta_pipeline' in out
    assert 'nala_det_tta.py' in out and 'AttributeError' not in out


def test_detection_configs_carry_a_flip_tta():
    for name in ('coco_nala_mask-rcnn_1x.py', 'coco_nala_retinanet_1x.py'):
        cfg = Config.fromfile(osp.join(REPO, 'configs', name))
        assert cfg.tta_model.type == 'DetTTAModel'
        flips = cfg.tta_pipeline[1].transforms[1]
        assert sorted(t['prob'] for t in flips) == [0.0, 1.0], name
    demo = Config.fromfile(osp.join(REPO, 'configs', 'demo', 'coco_demo_nala_mask-rcnn.py'))
    assert demo.tta_pipeline[1].transforms[0][0].scale == demo.image_scale


def test_config_runs_under_mmdets_own_train_script(tmp_path, tiny_coco):
    """Nothing of tools/train.py is needed: mmdet's packaged train script runs the config."""
    import mmdet
    script = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')
    log = run_tool(script, write_tiny_det_config(tmp_path, tiny_coco), '--work-dir',
                   str(tmp_path / 'upstream'), cwd=str(tmp_path))
    assert re.search(r'Epoch\(train\) \[1\]\[1/1\].*loss_mask: [\d.]+', log)
    assert (tmp_path / 'upstream' / 'epoch_1.pth').is_file()


TINY_RETINANET = """
_base_ = ['{base}']
data_root = '{root}/'
metainfo = dict(classes=('disc', 'square', 'triangle', 'star'))
# after one iteration no score passes the default 0.05; keep all so AP is actually computed;
# no ImageNet weights here: from scratch, as the missing-checkpoint error says
model = dict(backbone=dict(init_cfg=None, frozen_stages=-1, norm_eval=False),
             bbox_head=dict(num_classes=4), test_cfg=dict(score_thr=0.0))
pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True),
            dict(type='Resize', scale=(128, 128), keep_ratio=True), dict(type='PackDetInputs')]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=pipeline))
val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(checkpoint=dict(interval=1), logger=dict(interval=1))
"""


def test_retinanet_config_trains_and_evaluates(tmp_path, tiny_coco):
    # out_indices (1, 2, 3) + FPN start_level 0 + extra convs: the wiring a build test cannot see
    config = tmp_path / 'tiny_retinanet.py'
    config.write_text(TINY_RETINANET.format(
        base=osp.join(REPO, 'configs', 'coco_nala_retinanet_1x.py'), root=tiny_coco))
    log = run_tool('tools/train.py', str(config), '--work-dir', str(tmp_path / 'work'))
    loss = re.search(r'Epoch\(train\) \[1\]\[1/1\].*loss_cls: ([\d.]+)  loss_bbox: ([\d.]+)', log)
    assert loss and all(0 < float(v) < 10 for v in loss.groups())
    assert re.search(r'coco/bbox_mAP: [\d.]+', log)


def test_missing_annotation_file_is_named(tmp_path):
    cfg = load_config(write_tiny_det_config(tmp_path, tmp_path / 'nowhere'))
    init_default_scope('mmdet')
    from mmdet.registry import DATASETS
    with pytest.raises(FileNotFoundError, match=r'nowhere/annotations/instances_train2017\.json '
                                                r'does not exist.*make demo-det'):
        DATASETS.build(cfg.train_dataloader.dataset)


IMAGE = '{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}'
DISC = '{"id": 1, "name": "disc"}'


def coco_json(annotations, images=IMAGE):
    return f'{{"images": [{images}], "categories": [{DISC}], "annotations": [{annotations}]}}'


@pytest.mark.parametrize('content, match', [
    ('{"images": [', 'is not valid JSON'),
    ('[]', 'must hold a COCO dict'),
    ('{"annotations": [], "categories": []}', r"missing \['images'\]"),
    ('{"images": [], "categories": [], "annotations": []}', "'images' list is empty"),
    (coco_json('{"id": 7, "image_id": 1, "category_id": 1, "bbox": [1, 2]}'),
     "annotation id=7 needs a 4-number 'bbox'"),
    (coco_json('{"id": 7, "image_id": 1, "bbox": [1, 2, 3, 4], "area": 12}'),
     r"annotation id=7 needs \['category_id'\]"),
    (coco_json('{"id": 7, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4]}'),
     "annotation id=7 needs 'area'"),
])
def test_malformed_annotation_file_says_what_is_wrong(tmp_path, content, match):
    root = tmp_path / 'coco'
    (root / 'annotations').mkdir(parents=True)
    (root / 'annotations' / 'instances_train2017.json').write_text(content)
    cfg = load_config(write_tiny_det_config(tmp_path, root))
    init_default_scope('mmdet')
    from mmdet.registry import DATASETS
    with pytest.raises(ValueError, match=match) as err:
        DATASETS.build(cfg.train_dataloader.dataset)
    assert 'instances_train2017.json' in str(err.value)


@pytest.mark.parametrize('content, instances', [
    # COCO test-dev image-info files have no annotations at all
    ('{"images": [%s], "categories": [%s]}' % (IMAGE, DISC), 0),
    # an ignored annotation needs no box (mmdet skips it); one outside every listed image
    # is never parsed; a box outside the image needs no area (mmdet drops it first)
    (coco_json('{"id": 7, "image_id": 1, "category_id": 1, "ignore": true}, '
               '{"id": 8, "image_id": 99, "category_id": 1}, '
               '{"id": 9, "image_id": 1, "category_id": 1, "bbox": [100, 100, 5, 5]}, '
               '{"id": 10, "image_id": 1, "category_id": 1, "bbox": [1, 2, 30, 20], '
               '"area": 600}'), 1),
])
def test_valid_annotation_files_without_boxes_load(tmp_path, content, instances):
    root = tmp_path / 'coco'
    (root / 'annotations').mkdir(parents=True)
    (root / 'annotations' / 'instances_val2017.json').write_text(content)
    cfg = load_config(write_tiny_det_config(tmp_path, root))
    init_default_scope('mmdet')
    from mmdet.registry import DATASETS
    dataset = DATASETS.build(dict(cfg.val_dataloader.dataset, test_mode=True))
    assert len(dataset) == 1
    assert len(dataset.get_data_info(0)['instances']) == instances


def test_annotation_file_behind_a_remote_file_backend_is_not_rejected(tmp_path, tiny_coco):
    """ann_file on another mmengine file backend (nalatest://, a stand-in for s3://): read
    through the backend, not tested with os.path."""
    from tests._remote_backend import remote
    cfg = load_config(write_tiny_det_config(tmp_path, remote(tiny_coco)))
    init_default_scope('mmdet')
    from mmdet.registry import DATASETS
    dataset = DATASETS.build(cfg.val_dataloader.dataset)
    assert dataset.ann_file.startswith('nalatest://')
    assert len(dataset) == 2


def test_synthetic_annotations_pass_the_checks(tiny_coco):
    with open(tiny_coco / 'annotations' / 'instances_val2017.json') as f:
        content = json.load(f)
    assert len(content['images']) == 2 and content['annotations']
