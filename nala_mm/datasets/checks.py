"""Clear errors for missing or malformed data, installed on the upstream dataset classes.

A wrong ``data_root`` otherwise surfaces as a bare listing error deep inside mmengine, and a
broken COCO file as a ``KeyError: 'images'``. The checks wrap ``load_data_list`` of mmseg's
``BaseSegDataset`` and mmdet's ``CocoDataset`` (so they also hold under ``mim train``), and only
add a message: valid data takes the original path unchanged.
"""
import functools
import json
import os.path as osp

ADE20K_HELP = (
    'ADE20K is expected as <data_root>/images/{training,validation}/*.jpg and '
    '<data_root>/annotations/{training,validation}/*.png (data_root defaults to '
    'data/ade/ADEChallengeData2016). Unzip ADEChallengeData2016.zip into data/ade/, point the '
    'config at your copy with --cfg-options train_dataloader.dataset.data_root=PATH '
    'val_dataloader.dataset.data_root=PATH, or run `make demo` for the embedded synthetic data.')
COCO_HELP = (
    'COCO is expected as <data_root>/annotations/instances_{train,val}2017.json with images in '
    '<data_root>/{train,val}2017/ (data_root defaults to data/coco/). Unzip the COCO 2017 '
    'archives there, point the config at your copy with --cfg-options '
    'train_dataloader.dataset.data_root=PATH, or run `make demo-det` for synthetic data.')
COCO_REQUIRED_KEYS = ('images', 'annotations', 'categories')


def _check_seg_folders(dataset) -> None:
    if dataset.ann_file:  # an index file lists the images; its own loader reports problems
        return
    for what, key in (('image', 'img_path'), ('annotation', 'seg_map_path')):
        folder = dataset.data_prefix.get(key)
        if folder and not osp.isdir(folder):
            raise FileNotFoundError(
                f'{type(dataset).__name__}: {what} folder {folder} does not exist '
                f'(data_root={dataset.data_root!r}). {ADE20K_HELP}')


def _check_coco_file(dataset) -> None:
    path = dataset.ann_file
    if not osp.isfile(path):
        raise FileNotFoundError(f'{type(dataset).__name__}: annotation file {path} does not exist '
                                f'(data_root={dataset.data_root!r}). {COCO_HELP}')
    try:
        with open(path, encoding='utf-8') as f:
            content = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f'annotation file {path} is not valid JSON: {err}') from err
    if not isinstance(content, dict):
        raise ValueError(f'annotation file {path} must hold a COCO dict, found a '
                         f'{type(content).__name__}')
    missing = [key for key in COCO_REQUIRED_KEYS if key not in content]
    if missing:
        raise ValueError(f'annotation file {path} is not COCO instances format: missing '
                         f'{missing} (has {sorted(content)[:8]})')
    for ann in content['annotations']:
        if 'bbox' not in ann or len(ann['bbox']) != 4 or 'image_id' not in ann:
            raise ValueError(f'annotation file {path}: annotation id={ann.get("id")} needs '
                             f"'image_id' and a 4-number 'bbox' [x, y, w, h], got {ann}")


def _wrap(cls, check) -> None:
    original = cls.load_data_list
    if getattr(original, '_nala_checked', False):
        return

    @functools.wraps(original)
    def load_data_list(self):
        check(self)
        return original(self)

    load_data_list._nala_checked = True
    cls.load_data_list = load_data_list


def install_dataset_checks() -> None:
    """Idempotent; runs on ``import nala_mm`` for whichever of mmseg/mmdet is installed."""
    try:
        from mmseg.datasets import BaseSegDataset
        _wrap(BaseSegDataset, _check_seg_folders)
    except ImportError:
        pass
    try:
        from mmdet.datasets import CocoDataset
        _wrap(CocoDataset, _check_coco_file)
    except ImportError:
        pass
