"""The data checks the tools run (before the Runner is built, and around the run): missing or
malformed data is named with what is expected; valid data (unlabelled images, test-dev files,
remote backends) passes them and loads unchanged. mmseg's and mmdet's dataset classes are not
touched: building a dataset directly gives their own errors."""
import copy
import importlib
import json
import os
import os.path as osp
import re

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

from nala_mm.apis.config_loading import load_config
from nala_mm.datasets.checks import check_data, explained_data_errors
from nala_mm.datasets.synthetic_ade import generate_ade_like
from tests.helpers import DEMO_DET_CFG, DEMO_SEG_CFG


@pytest.fixture(scope='module')
def demo_cfgs():
    """The demo configs, parsed once (``mmseg::``/``mmdet::`` inheritance is slow)."""
    return dict(seg=load_config(DEMO_SEG_CFG), det=load_config(DEMO_DET_CFG))


def seg_dataset(demo_cfgs, root) -> dict:
    """The seg demo's training dataset config on ``root``."""
    return dict(copy.deepcopy(demo_cfgs['seg'].train_dataloader.dataset), data_root=str(root))


def det_dataset(demo_cfgs, root, split='train') -> dict:
    """The det demo's ``split`` dataset config on ``root`` (its ann_file is relative to it)."""
    loader = demo_cfgs['det'][f'{split}_dataloader']
    return dict(copy.deepcopy(loader.dataset), data_root=f'{root}/')


def run_config(scope, dataset, loader='train_dataloader') -> Config:
    """A config whose ``loader`` reads ``dataset``, as a tool checks it."""
    return Config({'default_scope': scope, loader: dict(dataset=dataset)})


def checked(scope, dataset):
    """``dataset`` checked as the tools do, then built (and loaded) as the Runner does."""
    cfg = run_config(scope, dataset)
    check_data(cfg, ['train_dataloader'])
    init_default_scope(scope)
    with explained_data_errors(cfg, ['train_dataloader']):
        return importlib.import_module(f'{scope}.registry').DATASETS.build(dataset)


def test_missing_data_root_says_where_and_how(tmp_path, demo_cfgs):
    with pytest.raises(FileNotFoundError, match=r'nowhere/images/training does not exist.*'
                                                r'ADEChallengeData2016\.zip.*make demo'):
        checked('mmseg', seg_dataset(demo_cfgs, tmp_path / 'nowhere'))


def test_wrapped_datasets_are_checked_and_unused_loaders_not(tmp_path, demo_cfgs, tiny_ade):
    """Inside dataset wrappers too; a loader the run does not build is not read."""
    missing = seg_dataset(demo_cfgs, tmp_path / 'nowhere')
    wrapped = dict(type='ConcatDataset', datasets=[seg_dataset(demo_cfgs, tiny_ade),
                                                   dict(type='RepeatDataset', times=2,
                                                        dataset=missing)])
    with pytest.raises(FileNotFoundError, match=r'nowhere/images/training does not exist'):
        check_data(run_config('mmseg', wrapped), ['train_dataloader'])
    check_data(run_config('mmseg', missing, 'test_dataloader'), ['train_dataloader'])


def test_the_upstream_classes_are_untouched(tmp_path, demo_cfgs):
    """Built directly, a dataset on a missing folder fails with mmseg's own error."""
    init_default_scope('mmseg')
    from mmseg.registry import DATASETS
    with pytest.raises(FileNotFoundError) as err:
        DATASETS.build(seg_dataset(demo_cfgs, tmp_path / 'nowhere'))
    assert 'make demo' not in str(err.value)


def test_other_seg_datasets_get_generic_help_without_ade20k(tmp_path):
    root = tmp_path / 'cityscapes'
    with pytest.raises(FileNotFoundError) as err:
        checked('mmseg', dict(type='CityscapesDataset', data_root=str(root),
                              data_prefix=dict(img_path='leftImg8bit/train',
                                               seg_map_path='gtFine/train'), pipeline=[]))
    message = str(err.value)
    assert 'ADE' not in message and 'make demo' not in message
    assert f'image folder {root}/leftImg8bit/train does not exist' in message
    assert f"data_root='{root}'" in message and '--cfg-options' in message


