"""COCO detection: configs build, a real Mask R-CNN iteration with compiled ops, AP, errors."""
import glob
import json
import os.path as osp
import re

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

from nala_mm.datasets.synthetic_coco import generate_coco_like
from nala_mm.runtime import load_config
from tests.test_segmentation import REPO, run_tool

DET_CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs', '**', 'coco_*.py'), recursive=True))


@pytest.mark.parametrize('path', DET_CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_every_detection_config_builds_its_model(path):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports['imports'] == ['nala_mm']
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
    assert tuple(linear.model.backbone.attn_types) == ('nala',) * 4


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


def test_mask_rcnn_trains_and_evaluates_ap_with_compiled_ops(tmp_path, tiny_coco):
    config = write_tiny_det_config(tmp_path, tiny_coco)
    work = tmp_path / 'work'
    log = run_tool('tools/train.py', config, '--work-dir', str(work))
    assert re.search(r'Epoch\(train\) \[1\]\[1/1\].*loss_rpn_cls: [\d.]+.*loss_mask: [\d.]+', log)
    assert 'coco/bbox_mAP' in log and 'coco/segm_mAP' in log
    ckpt = work / 'epoch_1.pth'
    out = run_tool('tools/test.py', config, str(ckpt), '--work-dir', str(tmp_path / 't'),
                   '--out', str(tmp_path / 'dets.pkl'), '--show-dir', 'vis')
    metrics = dict(re.findall(r'(coco/(?:bbox|segm)_mAP)=([\d.]+)', out))
    assert set(metrics) == {'coco/bbox_mAP', 'coco/segm_mAP'}
    assert all(0 <= float(v) <= 1 for v in metrics.values())
    assert (tmp_path / 'dets.pkl').is_file()


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
# after one iteration no score passes the default 0.05; keep all so AP is actually computed
model = dict(bbox_head=dict(num_classes=4), test_cfg=dict(score_thr=0.0))
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


@pytest.mark.parametrize('content, match', [
    ('{"images": [', 'is not valid JSON'),
    ('[]', 'must hold a COCO dict'),
    ('{"images": [], "categories": []}', r"missing \['annotations'\]"),
    ('{"images": [], "categories": [], "annotations": [{"id": 7, "image_id": 1, "bbox": [1, 2]}]}',
     'annotation id=7 needs'),
])
def test_malformed_annotation_file_says_what_is_wrong(tmp_path, tiny_coco, content, match):
    root = tmp_path / 'coco'
    (root / 'annotations').mkdir(parents=True)
    (root / 'annotations' / 'instances_train2017.json').write_text(content)
    cfg = load_config(write_tiny_det_config(tmp_path, root))
    init_default_scope('mmdet')
    from mmdet.registry import DATASETS
    with pytest.raises(ValueError, match=match) as err:
        DATASETS.build(cfg.train_dataloader.dataset)
    assert 'instances_train2017.json' in str(err.value)


def test_synthetic_annotations_pass_the_checks(tiny_coco):
    with open(tiny_coco / 'annotations' / 'instances_val2017.json') as f:
        content = json.load(f)
    assert len(content['images']) == 2 and content['annotations']