def test_annotation_folder_needed_only_when_the_pipeline_loads_it(tmp_path, tiny_ade):
    """Unlabelled images for inference are valid data: no annotation folder required."""
    root = tmp_path / 'unlabelled'
    root.mkdir()
    os.symlink(tiny_ade / 'images', root / 'images')
    images_only = dict(type='ADE20KDataset', data_root=str(root),
                       data_prefix=dict(img_path='images/validation',
                                        seg_map_path='annotations/validation'),
                       pipeline=[dict(type='LoadImageFromFile'), dict(type='PackSegInputs')])
    assert len(checked('mmseg', images_only)) == 2
    with pytest.raises(FileNotFoundError, match=r'annotation folder .*unlabelled/annotations/'
                                                r'validation does not exist.*ADEChallengeData'):
        checked('mmseg', dict(images_only, pipeline=[
            dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', reduce_zero_label=True),
            dict(type='PackSegInputs')]))


def test_data_behind_a_remote_file_backend_is_not_rejected(tiny_ade, demo_cfgs):
    """A data_root on another mmengine file backend (here a nalatest:// stand-in for s3://) is
    not checked against the local file system: the loader lists it through the backend."""
    from tests.support.remote_backend import remote
    dataset = checked('mmseg', seg_dataset(demo_cfgs, remote(tiny_ade)))
    assert len(dataset) == 4
    assert dataset.get_data_info(0)['img_path'].startswith(remote(tiny_ade / 'images'))


def test_unreadable_image_is_named(tmp_path, demo_cfgs):
    root = tmp_path / 'ADEChallengeData2016'
    generate_ade_like(str(root), num_train=2, num_val=1, image_size=(64, 64), progress=False)
    dataset = checked('mmseg', seg_dataset(demo_cfgs, root))
    broken = dataset.get_data_info(0)['img_path']
    with open(broken, 'wb') as f:
        f.write(b'this is not a jpeg')
    with pytest.raises(Exception, match=re.escape(osp.basename(broken))):
        dataset[0]


def test_missing_annotation_file_is_named(tmp_path, demo_cfgs):
    with pytest.raises(FileNotFoundError, match=r'nowhere/annotations/instances_train2017\.json '
                                                r'does not exist.*make demo-det'):
        checked('mmdet', det_dataset(demo_cfgs, tmp_path / 'nowhere'))


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
def test_malformed_annotation_file_says_what_is_wrong(tmp_path, demo_cfgs, content, match):
    root = tmp_path / 'coco'
    (root / 'annotations').mkdir(parents=True)
    (root / 'annotations' / 'instances_train2017.json').write_text(content)
    with pytest.raises(ValueError, match=match) as err:
        checked('mmdet', det_dataset(demo_cfgs, root))
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
def test_valid_annotation_files_without_boxes_load(tmp_path, demo_cfgs, content, instances):
    root = tmp_path / 'coco'
    (root / 'annotations').mkdir(parents=True)
    (root / 'annotations' / 'instances_val2017.json').write_text(content)
    dataset = checked('mmdet', dict(det_dataset(demo_cfgs, root, 'val'), test_mode=True))
    assert len(dataset) == 1
    assert len(dataset.get_data_info(0)['instances']) == instances


def test_annotation_file_behind_a_remote_file_backend_is_not_rejected(tiny_coco, demo_cfgs):
    """ann_file on another mmengine file backend (nalatest://, a stand-in for s3://): read
    through the backend, not tested with os.path."""
    from tests.support.remote_backend import remote
    dataset = checked('mmdet', det_dataset(demo_cfgs, remote(tiny_coco), 'val'))
    assert dataset.ann_file.startswith('nalatest://')
    assert len(dataset) == 2


def test_synthetic_annotations_pass_the_checks(tiny_coco):
    with open(tiny_coco / 'annotations' / 'instances_val2017.json') as f:
        content = json.load(f)
    assert len(content['images']) == 2 and content['annotations']
